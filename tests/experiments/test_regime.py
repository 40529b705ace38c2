"""The regime study's stage scripts (experiments/regime/) end to end on CPUs, on the session's
Ray cluster: a 300-entity world stating its facts twice (`300r2`: --renderings 2,
--paragraph-contexts), EaE and No-EaE for one seed; pretraining, paused by STOP_AT and
relaunched (the relaunch's exactness is tested on the job itself, test_pretrain.py), QA fine-tuning, the evaluations but
the top-K one (TOPK="", for time), the stores' archive and the tables printed from it
(experiments/results_tables.py); the tables' pairing by seed on hand-set figures."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.experiments import experiment

REPO = Path(__file__).resolve().parents[2]


def _tables(*args):
    """experiments/results_tables.py ARGS..., as a user runs it from the repository root."""
    return subprocess.run([sys.executable, str(REPO / "experiments" / "results_tables.py"), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _results_tables():
    """experiments/results_tables.py as a module, for its functions."""
    return experiment("results_tables")


def _stage(name, env, *args):
    return subprocess.run([str(REPO / "experiments" / "regime" / f"{name}.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def _side_by_side(*calls):
    """Each call (a function and its arguments: _stage or _tables) at once, their results in
    order: commands that read what others read and write nothing another reads, whose seconds
    are mostly imports and Ray's scheduling, run together as a user would run them."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(*call) for call in calls]]


@pytest.fixture(scope="module")
def world_300r2(ray_cluster, tmp_path_factory):
    """A study holding the 300r2 world data.sh built (worlds/w300r2, data/w300r2: --renderings
    2, --paragraph-contexts), once for the tests of this module that pretrain on it: each copies
    it into a study of its own (_with_world), where data.sh finds it built."""
    study = tmp_path_factory.mktemp("world300r2") / "study"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "STUDY": str(study),
           "WORLDS": "300r2", "EAE_CMD": f"{sys.executable} -m eae_platform.cli"}
    built = _stage("data", env)
    assert built.returncode == 0 and (study / "data" / "w300r2" / "manifest.json").is_file(), built.stdout + built.stderr
    return study


def _with_world(world, study):
    """STUDY, a fresh study holding the world world_300r2 built (a copy: a test's study is its own)."""
    for part in ("worlds", "data"):
        shutil.copytree(world / part, study / part)
    return study


def test_the_regime_study_runs_its_stages_and_prints_its_tables(ray_cluster, world_300r2, tmp_path, monkeypatch):
    _with_world(world_300r2, tmp_path / "study")  # data.sh's build of the world (world_300r2): this run of it skips it
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "STUDY": str(tmp_path / "study"),
           "WORLDS": "300r2", "SEEDS": "0", "STEPS": "20", "LOG_EVERY": "10", "BATCH": "16", "QA_STEPS": "10", "QA_BATCH": "16",
           "PROBES": "20", "TOPK": "", "DEVICE": "cpu", "EAE_CMD": f"{sys.executable} -m eae_platform.cli",
           "MEMORY_LR_SCALE": "2", "MEMORY_LAYER_NORM": "false", "MEMORY_EL_WEIGHT": "0.5", "MEMORY_QUERY_DETACHED": "true",
           "PAD_MULTIPLE": "16",
           "SHUFFLE_ROWS": "false"}
    data = _stage("data", env)
    assert data.returncode == 0 and "world 300r2: " in data.stdout and " exists" in data.stdout, data.stdout + data.stderr
    # a deadline already past (STOP_AT, train.deadline): every cell pauses at its first log
    # window (step 10), and the stage exits 10; run again, each continues from there
    paused = _stage("pretrain", {**env, "STOP_AT": str(int(time.time()))})
    assert paused.returncode == 10 and paused.stdout.count("paused at step 10 of 20") == 2, paused.stdout + paused.stderr
    done = _stage("pretrain", env)
    assert done.returncode == 0 and done.stdout.count("finished at step 20") == 2, done.stdout + done.stderr
    logs = [(tmp_path / "study" / "logs" / f"pretrain-{c}.log").read_text() for c in ("w300r2-small-eae-s0", "w300r2-small-no_eae-s0")]
    assert all("from its checkpoint at step 10" in log for log in logs), logs
    built = json.loads((tmp_path / "study" / "data" / "w300r2" / "manifest.json").read_text())["settings"]
    assert built["paragraph_contexts"] and built["dev_fraction"] == 0.05
    assert "== Overview ==" in (tmp_path / "study" / "worlds" / "w300r2" / "world.xml").read_text()
    for cell in ("w300r2-small-eae-s0", "w300r2-small-no_eae-s0"):
        assert (tmp_path / "study" / "models" / cell / "config.json").is_file()
    qa = _stage("finetune", env)
    assert qa.returncode == 0 and qa.stdout.count("test: EM") == 2, qa.stdout + qa.stderr
    # another QA recipe for No-EaE's model, a study of its own reading this one's world, data and
    # model (FROM_STUDY): its store holds the QA run only, tuned from this study's model
    # (side by side with this study's evaluations, checked below: both only read its models)
    again = {**env, "STUDY": str(tmp_path / "qa3e-4"), "FROM_STUDY": str(tmp_path / "study"), "VARIANTS": "no_eae", "QA_LR": "3e-4"}
    qa, evaluated = _side_by_side((_stage, "finetune", again), (_stage, "eval", env))
    assert qa.returncode == 0 and qa.stdout.count("test: EM") == 1, qa.stdout + qa.stderr
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the study's cell stores are file stores
    store = MlflowClient(f"file://{tmp_path / 'qa3e-4' / 'mlruns' / 'w300r2-small-no_eae-s0'}")
    runs = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert [r.info.run_name for r in runs] == ["qa-w300r2-small-no_eae-s0"], runs
    assert runs[0].data.params["finetune.init"] == str(tmp_path / "study" / "models" / "w300r2-small-no_eae-s0")
    assert float(runs[0].data.params["finetune.lr"]) == 3e-4 and not (tmp_path / "qa3e-4" / "models").exists()
    # MEMORY_LR_SCALE, MEMORY_LAYER_NORM, MEMORY_EL_WEIGHT, MEMORY_QUERY_DETACHED, SHUFFLE_ROWS and PAD_MULTIPLE reach every cell's
    # pretraining (and its model)
    store = MlflowClient(f"file://{tmp_path / 'study' / 'mlruns' / 'w300r2-small-eae-s0'}")
    pre = store.search_runs([e.experiment_id for e in store.search_experiments()], "attributes.run_name = 'w300r2-small-eae-s0'")
    assert [float(r.data.params["train.memory_lr_scale"]) for r in pre] == [2.0], pre
    assert [r.data.params["train.shuffle_rows"].lower() for r in pre] == ["false"], pre  # rounds 1-8's file order
    assert [r.data.params["train.pad_multiple"] for r in pre] == ["16"], pre
    model = json.loads((tmp_path / "study" / "models" / "w300r2-small-eae-s0" / "config.json").read_text())
    assert model["memory_layer_norm"] is False and model["weight_memory_el"] == 0.5 and model["memory_query_detached"] is True, model
    assert evaluated.returncode == 0 and evaluated.stdout.count("lama/synth/stated/entity_accuracy") == 2, evaluated.stdout
    # EaE's probes with its memory's output zeroed come from its lama process (eval.memory_off_run)
    eae_lama = (tmp_path / "study" / "logs" / "lama-w300r2-small-eae-s0.log").read_text()
    assert "memory off: lama/synth/stated/entity_accuracy" in eae_lama and "(memory off, lama-off-w300r2-small-eae-s0)" in eae_lama
    assert not list((tmp_path / "study" / "logs").glob("lama-off-*")), eae_lama
    archive = tmp_path / "stores.tar.xz"
    assert _stage("collect", env, str(archive)).returncode == 0
    tables, missing = _side_by_side((_tables, archive, "--figure", tmp_path / "regime.svg", "--versus", archive),
                                    (_tables, archive, "--versus", tmp_path / "no.tar.xz"))
    assert tables.returncode == 0, tables.stderr
    out = tables.stdout
    # settings from the runs: 300 entities, the small transformer's 396,544 layer parameters
    assert "| 300, facts stated 2x | small |" in out and "396,544" in out and "20 x 16" in out
    rows = [line for line in out.split("### The same model and seed")[0].splitlines()
            if line.startswith("| 300, facts stated 2x | small | ")]
    # settings, one row per model, the gap, EaE with its memory output zeroed against No-EaE and
    # against itself (no K: TOPK=""); then --versus's table
    assert len(rows) == 6, out
    head = next(line for line in out.splitlines() if line.startswith("| world | transformer | model |"))
    columns = head.strip(" |").split(" | ")
    eae = dict(zip(columns, next(r for r in rows if "| eae |" in r).strip(" |").split(" | ")))
    no_eae = dict(zip(columns, next(r for r in rows if "| no_eae |" in r).strip(" |").split(" | ")))
    eae_only = ["EaE memory reads the subject", "EaE memory reads the answer", "EaE fact recall, memory output zeroed",
                "EaE QA test EM, memory output zeroed"]
    assert all(float(eae[c]) >= 0 for c in eae_only), eae  # one seed: a bare figure
    assert all(no_eae[c] == "–" for c in eae_only), no_eae
    # TOPK="": no `eae eval topk` (its CLI: test_evaluate.py; its table: the test below)
    assert eae["EaE masked entity acc, K=1"] == "–" and "### EaE, K at inference" not in out
    assert "### EaE, memory output zeroed at evaluation" in out
    with tarfile.open(archive) as tar:  # the QA runs' predictions travel for accuracy by answer frequency
        kept = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if "/artifacts/" in m.name and m.isfile()}
    assert kept and all(n.endswith("/artifacts/predictions/test.jsonl") for n in kept), kept
    assert len(kept) == 2
    # slimmed to what the tables read (slim_predictions.py), a line per question as the study's own
    # store, which keeps every field
    for name, text in kept.items():
        whole = (tmp_path / "study" / name).read_text().splitlines()
        slim = [json.loads(line) for line in text.splitlines()]
        assert len(slim) == len(whole) > 0 and {"question", "top_k"} <= json.loads(whole[0]).keys()
        assert [tuple(r) for r in slim] == [("id", "answer_id", "prediction_id", "correct")] * len(slim), slim[:2]
        assert [r["correct"] for r in slim] == [json.loads(line)["correct"] for line in whole]
    gap = out.split("### EaE − No-EaE")[1]
    assert "| 300, facts stated 2x | small |" in gap and "(n=1)" in gap  # one seed: a gap without an interval
    assert (tmp_path / "regime.svg").stat().st_size > 1000
    assert missing.returncode == 2 and "no such store: " in missing.stderr and "Traceback" not in missing.stderr, missing.stderr
    # --versus: each model against itself in the other stores (here the same archive: gaps of 0)
    versus = out.split("### The same model and seed, these stores − stores.tar.xz")[1].split("###")[0]
    row = next(r for r in versus.splitlines() if r.startswith("| 300, facts stated 2x | small | eae |")).strip(" |").split(" | ")
    assert row[3] == "+0.0 (n=1)", row


def test_the_laptop_study_runs_a_seeds_cells_at_a_time_on_one_ray_head_it_stops(ray_cluster, world_300r2, tmp_path, monkeypatch):
    """cpu.sh: every stage for two seeds, one seed's EaE and No-EaE at a time, each `eae` command
    on the one Ray head the script starts (no RAY_ADDRESS given) and stops, then one store and
    its tables: a gap over both seeds."""
    study = _with_world(world_300r2, tmp_path / "study")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(STUDY=str(study), WORLDS="300r2", SEEDS="0 1", STEPS="10", LOG_EVERY="10", BATCH="16", QA_STEPS="10",
               QA_BATCH="16", PROBES="10", EAE_CMD=f"{sys.executable} -m eae_platform.cli", PYTHON=sys.executable)
    done = _stage("cpu", env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    gap = done.stdout.split("### EaE − No-EaE")[1].split("###")[0]
    assert "| 300, facts stated 2x | tiny |" in gap and "(seeds=2)" in gap, done.stdout
    assert "10 x 16" in done.stdout, done.stdout  # the steps and batch it was given, not cpu.sh's defaults
    # every command's Ray output names one session: the head cpu.sh started, not one per command
    logs = sorted((study / "logs").glob("*-w300r2-tiny-*.log"))
    sessions = {line.split("/logs")[0] for log in logs for line in log.read_text().splitlines()
                if line.startswith("Ray's own output")}
    assert len(logs) >= 8 and len(sessions) == 1, (len(logs), sessions)
    head = (study / "logs" / "ray-head.log").read_text()
    host, port = re.search(r"ray start --address='([^':]+):(\d+)'", head).groups()
    with socket.socket() as probe:  # stopped on exit: nothing listens on its GCS port
        assert probe.connect_ex((host, int(port))) != 0, head
    # a seed's cells at a time: seed 1's pretraining starts after seed 0's two end
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    times = {}
    for cell in ("eae-s0", "no_eae-s0", "eae-s1", "no_eae-s1"):
        store = MlflowClient(f"file://{study / 'mlruns' / f'w300r2-tiny-{cell}'}")
        [run] = store.search_runs([e.experiment_id for e in store.search_experiments()],
                                  f"attributes.run_name = 'w300r2-tiny-{cell}'")
        times[cell] = (run.info.start_time, run.info.end_time)
    assert min(times["eae-s1"][0], times["no_eae-s1"][0]) > max(times["eae-s0"][1], times["no_eae-s0"][1]), times
    # another QA recipe for those models (FROM_STUDY): QA runs only, then each model at its pick on dev
    qa = {**env, "FROM_STUDY": str(study), "STUDY": str(tmp_path / "qa"), "QA_LR": "1e-3"}
    again = _stage("cpu", qa)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("**(picked)**") == 2 and "QA 10 at 1e-3" in again.stdout, again.stdout
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "qa" / "logs").glob("*-w300r2-*")) == ["qa"] * 4
    # a FROM_STUDY with no store yet: refused in a line, before any Ray head starts
    missing = _stage("cpu", {**qa, "FROM_STUDY": str(tmp_path / "none")})
    assert missing.returncode == 2 and f"no store {tmp_path / 'none'}.mlruns.tar.xz" in missing.stderr, missing.stderr


def test_a_real_text_world_named_vital_n_keeps_its_n_most_frequent_entities(ray_cluster, tmp_path):
    """data.sh for WORLDS=vital50: the real text that ships offline, built with the 50 most
    frequent link targets as its entity vocabulary (the count pretrain.sh reads), every other
    link counted as out of vocabulary, not dropped silently."""
    import pyarrow.parquet as pq

    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "STUDY": str(tmp_path / "study"),
           "WORLDS": "vital50", "EAE_CMD": f"{sys.executable} -m eae_platform.cli", "PYTHON": sys.executable}
    built = _stage("data", env)
    assert built.returncode == 0, built.stdout + built.stderr
    data = tmp_path / "study" / "data" / "wvital50"
    manifest = json.loads((data / "manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["settings"]["entities"] == 50 and counts["entities"] == 50, manifest
    assert counts["link_mentions_out_of_vocab"] > counts["link_mentions_linked"] > 0, counts
    linked = pq.read_table(data / "entities.parquet").column("count").to_pylist()
    assert len(linked) == 50 and linked == sorted(linked, reverse=True) and min(linked) > 10, linked


def test_versus_pairs_each_model_with_itself_at_another_recipe_by_seed(capsys):
    """print_versus on hand-set per-seed figures: No-EaE's QA EM at one recipe − the same seeds
    at another (seed 3 only in the first: left out), and no row for a model the other lacks. By
    hand: gaps 3, 1, 2 points: mean 2, sd 1, half-width 4.303 x 1 / sqrt 3 = 2.5."""
    tables = _results_tables()
    world = (5000, 4)

    def group(seeds, qa_em):
        return {**{k: [None] * len(seeds) for k in tables.METRICS}, "seeds": seeds, "qa_em": qa_em}

    gentle = {(world, "medium", "no_eae"): group([5, 6, 7, 3], [0.17, 0.16, 0.18, 0.90]),
              (world, "medium", "mm"): group([5, 6, 7], [0.1, 0.1, 0.1])}
    steep = {(world, "medium", "no_eae"): group([5, 6, 7], [0.14, 0.15, 0.16])}
    tables.print_versus(gentle, steep, "steep.tar.xz")
    out = capsys.readouterr().out
    assert "### The same model and seed, these stores − steep.tar.xz" in out
    rows = [r.strip(" |").split(" | ") for r in out.splitlines() if r.startswith("| 5,000, facts stated 4x |")]
    assert [r[2] for r in rows] == ["no_eae"], rows
    column = 3 + [tables.METRICS[k][2] for k in tables.PAIRED].index("QA test EM")
    assert rows[0][column] == "+2.0 [-0.5, +4.5] ~ (seeds=3)", rows[0]


def test_an_archive_is_read_inside_the_tar_as_mlflow_reads_the_store_unpacked(tmp_path, monkeypatch):
    """read_archive (the tar's members, never unpacked) against read_cells through MlflowClient on
    the same stores unpacked, on what MLflow 3 writes: a metric's latest value by step then time,
    names with "/", a rerun under one name (the later start wins), a deleted run and a deleted
    experiment (both left out), a QA run's predictions, a cell with no runs, a folder that is no cell."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tables = _results_tables()
    cell = "w300r2-small-eae-s0"
    client = MlflowClient(f"file://{tmp_path / 'mlruns' / cell}")
    experiment = client.create_experiment("regime-pretrain")
    pre = client.create_run(experiment, run_name=cell, start_time=1000).info.run_id
    client.log_metric(pre, "dev/em", 0.5, step=5, timestamp=10)
    client.log_metric(pre, "dev/em", 0.9, step=3, timestamp=20)  # later, but an earlier step
    client.log_metric(pre, "loss", 2.0, step=7, timestamp=30)
    client.log_metric(pre, "loss", 1.5, step=7, timestamp=40)
    client.log_param(pre, "train/lr", "0.001")
    client.set_terminated(pre, "FINISHED")
    for start, status, em in ((2000, "FAILED", 0.1), (3000, "FINISHED", 0.3)):  # QA run twice: the rerun wins
        qa = client.create_run(experiment, run_name="qa-" + cell, start_time=start).info.run_id
        client.log_metric(qa, "test/em", em)
        client.set_terminated(qa, status)
    (tmp_path / "test.jsonl").write_text('{"id": "q1", "correct": true}\n')
    client.log_artifact(qa, str(tmp_path / "test.jsonl"), "predictions")
    gone = client.create_run(experiment, run_name="lama-" + cell, start_time=4000).info.run_id
    client.delete_run(gone)
    trashed = client.create_experiment("trashed")
    client.create_run(trashed, run_name="masked-" + cell, start_time=5000)
    client.delete_experiment(trashed)
    MlflowClient(f"file://{tmp_path / 'mlruns' / 'w300r2-small-no_eae-s0'}").search_experiments()  # no runs
    MlflowClient(f"file://{tmp_path / 'mlruns' / 'scratch'}").create_experiment("not a cell")
    archive = tmp_path / "stores.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(tmp_path / "mlruns", "mlruns")

    read = tables.read_archive(archive)
    assert read == tables.read_cells(tmp_path / "mlruns")
    assert sorted(read) == [cell, "w300r2-small-no_eae-s0"] and read["w300r2-small-no_eae-s0"] == {}
    runs = read[cell]
    assert sorted(runs) == ["qa-" + cell, cell], runs
    assert runs[cell]["metrics"] == {"dev/em": 0.5, "loss": 1.5} and runs[cell]["params"] == {"train/lr": "0.001"}
    assert runs[cell]["dev"] == {"dev/em": {3: 0.9, 5: 0.5}} and runs[cell]["last_step"] == 7  # --dev-curve's
    assert runs["qa-" + cell]["status"] == "FINISHED" and runs["qa-" + cell]["metrics"] == {"test/em": 0.3}
    assert runs["qa-" + cell]["predictions"] == [{"id": "q1", "correct": True}]


def test_a_file_that_is_no_archive_is_refused_in_a_line(tmp_path):
    (tmp_path / "stores.tar.xz").write_text("not a tar\n")
    refused = _tables(tmp_path / "stores.tar.xz")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"not an archive of cell stores (experiments/regime/collect.sh writes one): {tmp_path / 'stores.tar.xz'}" in refused.stderr


def test_tables_piped_to_head_end_without_a_traceback():
    """`results_tables.py STORE | head -1`, as a reader looks at a committed store: the first
    line, and nothing on stderr once head has closed the pipe (`head -c 0` closes it before the
    tables print, so that a BrokenPipeError traceback shows every time, not only when head wins
    the race to close it after the first line)."""
    store = REPO / "docs" / "results" / "real-text-vital2000-minilm-gpu-7200-memlr10-seeds10-14-2026-12-05.mlruns.tar.xz"
    for head, first in (("head -1", "## Real text"), ("head -c 0", "")):
        piped = subprocess.run(["bash", "-c", f"'{sys.executable}' experiments/results_tables.py '{store}' | {head}"], cwd=REPO,
                               capture_output=True, text=True, timeout=300)
        assert piped.stdout.startswith(first) and piped.stderr == "", (head, piped.stderr)


def test_real_text_tables_read_the_vital_cells_and_pair_them_by_seed(tmp_path, monkeypatch):
    """print_real_text on real MLflow stores of the real-text worlds' cells (`wvital-...`, and
    `wvital50-...` for its 50 most frequent entities, as the stage scripts name them), with set
    metrics: the means, the priors and the paired gaps come from the runs, each world's cells
    apart, and the synthetic tables ignore these cells."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")

    def stores(directory, em, steps, qa_lr="0.0001", qa_only=False, pretrain=(), world="vital"):
        for (variant, seed), qa_em in em.items():
            cell = f"w{world}-medium-{variant}-s{seed}"
            qa = {"finetune.lr": qa_lr, "finetune.max_steps": "200", "finetune.batch_size": "32",
                  "finetune.init": f"/study/{steps}/models/{cell}"}
            runs = {cell: ({"train.max_steps": steps, "train.batch_size": "512", **dict(pretrain)}, {}),
                    f"qa-{cell}": (qa, {"test/em": qa_em, "test/prior_em": 0.04, "data/test_questions": 100, "test/oracle": 0.17}),
                    f"masked-{cell}": ({}, {"test/entity_accuracy": 0.5, "test/perplexity": 20.0 + seed}),
                    f"lama-{cell}": ({}, {"lama/geonames/entity_accuracy": qa_em / 2, "lama/geonames/prior_entity_accuracy": 0.2,
                                           **({"lama/geonames/memory_subject_accuracy": 0.6 + seed / 10} if variant == "eae" else {})})}
            if variant in ("eae", "eae_unsup"):  # its masked hyperlinks again with the memory's output zeroed
                runs[f"masked-off-{cell}"] = ({}, {"test/entity_accuracy": 0.5 - qa_em / 10})
            if qa_only:  # finetune.sh with FROM_STUDY: another QA recipe for those models, a store of QA runs only
                runs = {f"qa-{cell}": runs[f"qa-{cell}"]}
            _log_cell(directory, cell, runs)

    stores(tmp_path / "mlruns", {("eae", 0): 0.30, ("eae", 1): 0.20, ("no_eae", 0): 0.10, ("no_eae", 1): 0.15,
                                 ("eae_unsup", 0): 0.14, ("eae_unsup", 1): 0.13}, "2000")
    # the same text cut to its 50 most frequent entities (WORLDS=vital50), in the same directory
    stores(tmp_path / "mlruns", {("eae", 0): 0.90, ("no_eae", 0): 0.80}, "2000", world="vital50")
    # the same cells trained longer (another recipe, the memory at 10 x the lr and without its
    # LayerNorm, named in the steps' column), for --versus; No-EaE's seed 1 missing there
    stores(tmp_path / "longer", {("eae", 0): 0.34, ("eae", 1): 0.22, ("no_eae", 0): 0.10}, "4000",
           pretrain={"train.memory_lr_scale": "10.0", "model.memory_layer_norm": "false", "model.weight_memory_el": "0.1",
                     "model.memory_query_detached": "True"})
    tables = _tables(tmp_path / "mlruns", "--versus", tmp_path / "longer")
    assert tables.returncode == 0, tables.stderr
    out = tables.stdout.split("## Real text")[1]
    head = next(line for line in out.splitlines() if line.startswith("| world | transformer | model |")).strip(" |").split(" | ")
    eae = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital | medium | eae |")).strip(" |").split(" | ")))
    assert eae["seeds"] == "2" and eae["steps x batch"] == "2,000 x 512" and eae["QA steps x batch at lr"] == "200 x 32 at 1e-4"
    assert eae["fanoutqa single-hop test EM"].startswith("25.0 ± 7.1 [") and "prior 4.0; n=100" in eae["fanoutqa single-hop test EM"]
    assert eae["geonames probes, entity acc"].startswith("12.5 ") and "prior 20.0" in eae["geonames probes, entity acc"]
    # what EaE's memory read at the probes' subjects: 60% and 70% of them, "–" for No-EaE
    assert eae["EaE memory reads the subject, geonames probes"].startswith("65.0 ± 7.1 [")
    no_eae = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital | medium | no_eae |")).strip(" |").split(" | ")))
    assert no_eae["EaE memory reads the subject, geonames probes"] == "–", no_eae
    gaps = out.split("### Paired by seed")[1]
    pair = next(r for r in gaps.splitlines() if r.startswith("| vital | medium | EaE − No-EaE |")).strip(" |").split(" | ")
    columns = next(r for r in gaps.splitlines() if r.startswith("| world | transformer | pair |")).strip(" |").split(" | ")
    pair = dict(zip(columns, pair))
    # gaps 20 and 5 points: mean 12.5, t-interval 12.706 x 7.5 = 95.3 wide each side
    assert pair["fanoutqa single-hop test EM"] == "+12.5 [-82.8, +107.8] ~ (seeds=2)", pair
    assert pair["masked PPL"].startswith("+0.0 ")
    # EaE − itself with the memory output zeroed, masked entity acc: 3 and 2 points, mean 2.5,
    # half-width 12.706 x 0.707 / sqrt 2 = 6.4
    off = dict(zip(columns, next(r for r in gaps.splitlines() if r.startswith("| vital | medium | EaE − EaE with its memory output zeroed |")).strip(" |").split(" | ")))
    assert off["masked entity acc (test articles)"] == "+2.5 [-3.9, +8.9] ~ (seeds=2)", off
    # EaE-unsup against No-EaE (4 and −2 points: mean 1, sd 4.243, half-width 12.706 x 3 = 38.1)
    # and EaE against it (16 and 7: mean 11.5, half-width 12.706 x 4.5 = 57.2); each memory model
    # without its memory's output, against itself and against No-EaE (EaE: 47 − 50 and 48 − 50)
    def row(pair):
        return dict(zip(columns, next(r for r in gaps.splitlines() if r.startswith(f"| vital | medium | {pair} |")).strip(" |").split(" | ")))

    assert row("EaE-unsup − No-EaE")["fanoutqa single-hop test EM"] == "+1.0 [-37.1, +39.1] ~ (seeds=2)"
    assert row("EaE − EaE-unsup")["fanoutqa single-hop test EM"] == "+11.5 [-45.7, +68.7] ~ (seeds=2)"
    assert row("EaE-unsup − EaE-unsup with its memory output zeroed")["masked entity acc (test articles)"].startswith("+1.4 [")
    assert row("EaE with its memory output zeroed − No-EaE")["masked entity acc (test articles)"] == "-2.5 [-8.9, +3.9] ~ (seeds=2)"
    # the 50-entity world's cells are rows of their own: one seed, a gap of 10 points
    cut = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital50 | medium | eae |")).strip(" |").split(" | ")))
    assert cut["seeds"] == "1" and cut["fanoutqa single-hop test EM"].startswith("90.0 "), cut
    cut = dict(zip(columns, next(r for r in gaps.splitlines() if r.startswith("| vital50 | medium | EaE − No-EaE |")).strip(" |").split(" | ")))
    assert cut["fanoutqa single-hop test EM"] == "+10.0 (n=1)", cut
    assert tables.stdout.startswith("## Real text"), tables.stdout[:300]  # no synthetic table, not even an empty one
    # --versus: each model − itself in the other stores, paired by seed (2,000 − 4,000 steps):
    # EaE's gaps −4 and −2 points: mean −3, sd 1.414, half-width 12.706 x 1.414 / sqrt 2 = 12.7;
    # No-EaE on its one common seed (0), a gap of 0
    versus = out.split("### The same model and seed on real text, these stores − longer")[1]
    columns = next(r for r in versus.splitlines() if r.startswith("| world | transformer | model |")).strip(" |").split(" | ")
    rows = {r.split(" | ")[2]: dict(zip(columns, r.strip(" |").split(" | "))) for r in versus.splitlines() if r.startswith("| vital | medium |")}
    assert rows["eae"]["steps x batch"] == "2,000 x 512 − 4,000 x 512, memory lr x10, X3 = X2 + X1, memory EL weight 0.1, memory query detached"
    assert rows["eae"]["fanoutqa single-hop test EM"] == "-3.0 [-15.7, +9.7] ~ (seeds=2)", rows["eae"]
    assert rows["eae"]["geonames probes, entity acc"] == "-1.5 [-7.9, +4.9] ~ (seeds=2)", rows["eae"]
    assert rows["no_eae"]["fanoutqa single-hop test EM"] == "+0.0 (n=1)", rows["no_eae"]
    # another QA recipe (lr 3e-4) for the 2,000-step models, in stores of QA runs only: the
    # models' QA figures, "–" for what the stores lack, and the pairs with the 1e-4 runs
    # (EaE: 32 − 30 and 25 − 20 points: mean 3.5, sd 2.121, half-width 12.706 x 1.5 = 19.1)
    stores(tmp_path / "qa3e-4", {("eae", 0): 0.32, ("eae", 1): 0.25, ("no_eae", 0): 0.10}, "2000", "0.0003", qa_only=True)
    tables = _tables(tmp_path / "qa3e-4", "--versus", tmp_path / "mlruns")
    assert tables.returncode == 0, tables.stderr
    out = tables.stdout.split("## Real text")[1]
    eae = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital | medium | eae |")).strip(" |").split(" | ")))
    assert eae["steps x batch"] == "–" and eae["QA steps x batch at lr"] == "200 x 32 at 3e-4", eae
    assert eae["fanoutqa single-hop test EM"].startswith("28.5 ± 4.9 [") and eae["masked PPL"] == "–", eae
    versus = out.split("### The same model and seed on real text, these stores − mlruns")[1]
    rows = {r.split(" | ")[2]: dict(zip(columns, r.strip(" |").split(" | "))) for r in versus.splitlines() if r.startswith("| vital | medium |")}
    assert rows["eae"]["steps x batch"] == "the same models (2,000 x 512)", rows["eae"]
    assert rows["eae"]["QA steps x batch at lr"] == "200 x 32 at 3e-4 − 200 x 32 at 1e-4"
    assert rows["eae"]["fanoutqa single-hop test EM"] == "+3.5 [-15.6, +22.6] ~ (seeds=2)", rows["eae"]
    assert rows["eae"]["masked PPL"] == "–" and rows["no_eae"]["fanoutqa single-hop test EM"] == "+0.0 (n=1)"
    # against the 4,000-step stores (other models): both pretrainings named, "–" for these
    tables = _tables(tmp_path / "qa3e-4", "--versus", tmp_path / "longer")
    assert ("| vital | medium | eae | – − 4,000 x 512, memory lr x10, X3 = X2 + X1, memory EL weight 0.1, memory query detached | 200 x 32 at 3e-4 − 200 x 32 at 1e-4 |"
            in tables.stdout), tables.stdout


def test_a_real_text_model_at_two_recipes_is_refused_in_one_table_and_paired_on_the_seeds_kept(tmp_path, monkeypatch):
    """Real-text stores of EaE and No-EaE on seeds 0-1 and of EaE on seed 0 at another recipe
    (the memory's query detached, as round 62 set round 41's seeds 10-14 against its 10-12):
    together they would put both of EaE's recipes in one row, under one recipe's name, so they
    are refused, naming both; --seeds 0 keeps the later store's seed, every store's, and pairs it
    with No-EaE on that seed alone (masked entity acc 0.47 − 0.50 = −3.0 points, n=1)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    recipe = {"train.lr": "0.0001", "train.max_steps": "7200", "train.warmup_fraction": "0.1", "train.batch_size": "128"}

    def store(directory, accuracy, **params):
        for (variant, seed), acc in accuracy.items():
            cell = f"wvital2000-minilm-{variant}-s{seed}"
            _log_cell(directory, cell, {cell: ({**recipe, **params}, {}),
                                        f"masked-{cell}": ({}, {"test/entity_accuracy": acc, "test/entities": 876.0})})

    store(tmp_path / "attached", {("eae", 0): 0.45, ("eae", 1): 0.44, ("no_eae", 0): 0.50, ("no_eae", 1): 0.49})
    store(tmp_path / "detached", {("eae", 0): 0.47}, **{"model.memory_query_detached": "True"})
    mixed, kept, versus, refused = _side_by_side(
        (_tables, tmp_path / "attached", tmp_path / "detached"),
        (_tables, tmp_path / "attached", tmp_path / "detached", "--seeds", "0"),
        (_tables, tmp_path / "detached", "--versus", tmp_path / "attached", "--seeds", "0", "1"),
        (_tables, "--best-recipe", tmp_path / "attached", "--seeds", "0"))
    assert mixed.returncode == 2 and "more than one recipe" in mixed.stderr, mixed.stdout + mixed.stderr
    assert "wvital2000-minilm-eae: lr 1e-4 x 7,200 (10% warmup, batch 128, file order)" in mixed.stderr, mixed.stderr
    assert "; lr 1e-4, memory query detached x 7,200 (10% warmup" in mixed.stderr, mixed.stderr
    assert kept.returncode == 0, kept.stderr
    out = kept.stdout.split("## Real text")[1]
    head = next(line for line in out.splitlines() if line.startswith("| world | transformer | model |")).strip(" |").split(" | ")
    eae = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital2000 | minilm | eae |")).strip(" |").split(" | ")))
    assert eae["seeds"] == "1" and eae["steps x batch"] == "7,200 x 128, memory query detached", eae
    no_eae = dict(zip(head, next(r for r in out.splitlines() if r.startswith("| vital2000 | minilm | no_eae |")).strip(" |").split(" | ")))
    assert no_eae["seeds"] == "1", no_eae
    gaps = out.split("### Paired by seed")[1]
    columns = next(r for r in gaps.splitlines() if r.startswith("| world | transformer | pair |")).strip(" |").split(" | ")
    pair = dict(zip(columns, next(r for r in gaps.splitlines() if r.startswith("| vital2000 | minilm | EaE − No-EaE |")).strip(" |").split(" | ")))
    assert pair["masked entity acc (test articles)"] == "-3.0 (n=1)", pair
    # the detached EaE against the attached one on its seed (47 − 45: +2.0), seed 1 in neither
    assert versus.returncode == 0, versus.stderr
    rows = versus.stdout.split("### The same model and seed on real text")[1]
    columns = next(r for r in rows.splitlines() if r.startswith("| world | transformer | model |")).strip(" |").split(" | ")
    row = dict(zip(columns, next(r for r in rows.splitlines() if r.startswith("| vital2000 | minilm | eae |")).strip(" |").split(" | ")))
    assert row["masked entity acc (test articles)"] == "+2.0 (n=1)", row
    assert refused.returncode == 2 and "--seeds: only for the one-recipe tables" in refused.stderr, refused.stderr


def test_best_recipe_picks_each_models_recipe_on_dev_and_pairs_the_picks_on_test(tmp_path, monkeypatch):
    """--best-recipe on two real stores of the same cells trained at two recipes (lr 1e-3 x
    2,000 and lr 3e-4 x 6,000): each model's recipe is picked by QA dev EM on the seeds both its
    recipes hold (0-2), never by test EM, and EaE − No-EaE is paired by seed on test at the picks.
    By hand: EaE picks 1e-3 (dev 20 > 15; by test EM it would pick 3e-4, 25 > 23), No-EaE 3e-4
    (30 > 10); test gaps 0, 2, 4 points: mean 2, sd 2, half-width 4.303 x 2 / sqrt 3 = 5.0. On all
    its seeds EaE's 3e-4 has dev 26.25 (seed 4: 60) and is picked: gaps 5, 5, 5. A third store
    repeats the 3e-4 cells with rows shuffled (train.shuffle_rows), every EM 0: a recipe of its
    own, never picked (merged into the file-order 3e-4, its later cells would win and change
    both picks). A 20k world trains each recipe on seeds of its own: its picks are made on all
    their seeds, and the gap's row says so (round 10's 20k world). --figure draws the picks' gaps
    (QA for both worlds, fact recall for the 5k one: 3 points) at the worlds' facts per transformer
    parameter, the same ratio the one-recipe tables print; the 20k world's No-EaE at 3e-4 has no
    fact-recall run (round 36's pick had QA runs only), and under the table each "–" says why. Without --best-recipe, stores that train a model
    at two recipes are refused (one table would mix them, or drop one where a cell's name repeats);
    a store passed twice is not, nor one whose every cell a later store retrains, at another
    recipe or at the same one (a rerun): the tables say so."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # recipe: {(variant, seed): (dev EM, test EM)}
    recipes = {("0.001", "2000"): {**{("eae", s): (0.20, 0.20 + 0.02 * s) for s in range(4)},
                                   **{("no_eae", s): (0.10, 0.10 + 0.01 * s) for s in range(4)}},
               ("0.0003", "6000"): {**{("eae", s): (0.15, 0.25) for s in range(3)}, ("eae", 4): (0.60, 0.25),
                                    **{("no_eae", s): (0.30, 0.20) for s in range(3)}}}
    # the 20k world: each recipe on seeds of its own (no seed in common), so the pick is on all
    # its seeds: EaE and No-EaE both pick 3e-4 (dev 10 > 5); gaps 2, 3, 4: mean 3, sd 1,
    # half-width 4.303 / sqrt 3 = 2.5
    recipes[("0.001", "2000")].update({(v, s, "w20000r4"): (0.05, 0.05) for v in ("eae", "no_eae") for s in range(3)})
    recipes[("0.0003", "6000")].update({**{("eae", s, "w20000r4"): (0.10, 0.04 + 0.01 * s) for s in range(10, 13)},
                                        **{("no_eae", s, "w20000r4"): (0.10, 0.12) for s in range(10, 13)}})
    recipes[("0.0003", "6000", "shuffled")] = {cell: (0.0, 0.0) for cell in recipes[("0.0003", "6000")]}
    stores = []
    for (lr, steps, *shuffled), cells in recipes.items():
        store = tmp_path / f"lr{lr}{'-'.join(['', *shuffled])}" / "mlruns"
        for (variant, seed, *world), (dev, test) in cells.items():
            cell = f"{world[0] if world else 'w5000r4'}-medium-{variant}-s{seed}"
            client = MlflowClient(f"file://{store / cell}")
            experiment = client.create_experiment("regime")
            runs = {cell: {"train.lr": lr, "train.max_steps": steps, "train.warmup_fraction": "0.05",
                           "train.batch_size": "512", **({"train.shuffle_rows": "true"} if shuffled else {}),
                           # the medium preset: 3,159,040 transformer parameters (round 10's Settings table)
                           "model.num_entities": "20000" if world else "5000", "model.entity_dim": "128", "model.hidden_size": "256",
                           "model.num_heads": "4", "model.ffn_size": "1024", "model.l0": "2", "model.l1": "2"},
                    f"qa-{cell}": {"finetune.lr": "0.0001", "finetune.max_steps": "300"},
                    **({} if (world, variant, lr) == (["w20000r4"], "no_eae", "0.0003") else
                       {f"lama-{cell}": {}})}  # fact recall: the test EM again; the world's fact count
            for name, params in runs.items():
                run = client.create_run(experiment, run_name=name)
                for k, v in params.items():
                    client.log_param(run.info.run_id, k, v)
                if name.startswith("qa-"):
                    client.log_metric(run.info.run_id, "dev/em", dev)
                    client.log_metric(run.info.run_id, "test/em", test)
                if name.startswith("lama-"):
                    client.log_metric(run.info.run_id, "lama/synth/stated/entity_accuracy", test)
                    client.log_metric(run.info.run_id, "lama/synth/stated/available", 40000.0 if world else 10000.0)
                client.set_terminated(run.info.run_id, "FINISHED")
        stores.append(str(store))
    rerun_store = tmp_path / "rerun" / "mlruns"  # a rerun of stores[1] (below)
    shutil.copytree(stores[1], rerun_store)
    (tmp_path / "empty").mkdir()
    # the tables read the stores and write nothing another reads: every command below at once
    tables, mixed, replaced, rerun, empty = _side_by_side(
        (_tables, "--best-recipe", *stores, "--figure", tmp_path / "best.svg"), (_tables, stores[0], stores[1]),
        (_tables, stores[1], stores[1], stores[2]), (_tables, stores[1], rerun_store), (_tables, "--best-recipe", tmp_path / "empty"))
    assert tables.returncode == 0, tables.stderr
    assert f"figure: {tmp_path / 'best.svg'} (3 points)" in tables.stdout and (tmp_path / "best.svg").stat().st_size > 0
    assert "medium, table 1x" in (tmp_path / "best.svg").read_text()  # under each point's tick: the picks' table lr
    picked = [r.strip(" |").split(" | ") for r in tables.stdout.splitlines() if "**(picked)**" in r and r.startswith("| 5,000")]
    assert [(r[2], r[3].split(" (")[0]) for r in picked] == [("eae", "lr 1e-3 x 2,000"), ("no_eae", "lr 3e-4 x 6,000")], picked
    assert "file order" in picked[1][3] and sum("rows shuffled); QA" in r for r in tables.stdout.splitlines() if r.startswith("| 5,000")) == 2, tables.stdout  # its EaE and No-EaE rows
    gaps = tables.stdout.split("### EaE − No-EaE, each at its best recipe")[1]
    head = next(r for r in gaps.splitlines() if r.startswith("| world |")).strip(" |").split(" | ")
    rows = {r.strip(" |").split(" | ")[3]: dict(zip(head, r.strip(" |").split(" | "))) for r in gaps.splitlines() if r.startswith("| 5,000")}
    assert rows["common seeds"]["QA test EM"] == "+2.0 [-3.0, +7.0] ~ (seeds=3)", rows
    assert rows["common seeds"]["fact recall, facts pretraining read"] == "+2.0 [-3.0, +7.0] ~ (seeds=3)", rows
    assert rows["all its seeds"]["EaE's recipe"].startswith("lr 3e-4 x 6,000") and rows["all its seeds"]["QA test EM"] == "+5.0 [+5.0, +5.0] ✓ (seeds=3)", rows
    big = [dict(zip(head, r.strip(" |").split(" | "))) for r in gaps.splitlines() if r.startswith("| 20,000")]
    assert [(r["picked on dev EM over"], r["EaE's recipe"].split(" (")[0], r["No-EaE's recipe"].split(" (")[0], r["QA test EM"])
            for r in big] == [("all its seeds (fewer than 3 in common)", "lr 3e-4 x 6,000", "lr 3e-4 x 6,000", "+3.0 [+0.5, +5.5] ✓ (seeds=3)")], big
    assert big[0]["fact recall, facts pretraining read"] == "–", big
    both = "QA test EM, facts pretraining read; QA test EM, held-out facts; masked entity acc (test articles): EaE's and No-EaE's picked runs have none"
    assert [line for line in gaps.splitlines() if line.startswith("(–: ")] == [
        f"(–: 5,000, facts stated 4x, medium (common seeds): {both})", f"(–: 5,000, facts stated 4x, medium (all its seeds): {both})",
        f"(–: 20,000, facts stated 4x, medium (all its seeds (fewer than 3 in common)): {both})",
        "(–: 20,000, facts stated 4x, medium (all its seeds (fewer than 3 in common)): fact recall, facts pretraining read: "
        "No-EaE's picked runs have none)"], gaps
    # the growth table at the picks: the 20k world's gaps (2, 3, 4) − the 5k world's (0, 2, 4):
    # +1, Welch (variances of the means 1/3 and 4/3, df 2.94, t 3.22): [-3.2, +5.2]; each
    # point's budget is its picks' (EaE's 2,000 steps and No-EaE's 6,000 at 5k), not the settings'
    growth = tables.stdout.split("### EaE − No-EaE at the larger world")[1].split("###")[0]
    row = next(r for r in growth.splitlines() if r.startswith("| medium |")).strip(" |").split(" | ")
    assert row[1] == ("5,000, facts stated 4x → 20,000, facts stated 4x (0.003 → 0.013; 2,000 x 512 / 6,000 x 512 "
                      "→ 6,000 x 512)"), row
    assert row[2] == "+1.0 [-3.2, +5.2] ~ (seeds=3)", row
    assert mixed.returncode == 2 and "more than one recipe" in mixed.stderr, mixed.stderr
    assert f"w5000r4-medium-eae: lr 1e-3 x 2,000 (5% warmup, batch 512, file order) ({stores[0]})" in mixed.stderr, mixed.stderr
    assert f"; lr 3e-4 x 6,000 (5% warmup, batch 512, file order) ({stores[1]})" in mixed.stderr, mixed.stderr
    # a store passed twice (the same runs: silently the later), then every cell of that recipe
    # retrained at another (round 7's MM at a longer warmup): the later store wins, one recipe
    # per model, and the tables say what was replaced
    assert replaced.returncode == 0, replaced.stderr
    notices = [line for line in replaced.stdout.splitlines() if "replaced by" in line]
    assert notices == [f"(13 cell(s) of {stores[1]}, pretrained at lr 3e-4 x 6,000 (5% warmup, batch 512, file order), replaced by "
                       f"{stores[2]}'s at lr 3e-4 x 6,000 (5% warmup, batch 512, rows shuffled): a later store's cell wins)"], notices
    # another store of the same cells at the same recipe (a rerun, round 22's EaE): said too
    # (rerun_store: a copy of stores[1])
    assert rerun.returncode == 0, rerun.stderr
    notices = [line for line in rerun.stdout.splitlines() if "replaced by" in line]
    assert notices == [f"(13 cell(s) of {stores[1]} replaced by {rerun_store}'s rerun at the same recipe, "
                       "lr 3e-4 x 6,000 (5% warmup, batch 512, file order): a later store's cell wins)"], notices
    # the facts per transformer parameter --best-recipe printed: the one-recipe tables' (their
    # Settings), 10,000 and 40,000 facts over the medium preset's 3,159,040 parameters
    settings = replaced.stdout.split("### Settings")[1].split("###")[0]
    settings = {r.strip(" |").split(" | ")[0]: r.strip(" |").split(" | ")[4] for r in settings.splitlines() if r.startswith("| ") and "," in r}
    assert (rows["common seeds"]["facts / param"], big[0]["facts / param"]) == ("0.003", "0.013") == (
        settings["5,000, facts stated 4x"], settings["20,000, facts stated 4x"]), (rows, settings)
    # (tmp_path / "empty") stores without a QA run: a clear error, exit 2
    assert empty.returncode == 2 and "no cell in these stores has a QA run" in empty.stderr, empty.stderr


def _log_cell(store: Path, cell: str, runs: dict) -> None:
    """One cell's file store (a study's mlruns/<cell>): runs {name: (params, metrics)}, each FINISHED."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file://{store / cell}")
    experiment = client.create_experiment("regime")
    for name, (params, metrics) in runs.items():
        run = client.create_run(experiment, run_name=name)
        for k, v in params.items():
            client.log_param(run.info.run_id, k, v)
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id, "FINISHED")


def test_best_recipe_takes_a_store_of_qa_runs_only_to_the_pretraining_that_wrote_its_model(tmp_path, monkeypatch):
    """A store of QA runs only (finetune.sh with FROM_STUDY: another QA recipe for a study's
    models, round 20's) joins --best-recipe through the model's path: each QA run's
    finetune.init is the train.out of the pretraining run that wrote the model, whose recipe
    and evaluations it takes. By hand: EaE's QA at 3e-4 x 600 is picked (dev 30 > 20), No-EaE's
    at 1e-4 x 300 (dev 15 > 10); test gaps 40 − 10, 42 − 11, 44 − 12: 30, 31, 32, mean 31, sd 1,
    half-width 4.303 / sqrt 3 = 2.5. EaE − EaE-unsup is paired the same way, each at its own
    pick (round 31's EaE-unsup). A cell of QA runs only whose model no given store wrote
    (another session's study) is left out, and the tables say so. The one-recipe tables join the
    QA-only store the same way (round 21's QA recipes against round 10's cells, by --versus)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    study, again = tmp_path / "study" / "mlruns", tmp_path / "qa600" / "mlruns"
    # {(world, variant): seeds}, and each variant's (dev, test) EM at QA 300 at 1e-4, then at 600 at 3e-4
    # (EaE-unsup: picked on dev at 300, where test is lower). On the 20k world EaE and EaE-unsup
    # share no seed: no pair, and no row
    seeds = {(5000, "eae"): range(3), (5000, "no_eae"): range(3), (5000, "eae_unsup"): range(3),
             (20000, "eae"): range(3), (20000, "eae_unsup"): range(5, 8)}
    em = {"eae": lambda s: ((0.20, 0.30 + 0.02 * s), (0.30, 0.40 + 0.02 * s)),
          "no_eae": lambda s: ((0.15, 0.10 + 0.01 * s), (0.10, 0.05)),
          "eae_unsup": lambda s: ((0.18, 0.20), (0.12, 0.30))}
    for (world, variant), cell_seeds in seeds.items():
        for seed in cell_seeds:
            cell = f"w{world}r4-medium-{variant}-s{seed}"
            model = f"/tmp/r20/models/{cell}"
            pre = {"train.lr": "0.001", "train.max_steps": "2000", "train.warmup_fraction": "0.05", "train.batch_size": "512",
                   "train.memory_lr_scale": "10", "train.out": model, "model.num_entities": str(world), "model.entity_dim": "128", "model.hidden_size": "256",
                   "model.num_heads": "4", "model.ffn_size": "1024", "model.l0": "2", "model.l1": "2"}
            (dev, test), (dev600, test600) = em[variant](seed)
            _log_cell(study, cell, {
                cell: (pre, {}),
                f"qa-{cell}": ({"finetune.lr": "0.0001", "finetune.max_steps": "300", "finetune.init": model},
                               {"dev/em": dev, "test/em": test}),
                f"lama-{cell}": ({}, {"lama/synth/stated/entity_accuracy": 0.5, "lama/synth/stated/available": 10000.0})})
            _log_cell(again, cell, {f"qa-{cell}": ({"finetune.lr": "0.0003", "finetune.max_steps": "600", "finetune.init": model},
                                                   {"dev/em": dev600, "test/em": test600})})
    _log_cell(again, "w5000r4-medium-eae-s7", {"qa-w5000r4-medium-eae-s7": (
        {"finetune.lr": "0.0003", "finetune.max_steps": "600", "finetune.init": "/tmp/r9/models/w5000r4-medium-eae-s7"},
        {"dev/em": 0.9, "test/em": 0.9})})
    # the tables read the stores and write nothing another reads: every command below at once
    tables, one, nodata = _side_by_side((_tables, "--best-recipe", study, again, "--figure", tmp_path / "best.svg"),
                                        (_tables, study, again),
                                        (_tables, study, "--answer-frequency", f"5000r4={tmp_path / 'nodata'}"))
    assert tables.returncode == 0, tables.stderr
    assert "medium, table 10x" in (tmp_path / "best.svg").read_text()  # both picks train the table at 10x
    assert "(1 cell(s) of QA runs only left out: no store given holds one pretraining run that wrote the model" in tables.stdout
    picked = [r.strip(" |").split(" | ") for r in tables.stdout.splitlines() if "**(picked)**" in r and r.startswith("| 5,000")]
    assert [(r[2], r[3].split("; ")[1].split(" **")[0], r[4]) for r in picked] == [
        ("eae", "QA 600 at 3e-4", "3"), ("eae_unsup", "QA 300 at 1e-4", "3"), ("no_eae", "QA 300 at 1e-4", "3")], picked
    # EaE − EaE-unsup at the picks: 40 − 20, 42 − 20, 44 − 20 (picked by test EM, EaE-unsup's
    # 600 would give 10, 12, 14); the 20k world, with no seed in common, has no row
    unsup = tables.stdout.split("### EaE − EaE-unsup, each at its best recipe")[1].split("###")[0]
    head = next(r for r in unsup.splitlines() if r.startswith("| world |")).strip(" |").split(" | ")
    rows = [dict(zip(head, r.strip(" |").split(" | "))) for r in unsup.splitlines() if r.startswith("| ") and not r.startswith("| world |")]
    assert [(r["world"], r["EaE-unsup's recipe"].split("; ")[1], r["QA test EM"]) for r in rows] == [
        ("5,000, facts stated 4x", "QA 300 at 1e-4", "+22.0 [+17.0, +27.0] ✓ (seeds=3)")], rows
    gaps = tables.stdout.split("### EaE − No-EaE, each at its best recipe")[1].split("### EaE − EaE-unsup")[0]
    head = next(r for r in gaps.splitlines() if r.startswith("| world |")).strip(" |").split(" | ")
    row = dict(zip(head, next(r for r in gaps.splitlines() if r.startswith("| 5,000")).strip(" |").split(" | ")))
    # the QA-only store's test EM, and fact recall from the pretraining store's evaluation (50 − 50)
    assert (row["QA test EM"], row["fact recall, facts pretraining read"]) == (
        "+31.0 [+28.5, +33.5] ✓ (seeds=3)", "+0.0 [+0.0, +0.0] ~ (seeds=3)"), row
    # the one-recipe tables of the study with the QA-only store after it: its QA runs in place of
    # the study's (EaE 40, 42, 44 − No-EaE 5: gaps 35, 37, 39, mean 37, sd 2, half-width
    # 4.303 x 2 / sqrt 3 = 5.0), the pretraining's evaluations kept; the unlinked cell is left out
    assert one.returncode == 0, one.stderr
    assert f"(15 cell(s) of {again}: QA runs only, each in place of the QA run of the cell whose pretraining wrote its model)" in one.stdout, one.stdout
    assert f"(1 cell(s) of {again} left out: QA runs only, and no earlier store holds the pretraining run" in one.stdout, one.stdout
    gaps = one.stdout.split("### EaE − No-EaE, paired by seed")[1].split("###")[0]
    head = next(r for r in gaps.splitlines() if r.startswith("| world |")).strip(" |").split(" | ")
    row = dict(zip(head, next(r for r in gaps.splitlines() if r.startswith("| 5,000")).strip(" |").split(" | ")))
    assert (row["QA test EM"], row["fact recall, facts pretraining read"]) == (
        "+37.0 [+32.0, +42.0] ✓ (seeds=3)", "+0.0 [+0.0, +0.0] ~ (seeds=3)"), row
    # Figure 3 from a directory without the world's shards: a clear error before any table
    assert nodata.returncode == 2 and f"no train shards under 5000r4={tmp_path / 'nodata'}" in nodata.stderr, nodata.stderr
    assert "Traceback" not in nodata.stderr and nodata.stdout == "", (nodata.stdout, nodata.stderr)


def test_recipes_run_a_stage_side_by_side_each_in_a_study_of_its_own_sharing_the_worlds_data(tmp_path):
    """recipes.sh: one command for three recipes at once, each in $STUDY/<name> with its own
    settings as settings.sh reads them (what every stage script sources), each reading the world's
    data built once in $STUDY, the GPUs shared by every recipe's cells (3 recipes of a cell on one
    GPU: a third each, where one alone would get all of it); a malformed recipe is refused before
    anything runs. (Round 9 ran its pretraining, QA and evaluations through it on two H200s.)"""
    study = tmp_path / "study"
    (study / "data" / "w300r2").mkdir(parents=True)
    (study / "data" / "w300r2" / "manifest.json").write_text("{}")
    env = {**os.environ, "STUDY": str(study), "WORLDS": "300r2", "VARIANTS": "eae", "SEEDS": "0", "GPUS": "1", "DEVICE": "gpu",
           "RECIPES": "fast:LR=1e-3 gentle:LR=3e-4,WARMUP=0.25 slow:LR=1e-4,STEPS=9000"}
    show = ('. experiments/regime/settings.sh && test -f "$(data_dir 300r2)/manifest.json" && '
            'echo "study=$STUDY lr=$LR warmup=$WARMUP steps=$STEPS $(device_set)"')
    done = _stage("recipes", env, "bash", "-c", show)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(done.stdout.splitlines())
    share = "--set train.use_gpu=true --set train.gpus_per_worker=0.333 --set train.cpus_per_worker=1"
    assert lines == [f"[fast] study={study}/fast lr=1e-3 warmup=0.05 steps=5000 {share}",
                     f"[gentle] study={study}/gentle lr=3e-4 warmup=0.25 steps=5000 {share}",
                     f"[slow] study={study}/slow lr=1e-4 warmup=0.05 steps=9000 {share}"], lines
    assert (study / "gentle" / "data").resolve() == (study / "data").resolve()  # the world's data, not a copy
    failing = _stage("recipes", {**env, "RECIPES": "ok:LR=1e-3 broken:LR=3e-4"}, "bash", "-c", '[ "$LR" = 1e-3 ]')
    assert failing.returncode == 1  # one recipe's failure is the command's
    bad = _stage("recipes", {**env, "RECIPES": "fast:lr=0.001"}, "true")
    assert bad.returncode == 2 and "expected NAME:SETTING=VALUE" in bad.stderr, bad.stderr


def test_dev_curve_pairs_each_steps_dev_evaluations_by_seed_paused_or_finished(tmp_path, monkeypatch):
    """--dev-curve on real stores of a paused study and a finished one: each pretraining run's
    dev evaluations by step, each model's mean ± sd over its seeds and EaE − No-EaE paired by
    seed, per recipe (lr 3e-4 paused, lr 1e-4 finished; the same cell names in both stores are
    two recipes, not a rerun). By hand at lr 3e-4, step 1,000: EaE 10, 14 -> 12.0 ± 2.8; No-EaE
    8, 8 -> 8.0; gaps 2, 6: mean 4, sd 2.83, half-width 12.706 x 2.83 / sqrt 2 = 25.4 ->
    [-21.4, +29.4]. Step 2,000: only the seed whose EaE reached it is paired (n=1). The tables
    without --dev-curve leave the paused cells out and say where they stopped, never silently."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # lr -> {(variant, seed): ({step: dev entity acc}, last step, status)}
    studies = {"0.0003": {("eae", 0): ({1000: 0.10, 2000: 0.20}, 2300, "KILLED"), ("eae", 1): ({1000: 0.14}, 1500, "KILLED"),
                          ("no_eae", 0): ({1000: 0.08, 2000: 0.10}, 2800, "KILLED"), ("no_eae", 1): ({1000: 0.08, 2000: 0.30}, 2800, "KILLED")},
               "0.0001": {(v, seed): ({1000: 0.05, 2000: 0.07}, 2000, "FINISHED") for v in ("eae", "no_eae") for seed in (0, 1)}}
    stores = []
    for lr, cells in studies.items():
        store = tmp_path / f"lr{lr}" / "mlruns"
        for (variant, seed), (dev, last, status) in cells.items():
            cell = f"w5000r4-minilm-{variant}-s{seed}"
            client = MlflowClient(f"file://{store / cell}")
            run = client.create_run(client.create_experiment("regime"), run_name=cell).info.run_id
            for k, v in {"train.lr": lr, "train.max_steps": 2000 if status == "FINISHED" else 6000,
                         "train.warmup_fraction": "0.1", "train.batch_size": "128", "train.shuffle_rows": "true"}.items():
                client.log_param(run, k, v)
            for step, acc in dev.items():
                client.log_metric(run, "dev/entity_accuracy", acc, step=step)
                client.log_metric(run, "dev/perplexity", 20.0 if variant == "eae" else 19.0, step=step)
            client.log_metric(run, "train/loss", 3.0, step=last)
            client.set_terminated(run, status)
        archive = tmp_path / f"lr{lr}.mlruns.tar.xz"
        with tarfile.open(archive, "w:xz") as tar:
            tar.add(store, "mlruns")
        stores.append(archive)

    curve = _tables("--dev-curve", *stores)
    assert curve.returncode == 0, curve.stderr
    finished, paused = curve.stdout.split("### Pretraining's dev evaluations by step: ")[1:]  # by recipe: 1e-4 first
    assert paused.startswith("5,000, facts stated 4x, `minilm`, lr 3e-4 x 6,000 (10% warmup, batch 128, rows shuffled)"), paused
    assert "- eae, seeds 0, 1: 1 stopped at step 1,500, 1 stopped at step 2,300" in paused
    assert "- no_eae, seeds 0, 1: 2 stopped at step 2,800" in paused
    assert ("| 1,000 | 12.0 ± 2.8 | 8.0 ± 0.0 | +4.0 [-21.4, +29.4] ~ (seeds=2) | 20.0 ± 0.0 | 19.0 ± 0.0 "
            "| +1.0 [+1.0, +1.0] ✗ (seeds=2) |") in paused
    assert "| 2,000 | 20.0 | 20.0 ± 14.1 | +10.0 (n=1) | 20.0 | 19.0 ± 0.0 | +1.0 (n=1) |" in paused
    assert finished.startswith("5,000, facts stated 4x, `minilm`, lr 1e-4 x 2,000") and "2 finished" in finished
    assert "| 2,000 | 7.0 ± 0.0 | 7.0 ± 0.0 | +0.0 [+0.0, +0.0] ~ (seeds=2) |" in finished
    # --versus: each model of the paused recipe − the same model and No-EaE at the finished one,
    # by seed (step 1,000: EaE 10 − 5, 14 − 5: mean 7, half-width 25.4 as above; No-EaE 8 − 5
    # twice: +3, no spread); at 2,000 only EaE's seed 0 (20 − 7), No-EaE 10 − 7 and 30 − 7 (mean 13,
    # sd 14.14, half-width 127.1); a store against itself pairs nothing
    versus = _tables("--dev-curve", stores[0], "--versus", stores[1], stores[0])
    assert versus.returncode == 0, versus.stderr
    [paused] = versus.stdout.split("### Pretraining's dev evaluations by step: ")[1:]
    assert "- --versus (a): lr 1e-4 x 2,000 (10% warmup, batch 128, rows shuffled); eae, seeds 0, 1, no_eae, seeds 0, 1\n" in paused, paused
    assert "--versus (b)" not in paused, paused
    assert ("| step | eae dev masked entity acc | no_eae dev masked entity acc | EaE − No-EaE, dev masked entity acc "
            "| eae − (a) eae, dev masked entity acc | eae − (a) no_eae, dev masked entity acc | no_eae − (a) no_eae, dev masked entity acc |") in paused, paused
    assert ("| 1,000 | 12.0 ± 2.8 | 8.0 ± 0.0 | +4.0 [-21.4, +29.4] ~ (seeds=2) | +7.0 [-18.4, +32.4] ~ (seeds=2) "
            "| +7.0 [-18.4, +32.4] ~ (seeds=2) | +3.0 [+3.0, +3.0] ✓ (seeds=2) |") in paused, paused
    assert "| 2,000 | 20.0 | 20.0 ± 14.1 | +10.0 (n=1) | +13.0 (n=1) | +13.0 (n=1) | +13.0 [-114.1, +140.1] ~ (seeds=2) |" in paused, paused

    tables = _tables(stores[0])
    assert tables.returncode == 0, tables.stderr
    assert ("(4 cell(s) left out, their pretraining not finished: 1 at step 1,500 of 6,000 (KILLED); 1 at step 2,300 "
            "of 6,000 (KILLED); 2 at step 2,800 of 6,000 (KILLED).") in tables.stdout, tables.stdout
    empty = tmp_path / "empty.tar.xz"
    with tarfile.open(empty, "w:xz") as tar:
        tar.add(tmp_path / "lr0.0003" / "mlruns" / "w5000r4-minilm-eae-s0" / "0", "mlruns/w5000r4-minilm-eae-s0/0")
    refused = _tables("--dev-curve", empty)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "--dev-curve: no pretraining run in these stores logged a dev evaluation" in refused.stderr


def test_the_cells_shares_of_the_gpus_fit_on_them_together():
    """settings.sh's share(): every cell of a study (or of all its recipes) fits on the GPUs at
    once. Rounded to nearest, 6 cells on a GPU got 0.167 each, 1.002 of it: Ray placed five, the
    sixth cell's worker group timed out after 60 s and started only when another cell stopped
    (round 24's `small` cell at step 100 while the others reached 3,400-3,800; round 19's twice)."""
    every = ('. experiments/regime/settings.sh && for GPUS in 1 2 8; do for SHARE_CELLS in $(seq 40); do '
             'echo "$GPUS $SHARE_CELLS $(share)"; done; done')  # settings.sh sourced once
    done = subprocess.run(["bash", "-c", every], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 120, done.stdout + done.stderr
    for line in done.stdout.splitlines():
        gpus, cells, share = line.split()
        gpus, cells, share = int(gpus), int(cells), float(share)
        per_gpu = -(-cells // gpus)  # Ray puts a fractional share on a GPU with that much left
        assert per_gpu * share <= 1.0, (cells, gpus, share)
        assert share >= 0.99 / per_gpu - 0.001, (cells, gpus, share)  # no GPU left idle


def test_pretraining_a_world_without_its_data_is_refused_before_any_cell_starts(tmp_path):
    """pretrain.sh when data.sh has not built a world (a fresh study, or a lent machine's /tmp
    lost between calls, as round 17's second call found): one clear line and exit 2, where each
    cell used to fail on its own with a traceback and a TypeError from `eae pretrain`."""
    env = {**os.environ, "STUDY": str(tmp_path / "study"), "WORLDS": "300r2", "VARIANTS": "eae", "SEEDS": "0",
           "DEVICE": "cpu", "EAE_CMD": "false"}
    done = _stage("pretrain", env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "world 300r2 has no data" in done.stderr and "run experiments/regime/data.sh first" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "study" / "logs" / "pretrain-w300r2-small-eae-s0.log").exists()


def test_the_minilm_size_starts_its_cells_from_the_shipped_encoder(ray_cluster, world_300r2, tmp_path, monkeypatch):
    """SIZES=minilm: pretrain.sh launches the cell with train.init_encoder=minilm (size_set),
    as its MLflow run's params record; INIT_ENCODER=false trains the same shape from scratch,
    which the tables name as a recipe of its own. The two studies pretrain side by side, on the
    world data.sh built once (world_300r2)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the cells' stores are file stores
    inits = ("true", "false")
    envs = {init: {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
                   "STUDY": str(_with_world(world_300r2, tmp_path / init / "study")),
                   "WORLDS": "300r2", "SIZES": "minilm", "VARIANTS": "eae", "SEEDS": "0", "STEPS": "2", "LOG_EVERY": "1",
                   "BATCH": "4", "DEVICE": "cpu", "EAE_CMD": f"{sys.executable} -m eae_platform.cli",
                   "MLFLOW_ALLOW_FILE_STORE": "true", "INIT_ENCODER": init} for init in inits}
    done = dict(zip(inits, _side_by_side(*[(_stage, "pretrain", envs[init]) for init in inits])))
    tables = _results_tables()
    for init in inits:
        assert done[init].returncode == 0 and "w300r2-minilm-eae-s0: finished at step 2" in done[init].stdout, (
            init, done[init].stdout + done[init].stderr)
        client = MlflowClient(f"file://{tmp_path / init / 'study' / 'mlruns' / 'w300r2-minilm-eae-s0'}")
        run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
        assert run.data.params["train.init_encoder"] == ("minilm" if init == "true" else "null"), init
        assert run.data.params["model.hidden_size"] == "384", init
        label = tables.settings_label(run.data.params)
        assert label == ("" if init == "true" else ", from scratch"), (init, label)


def test_an_init_encoder_other_than_true_or_false_is_refused_before_any_stage_starts(tmp_path):
    """INIT_ENCODER=True (say) would otherwise read as false and train MiniLM's shape from scratch."""
    refused = _stage("data", {**os.environ, "STUDY": str(tmp_path / "study"), "WORLDS": "300r2", "INIT_ENCODER": "True"})
    assert refused.returncode == 2 and "INIT_ENCODER must be true or false, got 'True'" in refused.stderr, refused.stderr
    assert not (tmp_path / "study" / "data").exists()


def test_eae_is_paired_by_seed_with_eae_unsup_with_mm_and_with_its_top_k_reads(capsys):
    """print_ablations on hand-set per-seed figures: EaE − EaE-unsup, EaE − MM, No-EaE − MM and
    EaE-unsup − No-EaE, each the mean of the per-seed gaps with its t-interval and verdict (Table
    2's rows), and EaE reading every entity − EaE reading the top K (Table 7). By hand: gaps 10,
    10, 7 points: mean 9, sd 1.73, half-width 4.303 x 1.73 / sqrt 3 = 4.3; gaps -1, 2, -3: mean
    -0.7, sd 2.52, half-width 6.25; gaps -11, -9, -12: mean -10.7, sd 1.53, half-width 3.79;
    gaps 0, 1, 2: mean 1, sd 1, half-width 2.5; K: gaps 10, 11, 9: mean 10, half-width 2.5."""
    tables = _results_tables()
    world = (5000, 1)

    def group(qa_em):  # QA test EM per seed 0, 1, 2; every other metric missing
        g = {k: [None] * 3 for k in tables.METRICS}
        return {**g, "seeds": [0, 1, 2], "qa_em": qa_em}

    groups = {(world, "small", "eae"): group([0.30, 0.32, 0.34]), (world, "small", "eae_unsup"): group([0.20, 0.22, 0.27]),
              (world, "small", "mm"): group([0.31, 0.30, 0.37]), (world, "small", "no_eae"): group([0.20, 0.21, 0.25])}
    # `eae eval topk`'s figures (K=all and K=1; 10 and 100 not run): gaps 10, 11, 9 points again
    groups[(world, "small", "eae")].update(memory_k_all=[0.50, 0.52, 0.54], memory_k_1=[0.40, 0.41, 0.45])
    tables.print_ablations(groups)
    out = capsys.readouterr().out
    section = out.split("### EaE, K at inference")[1].split("###")[0]
    row = next(r for r in section.splitlines() if r.startswith("| 5,000 | small |")).strip(" |").split(" | ")
    assert row[2:] == ["+10.0 [+7.5, +12.5] ✓ (seeds=3)", "–", "–"], row
    column = [tables.METRICS[k][2] for k in tables.PAIRED].index("QA test EM")
    for label, gap in (("EaE − EaE-unsup", "+9.0 [+4.7, +13.3] ✓ (seeds=3)"), ("EaE − MM", "-0.7 [-6.9, +5.6] ~ (seeds=3)"),
                       ("No-EaE − MM", "-10.7 [-14.5, -6.9] ✗ (seeds=3)"), ("EaE-unsup − No-EaE", "+1.0 [-1.5, +3.5] ~ (seeds=3)")):
        section = out.split(f"### {label}, paired by seed")[1].split("###")[0]
        row = next(r for r in section.splitlines() if r.startswith("| 5,000 | small |")).strip(" |").split(" | ")
        assert row[2 + column] == gap, (label, row)


def test_the_gap_at_the_larger_world_is_set_against_the_smaller_one_within_each_transformer(capsys):
    """print_growth (print_tables', and print_best_recipes' at the picks) on hand-set per-seed
    figures: within `small`, the 20k world's EaE − No-EaE on QA (seeds 0, 1: gaps 20, 22) − the 5k world's (seeds 0-2: gaps 10, 10, 7): 21 − 9 = +12,
    unpaired (Welch): variances of the means 2/2 = 1 and 3/3 = 1, df = 2^2 / (1/1 + 1/2) = 2.67,
    t(0.975, 2.67) = 3.42, half-width 3.42 x sqrt 2 = 4.84: [+7.2, +16.8], it grows. A world
    with EaE alone (100k) makes no row; `medium`, one world, none either. The two points trained
    at other steps: the row names both budgets."""
    tables = _results_tables()
    small, large, largest = (5000, 4), (20000, 4), (100000, 4)

    def group(seeds, qa_em):
        return {**{k: [None] * len(seeds) for k in tables.METRICS}, "seeds": seeds, "qa_em": qa_em}

    groups = {(small, "small", "eae"): group([0, 1, 2], [0.30, 0.32, 0.34]),
              (small, "small", "no_eae"): group([0, 1, 2], [0.20, 0.22, 0.27]),
              (large, "small", "eae"): group([0, 1, 3], [0.40, 0.42, 0.90]),  # seed 3: No-EaE lacks it, left out
              (large, "small", "no_eae"): group([0, 1], [0.20, 0.20]),
              (largest, "small", "eae"): group([0, 1], [0.5, 0.5]),
              (small, "medium", "eae"): group([0], [0.3]), (small, "medium", "no_eae"): group([0], [0.2])}
    setting = {(small, "small"): {"ratio": 0.025, "steps": 6000, "batch": 128},
               (large, "small"): {"ratio": 0.098, "steps": 12000, "batch": 128},
               (largest, "small"): {"ratio": 0.494, "steps": 12000, "batch": 512},
               (small, "medium"): {"ratio": 0.003, "steps": 6000, "batch": 128}}
    pairs = {(w, z): (groups[(w, z, "eae")], groups[(w, z, "no_eae")]) for (w, z, v) in groups
             if v == "eae" and (w, z, "no_eae") in groups}
    tables.print_growth(pairs, setting)
    out = capsys.readouterr().out
    rows = [r.strip(" |").split(" | ") for r in out.splitlines() if r.startswith("| small |") or r.startswith("| medium |")]
    # the points' budgets differ: the row says so
    assert [r[:2] for r in rows] == [["small", "5,000, facts stated 4x → 20,000, facts stated 4x (0.025 → 0.098; 6,000 x 128 → 12,000 x 128)"]], rows
    column = 2 + [tables.METRICS[k][2] for k in tables.PAIRED].index("QA test EM")
    assert rows[0][column] == "+12.0 [+7.2, +16.8] ✓ (seeds=2)", rows[0]


def test_the_figures_tick_labels_do_not_overlap(tmp_path):
    """draw: the grid's points, close on the log axis (0.0009, 0.003 and 0.0037, as 5k `minilm`,
    5k `medium` and 20k `minilm`; 0.012 and 0.025), each with its value and a note under it: no two
    lines of the labels overlap where the SVG puts them (widths measured in their font), and a
    line goes back to the first rows where nothing is in its way (0.098 is 4x from 0.025)."""
    import re

    from matplotlib.textpath import TextPath

    tables = _results_tables()
    points = {((5000, 4), "minilm"): 0.0009, ((5000, 4), "medium"): 0.003, ((20000, 4), "minilm"): 0.0037,
              ((20000, 4), "medium"): 0.012, ((5000, 4), "small"): 0.025, ((20000, 4), "small"): 0.098}
    setting = {p: {"ratio": r} for p, r in points.items()}
    gaps = {(w, z, "qa_em"): (0.05, 0.02) for (w, z) in points}
    notes = {p: f"{p[1]} {p[0][0]}, table 10x" for p in points}
    tables.draw(setting, gaps, tmp_path / "f.svg", notes)
    svg = (tmp_path / "f.svg").read_text()

    def at(text):  # matplotlib writes each line of a tick label as its own <text>, its left end placed by a translate
        m = re.search(r'<text[^>]*transform="translate\(([-\d.]+) ([-\d.]+)\)[^>]*>' + re.escape(text) + "<", svg)
        assert m, text
        return float(m[1]), float(m[2]), TextPath((0, 0), text, size=8).get_extents().width

    lines = {t: at(t) for t in [f"{r:.3g}" for r in points.values()] + list(notes.values())}
    for a, (xa, ya, wa) in lines.items():
        for b, (xb, yb, wb) in lines.items():
            assert a == b or abs(ya - yb) > 5 or xa + wa <= xb or xb + wb <= xa, (a, b, lines[a], lines[b])
    rows = sorted({round(y) for _, y, _ in lines.values()})
    row = {t: rows.index(round(y)) for t, (_, y, _) in lines.items()}
    assert row["0.0009"] == row["0.003"] == row["0.012"] == row["0.098"] == 0 and row["0.0037"] > 0, row
    assert row["small 20000, table 10x"] == row["minilm 5000, table 10x"] == 1, row
    # a line a transformer, each named once in the legend (one line through all three drew a
    # trend across sizes), in the one panel of the one metric given
    assert [svg.count(f">{z}<") for z in ("minilm", "medium", "small")] == [1, 1, 1], svg
    assert svg.count(">QA test EM<") == 1 and ">masked entity acc (test articles)<" not in svg


def test_the_figure_is_not_drawn_without_a_gap(tmp_path, capsys):
    """draw with no EaE − No-EaE gap (stores of one model only) says so and writes no file."""
    tables = _results_tables()
    tables.draw({((5000, 4), "small"): {"ratio": 0.025}}, {}, tmp_path / "f.svg")
    assert "figure: not drawn, no EaE − No-EaE gap" in capsys.readouterr().out
    assert not (tmp_path / "f.svg").exists()
