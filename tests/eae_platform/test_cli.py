"""The `eae` console script, run as a user runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

EAE = Path(sys.executable).parent / "eae"
# What a command prints once it has connected to Ray (ray_session.connect): its absence shows a
# check ran before Ray started (Ray's own "Started a local Ray instance" is an INFO line, below
# the level the commands log at)
RAY_CONNECTED = "Ray's own output"


def run(*args):
    return subprocess.run([str(EAE), *args], capture_output=True, text=True, timeout=120)


def test_model_summary_json_for_every_paper_model():
    result = run("model", "summary", "--preset", "paper", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["preset"] == "paper" and data["config"]["num_entities"] == 1_000_000
    assert abs(data["parameters"]["total"] - 367e6) < 1e6


def test_model_summary_table_with_yaml_and_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\nentity_dim: 16\n")
    result = run("model", "summary", "--config", str(path), "--set", "num_entities=1000")
    assert result.returncode == 0, result.stderr
    assert "preset 'tiny'" in result.stdout and "1,000 x 16" in result.stdout
    assert "entity_table" in result.stdout and "16,000" in result.stdout


def test_model_summary_help_names_every_preset():
    """The --preset help lists the presets `eae model summary` accepts (it had left out minilm)."""
    from eae_model.config import PRESETS

    result = run("model", "summary", "--help")
    assert result.returncode == 0, result.stderr
    words = set(result.stdout.replace(",", " ").split())
    assert set(PRESETS) <= words, sorted(set(PRESETS) - words)


def test_bad_input_is_a_clear_error_not_a_traceback():
    result = run("model", "summary", "--preset", "huge")
    assert result.returncode == 2
    assert "unknown preset 'huge'" in result.stderr and "Traceback" not in result.stderr
    result = run("model", "summary", "--set", "k_train=-3")
    assert result.returncode == 2 and "k_train must be positive" in result.stderr


def test_yaml_that_does_not_parse_is_bad_input_not_a_failure(tmp_path):
    """A config file or a --set value YAML cannot read is the user's input: one `eae: error:`
    line with where it broke, exit 2 (it was reported as a failure, its traceback in a file)."""
    path = tmp_path / "c.yaml"
    path.write_text("model: [1\n")
    for args in (["pretrain", "--config", str(path)], ["model", "summary", "--set", "num_entities=[1"]):
        result = run(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("eae: error: not valid YAML: while parsing a flow sequence"), result.stderr
        assert "full traceback" not in result.stderr


def test_pretrain_checks_its_data_before_starting_ray(tmp_path):
    """Bad data is found on the driver in a second, not as a worker's traceback: no data
    directory, no training shards, contexts longer than the model's positions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    result = run("pretrain", "--preset", "tiny", "--data", str(tmp_path / "missing"))
    assert result.returncode == 2 and "no manifest.json" in result.stderr and "Traceback" not in result.stderr
    # a synthetic world (`eae data synth`) is a dump, not shards: the line says how to build them
    (tmp_path / "world").mkdir()
    (tmp_path / "world" / "world.xml").write_text("<mediawiki/>")
    result = run("pretrain", "--preset", "tiny", "--data", str(tmp_path / "world"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"it holds a dump (world.xml), not shards: build them with `eae data build --dump {tmp_path / 'world' / 'world.xml'}"
            " --out DIR`, then give --data DIR") in result.stderr, result.stderr
    data = tmp_path / "data"
    (data / "shards" / "train").mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"settings": {"max_length": 128}, "counts": {"entities": 10}}))
    result = run("pretrain", "--preset", "tiny", "--data", str(data))
    assert result.returncode == 2 and "no training shards" in result.stderr, result.stderr
    pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}),
                   data / "shards" / "train" / "part-00000-0000.parquet")
    result = run("pretrain", "--preset", "tiny", "--data", str(data), "--set", "model.max_length=64")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "contexts of up to 128 wordpieces" in result.stderr and "model.max_length=64" in result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout

    # Unset, the model's sizes come from the data (tiny's own max_length is 64), and the
    # preset's batch (32) is checked against the contexts each worker is dealt: one line, no Ray.
    result = run("pretrain", "--preset", "tiny", "--data", str(data))
    assert "manifest.json: model.max_length=128, model.num_entities=10" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("batch_size 32 over 1 worker(s) needs 32 training contexts per worker" in result.stderr
            and "use --batch-size 1" in result.stderr), result.stderr
    result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "4", "--num-workers", "2")
    assert result.returncode == 2
    assert "batch_size 4 over 2 worker(s)" in result.stderr and "as 0, 1: use a smaller --batch-size or fewer workers" \
        in result.stderr and "smaller --shard-rows" in result.stderr, result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout
    # --resume of a run with no checkpoint: refused on the driver too
    result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1", "--resume", "nope",
                 "--set", f"train.storage_path={tmp_path / 'ray'}")
    assert result.returncode == 2 and f"run 'nope' has no checkpoint under {tmp_path / 'ray' / 'nope'}" in result.stderr, \
        result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout


def test_pretrain_resume_compares_relative_paths_as_the_checkpoint_holds_them(tmp_path):
    """A checkpoint keeps train.data and train.storage_path absolute; `--resume NAME` given the
    same relative paths as the run that made it was refused as a change of both. Here the only
    change is model.k_train, so the check runs (on the driver, before Ray) and names that alone."""
    from eae_platform.pretrain.config import load_pretrain_config

    data = tiny_data(tmp_path)
    saved = load_pretrain_config(None, [f"train.data={data}", f"train.storage_path={tmp_path / 'ray'}", "train.name=r1",
                                        "train.batch_size=1", "model.max_length=64", "model.num_entities=10"], preset="tiny")
    checkpoint = tmp_path / "ray" / "r1" / "checkpoint_2026-01-01_00-00-00.000000"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"step": 8, "config": saved.to_dict()}))
    registered = {"checkpoint_dir_name": checkpoint.name, "metrics": {"step": 8}}
    (checkpoint.parent / "checkpoint_manager_snapshot.json").write_text(json.dumps(
        {"checkpoint_results": [registered], "latest_checkpoint_result": registered}))
    result = subprocess.run([str(EAE), "pretrain", "--preset", "tiny", "--data", "data", "--batch-size", "1",
                             "--set", "train.storage_path=ray", "--set", "model.k_train=5", "--resume", "r1"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "run 'r1' has a checkpoint at step 8" in result.stderr, result.stderr
    assert "settings: model.k_train: None -> 5. Resume" in result.stderr, result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout


def test_pretrain_checks_its_out_directory_and_alias_before_starting_ray(tmp_path):
    """An --out that cannot be a directory (here, a file's path) and an alias MLflow refuses are
    refused on the driver: the model is written and registered after the last step, and the run
    failed there."""
    data = tiny_data(tmp_path)
    out = data / "manifest.json"
    result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--out (train.out) {out}: the final model cannot be written there (File exists" in result.stderr, result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout
    # an alias MLflow reserves: refused before the run, not when its trained model is registered
    result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1", "--out", str(tmp_path / "model"),
                 "--register-as", "m", "--set", "train.alias=latest")
    assert result.returncode == 2 and "invalid model alias 'latest'" in result.stderr, result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout


def test_pretrain_as_a_ray_job_refuses_relative_paths(tmp_path):
    """`ray job submit --working-dir .` runs jobs/pretrain.py in a copy of the tree that Ray
    deletes with its session: relative outputs went there, printed but lost. With the variable
    Ray's job supervisor sets (a working_dir in its runtime env), relative paths are refused,
    every one named, before Ray starts; absolute ones are not."""
    env = {**os.environ, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0.zip"}})}
    env.pop("MLFLOW_TRACKING_URI", None)
    job = [sys.executable, str(Path(__file__).resolve().parents[2] / "jobs" / "pretrain.py"), "--preset", "tiny"]
    result = subprocess.run([*job, "--data", "runs/data", "--out", "runs/models/eae"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert ("a job runs in a copy of the tree without runs/ and mlflow.db, deleted with it: give train.data (--data) "
            "runs/data, train.out (--out) runs/models/eae, train.storage_path runs/ray, train.mlflow_uri (else "
            "MLFLOW_TRACKING_URI) mlflow.db as absolute paths") in result.stderr, result.stderr
    result = subprocess.run([*job, "--data", str(tmp_path / "data"), "--set", f"train.storage_path={tmp_path}",
                             "--set", f"train.mlflow_uri=sqlite:///{tmp_path}/m.db"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 2 and "no manifest.json" in result.stderr, result.stderr  # past the paths' check
    assert RAY_CONNECTED not in result.stdout, result.stdout


def test_pretrain_checks_its_init_encoder_before_starting_ray(tmp_path):
    """train.init_encoder of another shape than the model's is refused on the driver, naming
    what differs, before Ray starts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    (data / "shards" / "train").mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"settings": {"max_length": 64}, "counts": {"entities": 10}}))
    pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}), data / "shards" / "train" / "part-00000-0000.parquet")
    result = run("pretrain", "--preset", "medium", "--data", str(data), "--set", "train.init_encoder=minilm")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "the encoder minilm does not fit this model: hidden_size 384 (the model's 256)" in result.stderr, result.stderr
    assert RAY_CONNECTED not in result.stdout, result.stdout


def test_finetune_and_eval_check_a_local_model_path_before_starting_ray(tmp_path):
    """A model path holding no model is refused on the driver with the Ray task's own error
    (model_init.resolve_init), before Ray starts; an MLflow URI is left to the task."""
    (tmp_path / "empty").mkdir()
    for args in (("finetune", "qa", "--init", str(tmp_path / "missing"), "--data", "synth:x"),
                 ("eval", "masked", "--model", str(tmp_path / "empty"), "--data", str(tmp_path)),
                 ("eval", "topk", "--model", "models:/eae@pretrained", "--qa-model", str(tmp_path / "missing"),
                  "--qa-data", "synth:x", "--data", str(tmp_path))):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert "neither an MLflow model URI nor a model directory (config.json)" in result.stderr, (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)


def test_finetune_and_tune_check_the_qa_data_files_before_starting_ray(tmp_path):
    """A QA dataset whose files are missing is refused on the driver (check_dataset), before Ray
    starts: the task, or each of a sweep's trials in turn, would fail on it."""
    missing, space = tmp_path / "nowhere", Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml"
    for args in (("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{missing}"),
                 ("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
                  "--set", f"finetune.data=synth:{missing}", "--set", f"sweep.storage_path={tmp_path / 'tune'}")):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert f"{missing / 'questions.jsonl'}: not found (write a world with" in result.stderr, (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)
    assert not (tmp_path / "tune").exists()


def test_the_data_sets_the_model_sizes_a_config_or_override_leaves_unset(tmp_path):
    from eae_platform.pretrain.config import load_pretrain_config
    from eae_platform.pretrain.checks import data_fitted_overrides

    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"settings": {"max_length": 128}, "counts": {"entities": 985}}))
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"model:\n  preset: tiny\n  max_length: 96\ntrain:\n  data: {data}\n")
    config = load_pretrain_config(config_file)
    assert config.train.batch_size == 32  # the tiny preset's batch, not the paper's 4,096
    assert data_fitted_overrides(config, str(config_file), []) == ["model.num_entities=985"]
    config = load_pretrain_config(None, [f"train.data={data}", "model.num_entities=50"], preset="tiny")
    assert data_fitted_overrides(config, None, ["model.num_entities=50"]) == ["model.max_length=128"]
    assert load_pretrain_config(None, ["train.batch_size=8"], preset="tiny").train.batch_size == 8
    assert load_pretrain_config(None, [], preset="paper").train.batch_size == 4096
    assert load_pretrain_config(None, [], preset="tiny").train.register_as is None  # no alias moves unasked


def test_bench_compile_takes_an_optional_mode():
    from eae_platform.cli import build_parser

    parser = build_parser()
    for action in ("step", "scaling"):
        assert parser.parse_args(["bench", action]).compile is None  # eager
        assert parser.parse_args(["bench", action, "--compile"]).compile == "default"
        assert parser.parse_args(["bench", action, "--compile", "reduce-overhead"]).compile == "reduce-overhead"
    result = run("bench", "scaling", "--compile", "fastest")
    assert result.returncode == 2 and "invalid choice: 'fastest'" in result.stderr


def _commands(parser, path=()):
    """(argv prefix, parser) of every runnable (sub)command of the eae parser."""
    subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    if not subs:
        return [(path, parser)]
    return [c for name, sub in subs[0].choices.items() for c in _commands(sub, (*path, name))]


# The commands that run on Ray, each with the arguments it requires.
RAY_COMMANDS = {("data", "build"): ["--out", "d"], ("pretrain",): [], ("finetune", "qa"): [],
                ("tune",): ["--space", "s"], ("eval",): ["masked"], ("serve",): []}


def test_every_command_on_ray_takes_the_shared_ray_options():
    """--address and --verbose on exactly the commands that run on Ray, each the same option;
    --cpus/--gpus on the two that run one Ray task. Parser only: no Ray."""
    from eae_platform.cli import build_parser

    parser = build_parser()
    options = {path: {s: a for a in p._actions for s in a.option_strings} for path, p in _commands(parser)}
    assert {path for path, o in options.items() if "--address" in o} == set(RAY_COMMANDS)
    assert {path for path, o in options.items() if "--cpus" in o} == {("finetune", "qa"), ("eval",)}
    assert len({(o["--address"].help, o["--verbose"].help) for path, o in options.items() if path in RAY_COMMANDS}) == 1
    for path, required in RAY_COMMANDS.items():
        argv = [*path, *required]
        args = parser.parse_args(argv)
        assert args.address is None and args.verbose is False, path
        args = parser.parse_args([*argv, "--address", "ray://head:10001", "--verbose"])
        assert args.address == "ray://head:10001" and args.verbose is True, path
    for path in (("finetune", "qa"), ("eval", "masked")):
        assert (parser.parse_args(path).cpus, parser.parse_args(path).gpus) == (1.0, None)
        args = parser.parse_args([*path, "--cpus", "2", "--gpus", "0.5"])
        assert (args.cpus, args.gpus) == (2.0, 0.5)


def test_building_the_parser_imports_no_heavy_module():
    """Neither torch, Ray, MLflow, pyarrow nor numpy: `eae --help` stays fast, and `eae bench`
    runs where Ray and MLflow are not installed."""
    code = ("import sys; from eae_platform.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'pyarrow', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_data_build_rejects_bad_option_values_before_starting_ray(tmp_path):
    """A value that would fail inside a Ray task (a remote traceback) or build wrong data
    silently (every context in dev, no truncation) is a clear error on the driver."""
    dump = tmp_path / "d.xml"
    dump.write_text("<mediawiki></mediawiki>")
    for flag, value, message in (("--shard-rows", "0", "shard-rows must be >= 1"),
                                 ("--dev-fraction", "2", "dev-fraction must be in [0, 1)"),
                                 ("--test-fraction", "0.6", "dev-fraction + test-fraction must be < 1"),
                                 ("--max-length", "0", "max-length must be >= 3"),
                                 ("--entities", "0", "entities must be >= 1"),
                                 ("--partition-mb", "0", "partition-mb must be > 0")):
        extra = ["--dev-fraction", "0.5"] if flag == "--test-fraction" else []
        result = run("data", "build", "--dump", str(dump), "--out", str(tmp_path / "out"), flag, value, *extra)
        assert result.returncode == 2, (flag, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (flag, result.stderr)
        assert RAY_CONNECTED not in result.stderr + result.stdout, flag


def test_a_ray_tasks_value_error_is_its_cause_not_the_remote_traceback(monkeypatch, capsys):
    """Ray re-raises a task's ValueError as RayTaskError(ValueError), an instance of both, whose
    str is the whole remote traceback: it printed as `eae: error: ray::task() ... Traceback`."""
    from ray.exceptions import RayTaskError

    from eae_platform import cli

    def failing(args):
        try:
            raise ValueError("range() arg 3 must not be zero")
        except ValueError as cause:
            raise RayTaskError("contexts_partition", "Traceback (most recent call last):\n  ...", cause
                               ).as_instanceof_cause() from None

    monkeypatch.setattr(cli, "_data_build", failing)
    monkeypatch.delenv("EAE_VERBOSE", raising=False)
    assert cli.main(["data", "build", "--out", "unused"]) == 1
    err = capsys.readouterr().err
    assert "eae: error: ValueError: range() arg 3 must not be zero" in err, err
    assert "Traceback" not in err and "full traceback:" in err, err


def tiny_data(root: Path) -> Path:
    """An `eae data build`-shaped directory of one training context, enough for the driver's checks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = root / "data"
    (data / "shards" / "train").mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"settings": {"max_length": 64}, "counts": {"entities": 10}}))
    pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}), data / "shards" / "train" / "part-00000-0000.parquet")
    return data


def test_a_dead_tracking_server_is_said_before_ray_starts(tmp_path):
    """MLFLOW_TRACKING_URI naming a server that does not answer (a real port nobody listens on):
    every command that opens a new MLflow run says so in one line, exit 2, before Ray starts, as
    `eae compare` does; pretrain had printed urllib3's retry warnings and failed after Ray started."""
    from eae_data.synth import write_world
    from tests.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    write_world(tmp_path / "world", 50, 0, 1)
    data, space = tiny_data(tmp_path), Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml"
    env = {**os.environ, "MLFLOW_TRACKING_URI": dead, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}  # a user's value wins: no retries
    for args in (("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1",
                  "--set", f"train.storage_path={tmp_path / 'ray'}"),
                 ("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{tmp_path / 'world'}"),
                 ("eval", "masked", "--model", "models:/eae@pretrained", "--data", str(data)),
                 ("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
                  "--set", f"finetune.data=synth:{tmp_path / 'world'}", "--set", f"sweep.storage_path={tmp_path / 'tune'}")):
        result = subprocess.run([str(EAE), *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr.startswith(f"eae: error: cannot create an MLflow run: tracking store {dead} unreachable"), \
            (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and "Retrying" not in result.stderr, (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)


def test_a_database_tracking_store_is_asked_before_ray_starts(tmp_path):
    """A database store as the tracking URI (postgresql://, mysql+pymysql://) is asked for one
    connection before Ray is connected to, as a server is: one that does not answer, or whose
    driver is not installed, was said only after Ray had started. The password is not printed.
    (--address names a port nobody listens on: the store's line must come before Ray's.)"""
    from eae_data.synth import write_world
    from eae_platform.tracking import check_reachable
    from tests.conftest import PG, free_port

    check_reachable(f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{PG['dbname']}")  # it answers
    write_world(tmp_path / "world", 50, 0, 1)
    dead = f"postgresql+psycopg2://{PG['user']}:secret@127.0.0.1:{free_port()}/{PG['dbname']}"
    nodriver = "mysql+pymysql://eae@127.0.0.1/mlflow"  # the project installs no MySQL driver
    for uri, said in ((dead, f"{dead.replace(':secret@', ':***@')} unreachable (OperationalError: "),
                      (nodriver, f"{nodriver} needs the Python module pymysql, not installed here")):
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        result = subprocess.run([str(EAE), "finetune", "qa", "--init", "models:/eae@pretrained", "--data",
                                 f"synth:{tmp_path / 'world'}", "--address", f"127.0.0.1:{free_port()}"],
                                capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert result.returncode == 2 and "secret" not in result.stderr, (uri, result.stderr)
        assert result.stderr.startswith(f"eae: error: cannot create an MLflow run: tracking store {said}"), \
            (uri, result.stderr)
        assert len(result.stderr.splitlines()) == 1, (uri, result.stderr)


def test_a_sqlite_store_is_not_asked_before_a_run():
    """check_reachable asks only a tracking server: a SQLite store (the default) is a local file,
    and asking it would add its start-up to every command. Nothing is created where it points."""
    from eae_platform.tracking import check_reachable

    missing = Path("/nonexistent-dir-of-eae-tests/mlflow.db")
    check_reachable(f"sqlite:///{missing}")
    assert not missing.parent.exists()


def test_pretrain_checks_its_checkpoint_storage_before_starting_ray(tmp_path):
    """A train.storage_path that cannot be a directory (under /proc; under a file) is refused on
    the driver, the setting named: it was a bare `[Errno 2] ...` after Ray had started."""
    data = tiny_data(tmp_path)
    for storage, why in (("/proc/nope", "No such file or directory: /proc/nope"),
                         (str(data / "manifest.json" / "ray"), f"Not a directory: {data / 'manifest.json' / 'ray'}")):
        result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1",
                     "--set", f"train.storage_path={storage}")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr == (f"eae: error: train.storage_path {storage}: checkpoints cannot be written there "
                                 f"({why}); give a directory that can be\n"), result.stderr
        assert RAY_CONNECTED not in result.stdout, result.stdout


def test_a_pretrain_refused_after_its_storage_check_leaves_no_storage_behind(tmp_path):
    """check_storage makes train.storage_path and the named run's directory under it to write
    there; a later check's refusal (here the model name) left them behind. Whatever the check
    made is removed; what was there before stays."""
    data = tiny_data(tmp_path)
    (tmp_path / "had").mkdir()
    for storage in (tmp_path / "new" / "ray", tmp_path / "had"):
        result = run("pretrain", "--preset", "tiny", "--data", str(data), "--batch-size", "1", "--name", "r1",
                     "--out", str(tmp_path / "model"), "--register-as", "eae:1", "--set", f"train.storage_path={storage}")
        assert result.returncode == 2 and "invalid registered model name 'eae:1'" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "had"] and not any((tmp_path / "had").iterdir())


def test_finetune_and_tune_check_the_registration_before_starting_ray(tmp_path):
    """An alias MLflow reserves (`latest`, `v3`) or a model name it refuses (`a/b`) is refused on
    the driver: the fine-tuned model (a sweep's selected one) is registered after training, and
    the command failed only then, its training lost."""
    from eae_data.synth import write_world

    write_world(tmp_path / "world", 50, 0, 1)
    space = Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml"
    qa = ("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{tmp_path / 'world'}")
    tune = ("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
            "--set", f"finetune.data=synth:{tmp_path / 'world'}", "--set", f"sweep.storage_path={tmp_path / 'tune'}")
    for args, error in (((*qa, "--register-as", "m", "--set", "finetune.alias=latest"), "invalid model alias 'latest'"),
                        ((*qa, "--register-as", "a/b"), "invalid registered model name 'a/b'"),
                        ((*tune, "--register-as", "m", "--set", "finetune.alias=v3"), "invalid model alias 'v3'"),
                        (("pretrain", "--preset", "tiny", "--data", str(tiny_data(tmp_path)), "--batch-size", "1",
                          "--out", str(tmp_path / "model"), "--register-as", "eae:1"),
                         "invalid registered model name 'eae:1'")):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr.startswith(f"eae: error: {error}"), (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)
    assert not (tmp_path / "tune").exists()


def test_finetune_and_tune_check_where_they_write_before_starting_ray(tmp_path):
    """finetune's --out that cannot be a directory (it failed the run when the model was saved,
    after training), and tune's sweep.storage_path that cannot be one (a bare `[Errno 2] ...`)
    or a new sweep's directory that exists (said after Ray had started): refused on the driver."""
    from eae_data.synth import write_world

    write_world(tmp_path / "world", 50, 0, 1)
    space, afile = Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml", tmp_path / "world" / "world.xml"
    qa = ("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{tmp_path / 'world'}")
    tune = ("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
            "--set", f"finetune.data=synth:{tmp_path / 'world'}")
    (tmp_path / "tune" / "synth-grid").mkdir(parents=True)  # synth.yaml's sweep.name: a sweep that has run
    for args, error in (((*qa, "--out", str(afile / "qa")),
                         f"--out (finetune.out) {afile / 'qa'}: the fine-tuned model cannot be written there "
                         f"(Not a directory: {afile / 'qa'})"),
                        ((*tune, "--set", "sweep.storage_path=/proc/nope"),
                         "sweep.storage_path /proc/nope: the sweep's trials and state cannot be written there "
                         "(No such file or directory: /proc/nope)"),
                        ((*tune, "--set", f"sweep.storage_path={tmp_path / 'tune'}"),
                         f"{tmp_path / 'tune' / 'synth-grid'} exists: resume it with --resume")):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr.startswith(f"eae: error: {error}"), (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)


def test_a_stated_in_directory_is_read_before_starting_ray(tmp_path):
    """finetune.stated_in (eval.stated_in, a sweep's) names the pretraining data whose split says
    which facts pretraining read: fine-tuning read it after training, and a wrong path failed the
    run there with a bare `[Errno 2] ... manifest.json`. Now one line naming the setting, before Ray."""
    from eae_data.synth import write_world

    write_world(tmp_path / "world", 50, 0, 1)
    world, missing = tmp_path / "world", tmp_path / "nodata"
    space = Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml"
    for args, setting in ((("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{world}",
                            "--set", f"finetune.stated_in={missing}"), "finetune.stated_in"),
                          (("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
                            "--set", f"finetune.data=synth:{world}", "--set", f"finetune.stated_in={missing}",
                            "--set", f"sweep.storage_path={tmp_path / 'tune'}"), "finetune.stated_in"),
                          (("eval", "lama", "--model", "models:/eae@pretrained", "--data", f"synth:{world}",
                            "--set", f"eval.stated_in={missing}"), "eval.stated_in")):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr == (f"eae: error: {setting} {missing}: no manifest.json there; give the `eae data build` "
                                 "directory pretraining read\n"), (args, result.stderr)
        assert RAY_CONNECTED not in result.stdout, (args, result.stdout)


def test_a_finetune_vocab_without_entities_is_refused_before_starting_ray(tmp_path):
    """finetune.vocab (an entity vocabulary in place of the model's own) naming a directory
    without entities.parquet: the Ray task said so only after Ray had started. Now one line
    naming the setting and the path, exit 2, before Ray (a sweep's too: every trial failed on it)."""
    from eae_data.synth import write_world

    write_world(tmp_path / "world", 50, 0, 1)
    world, missing = tmp_path / "world", tmp_path / "novocab"
    space = Path(__file__).resolve().parents[2] / "tune_spaces" / "synth.yaml"
    for args in (("finetune", "qa", "--init", "models:/eae@pretrained", "--data", f"synth:{world}"),
                 ("tune", "--space", str(space), "--set", "finetune.init=models:/eae@pretrained",
                  "--set", f"finetune.data=synth:{world}", "--set", f"sweep.storage_path={tmp_path / 'tune'}")):
        result = run(*args, "--set", f"finetune.vocab={missing}")
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr.startswith(f"eae: error: finetune.vocab {missing}: no entities.parquet there"), \
            (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and RAY_CONNECTED not in result.stdout, (args, result.stdout)
    assert not (tmp_path / "tune").exists()
