"""QA fine-tuning, Tune sweeps and `eae compare` on a real local Ray cluster: a tiny model
pretrained (Ray Train) on the synthetic world, fine-tuned through the CLI from its MLflow
registry alias, a 2 x 2 grid logging to an MLflow server on PostgreSQL that is killed and
restarted mid-sweep, a failed trial that a
resumed sweep re-runs, and the comparison tables of known runs. The pretrained model is the
session's `synth_pretrained` (tests/conftest.py)."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from eae_platform import cli
from eae_platform.finetune.compare import find_runs, markdown, to_csv
from eae_platform.finetune.config import load_finetune_config
from eae_platform.finetune.qa import QATask, clip_gradients, load_init_model, resolve_init
from eae_platform.finetune.sweep import (SweepConfig, check_trial_fits, load_space, resolved, resume_space, run_sweep,
                                         save_state)


def test_finetuning_beats_the_untuned_model(synth_pretrained, capsys):
    tmp, pre, uri = synth_pretrained
    # the untuned model, evaluated exactly as fine-tuning evaluates
    config = load_finetune_config(None, [], init=str(tmp / "model"), data=f"synth:{tmp / 'world'}")
    init = resolve_init(config.init)
    model = load_init_model(init, torch.device("cpu"))
    task = QATask(config, init.vocab_dir, model.config.max_length)
    untuned, _ = task.evaluate(model, "dev", torch.device("cpu"))
    assert task.oracle("dev") == 1.0 and untuned["questions"] > 40  # the world's answers all resolve

    # the CLI, from the model registered by pretraining, as a Ray task; with no finetune.run_name
    # the run is named after --out's directory, "qa-" and its name
    code = cli.main(["finetune", "qa", "--init", "models:/eae-world@pretrained", "--data", f"synth:{tmp / 'world'}",
                     "--max-steps", "150", "--lr", "1e-3", "--batch-size", "32", "--out", str(tmp / "qa" / "world"),
                     "--set", f"finetune.mlflow_uri={uri}", "--set", "finetune.log_every=50"])
    out = capsys.readouterr().out
    assert code == 0, out
    client = MlflowClient(uri)
    [qa_run] = client.search_runs([client.get_experiment_by_name("eae-qa").experiment_id],
                                  filter_string="attributes.run_name = 'qa-world'")
    m = qa_run.data.metrics
    assert m["dev/em"] > untuned["em"] + 0.05, (m["dev/em"], untuned["em"])
    assert m["test/oracle"] == 1.0 and 0 <= m["test/em"] <= 1 and m["data/train_dropped_unresolved"] == 0
    assert f"dev: EM {100 * m['dev/em']:.1f} (oracle 100.0, prior-only baseline {100 * m['dev/prior_em']:.1f})" in out
    assert f"MLflow run:  {qa_run.info.run_id} (qa-world) in {uri}" in out
    assert qa_run.data.params["finetune.init"] == "models:/eae-world@pretrained"
    assert qa_run.data.params["model.preset"] == "tiny"
    assert len(client.get_metric_history(qa_run.info.run_id, "train/loss")) == 3
    arts = {a.path for a in client.list_artifacts(qa_run.info.run_id, "predictions")}
    assert arts == {"predictions/dev.jsonl", "predictions/test.jsonl"}
    assert (tmp / "qa" / "world" / "entities.parquet").is_file()
    # registered as a new version of eae-qa, linked to the run; no alias moved unasked
    [version] = [v for v in MlflowClient(uri, registry_uri=uri).search_model_versions("name = 'eae-qa'")
                 if v.run_id == qa_run.info.run_id]
    assert not version.aliases
    assert f"registered:  models:/eae-qa/{version.version} (a new version; no alias moved" in out


def test_register_as_moves_the_alias_and_a_failed_or_stopped_run_ends_so(synth_pretrained, ray_cluster, capsys):
    """--register-as NAME: a new version of NAME, its alias qa moved (and said so); a run that
    fails mid-training ends FAILED; one stopped by SIGTERM (e.g. `ray job stop`) ends KILLED."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    tmp, _, uri = synth_pretrained
    client = MlflowClient(uri, registry_uri=uri)
    base = ["finetune", "qa", "--init", str(tmp / "model"), "--data", f"synth:{tmp / 'world'}", "--max-steps", "4",
            "--set", f"finetune.mlflow_uri={uri}"]
    for version, said in (("1", "(new alias)"), ("2", "(moved from version 1)")):
        assert cli.main([*base, "--register-as", "eae-qa-named"]) == 0
        assert f"registered:  models:/eae-qa-named@qa -> version {version} {said}" in capsys.readouterr().out
    assert str(client.get_model_version_by_alias("eae-qa-named", "qa").version) == "2"

    assert cli.main([*base, "--lr", "1e30", "--set", "finetune.run_name=qa-diverged"]) == 1  # a non-finite loss
    assert "the loss is" in capsys.readouterr().err
    exp = client.get_experiment_by_name("eae-qa").experiment_id
    [diverged] = client.search_runs([exp], "attributes.run_name = 'qa-diverged'")
    assert diverged.info.status == "FAILED"

    job = subprocess.Popen([sys.executable, "jobs/finetune_qa.py", *base[2:], "--max-steps", "100000", "--set",
                            "finetune.run_name=qa-stopped", "--set", "finetune.log_every=1",
                            "--address", ray_cluster.get_runtime_context().gcs_address],
                           cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    deadline = time.time() + 300
    while job.poll() is None:
        runs = client.search_runs([exp], "attributes.run_name = 'qa-stopped'")
        if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
            break  # training under way
        assert time.time() < deadline, "fine-tuning never started"
        time.sleep(0.5)
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=120)
    [stopped] = client.search_runs([exp], "attributes.run_name = 'qa-stopped'")
    assert stopped.info.status == "KILLED", out[-3000:]
    assert job.returncode == 143 and "eae: terminated (SIGTERM)" in out, (job.returncode, out[-3000:])


def test_bad_finetune_input_is_a_clear_error(synth_pretrained, capsys):
    tmp, _, uri = synth_pretrained
    assert cli.main(["finetune", "qa", "--init", str(tmp / "nope"), "--data", f"synth:{tmp / 'world'}"]) == 2
    assert "neither an MLflow model URI" in capsys.readouterr().err
    assert cli.main(["finetune", "qa", "--init", str(tmp / "model"), "--data", "squad:x"]) == 2
    assert "unknown QA dataset format" in capsys.readouterr().err
    assert cli.main(["finetune", "qa", "--init", str(tmp / "model"), "--data", "synth:x", "--lr", "-1"]) == 2
    assert "lr and step_scale must be positive" in capsys.readouterr().err
    assert cli.main(["finetune", "qa", "--init", str(tmp / "model"), "--data", f"synth:{tmp / 'nowhere'}"]) == 2
    assert f"{tmp / 'nowhere' / 'questions.jsonl'}: not found" in capsys.readouterr().err


def test_no_model_to_finetune_is_refused_before_ray_and_before_any_trial(tmp_path, capsys):
    """No --init (finetune.init): the Ray task said "finetune.init is empty" after Ray had
    started, and a sweep ran every trial to that error, then wanted --resume for a rerun."""
    from eae_data.synth import write_world

    write_world(tmp_path / "world", 50, seed=0)
    assert cli.main(["finetune", "qa", "--data", f"synth:{tmp_path / 'world'}"]) == 2
    assert "no model to fine-tune: give --init (finetune.init)" in capsys.readouterr().err
    path = tmp_path / "space.yaml"
    path.write_text(f"""
sweep: {{name: noinit, max_concurrent: 1, cpus_per_trial: 1, storage_path: "{tmp_path / 'tune'}"}}
finetune: {{data: "synth:{tmp_path / 'world'}", max_steps: 5, mlflow_uri: "sqlite:///{tmp_path / 'mlflow.db'}"}}
grid: {{lr: [1.0e-3, 3.0e-4]}}
""")
    assert cli.main(["tune", "--space", str(path)]) == 2
    assert "no model to fine-tune: give --set finetune.init=MODEL" in capsys.readouterr().err
    assert not (tmp_path / "tune").exists()  # no sweep begun: nothing to --resume


def _space(tmp, tmp_path, uri, body):
    path = tmp_path / "space.yaml"
    path.write_text(body.format(init=tmp / "model", world=tmp / "world", uri=uri, storage=tmp_path / "tune"))
    return path


def _tune_results(root: Path) -> list[dict]:
    """Every result a sweep's trials have reported so far (Tune's result.json, a line each)."""
    return [json.loads(line) for f in root.glob("*/result.json") for line in f.read_text().splitlines() if line.strip()]


def test_grid_sweep_logs_every_trial_to_an_mlflow_server_on_postgresql_through_its_restart(
        synth_pretrained, server, tmp_path):
    """A 2 x 2 grid, 2 trials at a time, each a child run on a PostgreSQL-backed MLflow server.
    The server is killed once a trial's first metrics (its data counts, step 0) have reached it,
    and restarted once a trial has reported a window since (logged while the server was down)
    and 12 s have passed, or after 20 s: longer than a run's default 10 s of trying at its end,
    so a trial that ends in the outage must wait it out (a CI run's under load did not, and its
    metrics stayed in its unsent journal). Metrics logged while it was down arrive with their own
    timestamps, every trial's run ends FINISHED with every window's metrics once, and the sweep
    selects, tests and registers its best trial."""
    tmp, _, _ = synth_pretrained
    space = load_space(_space(tmp, tmp_path, server.url, """
sweep: {{name: grid22, max_concurrent: 2, cpus_per_trial: 1, storage_path: "{storage}"}}
finetune: {{init: "{init}", data: "synth:{world}", max_steps: 20, log_every: 10, eval_every: 10, mlflow_uri: "{uri}"}}
grid: {{lr: [1.0e-3, 3.0e-4], batch_size: [16, 32]}}
"""))
    outage, done = {}, threading.Event()

    def started() -> bool:  # a trial's first metrics (its data counts, step 0) are on the server
        # (not its step-10 window: under load this poll lagged the trials by over a second, and a
        # CI run killed the server after both first trials had logged their last window)
        exp = client.get_experiment_by_name("eae-qa")
        return exp is not None and any(r.data.metrics for r in client.search_runs([exp.experiment_id]))

    def kill_then_restart():
        while not done.is_set() and not started():
            time.sleep(0.1)
        if done.is_set():
            return
        server.kill()
        outage["down"], killed = time.time() * 1000, time.monotonic()
        # Down until a trial has reported a window since the kill (its metrics were logged while
        # the server was down; a trial that had ended before the kill does not count: a CI run
        # restarted after 2.3 s with none logged), and 12 s have passed; 20 s at most.
        while not done.is_set() and time.monotonic() < killed + 20 and not (
                time.monotonic() > killed + 12 and any(r.get("timestamp", 0) > outage["down"] / 1000
                                                      for r in _tune_results(tmp_path / "tune" / "grid22"))):
            time.sleep(0.1)
        outage["up"] = time.time() * 1000
        server.start()

    client = MlflowClient(server.url)

    with server.outage(kill_then_restart, done, join_s=120):
        summary = run_sweep(space)
    assert "up" in outage, outage
    assert len(summary["trials"]) == 4 and not summary["failed"]
    assert {(t["lr"], t["batch_size"]) for t in summary["trials"]} == {(1e-3, 16), (1e-3, 32), (3e-4, 16), (3e-4, 32)}
    best = summary["best"]
    assert best["dev_em"] == max(t["dev_em"] for t in summary["trials"])

    exp = client.get_experiment_by_name("eae-qa").experiment_id
    parent = client.get_run(summary["parent_run_id"])
    children = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 4  # no trial's run lost to concurrent writers
    logged_down = 0  # metrics logged while the server was down, delivered once it was back
    for child in children:
        assert child.info.status == "FINISHED", child.info
        history = client.get_metric_history(child.info.run_id, "train/loss")
        assert [h.step for h in history] == [10, 20]
        assert [h.step for h in client.get_metric_history(child.info.run_id, "dev/em")] == [10, 20]
        assert "dev/em" in child.data.metrics and child.data.params["finetune.evaluate_test"] == "false"
        logged_down += sum(outage["down"] < h.timestamp < outage["up"]
                           for key in child.data.metrics for h in client.get_metric_history(child.info.run_id, key))
    print(f"server down {(outage['up'] - outage['down']) / 1000:.1f} s; {logged_down} metrics logged meanwhile, all arrived")
    assert logged_down >= 1, outage
    selected = [c for c in children if c.data.tags.get("eae.selected") == "true"]
    assert [c.info.run_id for c in selected] == [best["mlflow_run_id"]]
    assert "test/em" in selected[0].data.metrics  # test evaluated for the selected trial only
    assert sum("test/em" in c.data.metrics for c in children) == 1
    assert parent.data.metrics["test/em"] == summary["test"]["em"] and parent.data.metrics["sweep/trials"] == 4
    assert parent.data.metrics["test/prior_em"] == summary["test"]["prior_em"] == selected[0].data.metrics["test/prior_em"]
    assert parent.data.tags["eae.best_run_id"] == best["mlflow_run_id"]
    # the selected model registered (a new version, no alias moved), linked to its trial's run
    name, number = summary["model_uri"].removeprefix("models:/").split("/")
    assert MlflowClient(server.url).get_model_version(name, number).run_id == best["mlflow_run_id"]
    assert all(c.info.status == "FINISHED" for c in children)


def _listed_trials(out: str) -> list[tuple[str, str]]:
    """(trial, status's first word) of each row of the trials table `eae tune` prints, in order."""
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ") and not line.startswith("| trial |")]
    return [(row[0].strip(), row[-1].split(":")[0].strip()) for row in rows]


def test_failed_trial_is_reported_and_rerun_by_resume_through_optuna(synth_pretrained, tmp_path, capsys):
    """The model and the registered name are given on the first command line only: --resume
    continues with them (it read its command line, and failed "no model to fine-tune")."""
    tmp, _, uri = synth_pretrained
    path = _space(tmp, tmp_path, uri, """
sweep: {{name: crash, search: optuna-grid, max_concurrent: 1, cpus_per_trial: 1, storage_path: "{storage}"}}
finetune: {{data: "synth:{world}", max_steps: 20, log_every: 10, mlflow_uri: "{uri}",
           crash_once_file: "{storage}-crashed"}}
grid: {{lr: [1.0e-3, 3.0e-4]}}
""")
    assert cli.main(["tune", "--space", str(path), "--set", f"finetune.init={tmp / 'model'}",
                     "--register-as", "eae-qa-swept"]) == 0  # one trial fails, the sweep does not
    captured = capsys.readouterr()
    assert "registered:  models:/eae-qa-swept@qa -> version 1 (new alias)" in captured.out
    assert "failed: RuntimeError: crash_once_file" in captured.err
    assert captured.out.count("| FAILED:") == 1 and captured.out.count("| selected |") == 1
    listed = _listed_trials(captured.out)
    assert len(listed) == 2 and listed[0][1] == "FAILED"  # in the order Tune created them (the first failed)
    first = json.loads((tmp_path / "tune" / "crash" / "sweep.json").read_text())
    parent = MlflowClient(uri).get_run(first["parent_run_id"])
    assert parent.data.metrics["sweep/failed"] == 1 and "crash_once_file" in parent.data.tags["eae.failed_trials"]
    # the selected model's test EM beside the prior-only baseline, as `eae finetune qa` prints it
    prior = parent.data.metrics["test/prior_em"]
    assert 0 < prior < 1 and f"prior-only baseline {100 * prior:.1f}, " in captured.out

    assert cli.main(["tune", "--space", str(path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and out.count("| ok |") + out.count("| selected |") == 2
    # the same trials in the same order: Tune restores them newest result first, and they were listed reversed
    assert [trial for trial, _ in _listed_trials(out)] == [trial for trial, _ in listed], (listed, out)
    assert "registered:  models:/eae-qa-swept@qa -> version 2 (moved from version 1)" in out
    parent = MlflowClient(uri).get_run(first["parent_run_id"])  # the same parent run
    assert parent.data.metrics["sweep/failed"] == 0 and parent.data.metrics["sweep/finished"] == 2
    assert cli.main(["tune", "--space", str(path), "--set", f"finetune.init={tmp / 'model'}"]) == 2  # no silent overwrite
    assert "resume it with --resume" in capsys.readouterr().err


def test_resume_continues_with_the_settings_the_sweep_started_with(tmp_path, capsys):
    """sweep.json keeps the sweep's resolved space and what load_space read (the space file's
    sections, the overrides). --resume takes the saved settings: a command line that does not
    repeat the overrides continues the same sweep, one that repeats them too; one that gives
    other values (an override, or the space file edited since) is refused, one eae: error line
    naming every differing key. An older sweep.json resumes, with a note."""
    path = tmp_path / "space.yaml"
    file = f"""
sweep: {{name: saved, max_concurrent: 1, storage_path: "{tmp_path / 'tune'}"}}
finetune: {{data: "synth:{tmp_path / 'world'}", max_steps: 20, mlflow_uri: "sqlite:///{tmp_path / 'mlflow.db'}"}}
grid: {{lr: [1.0e-3, 3.0e-4]}}
"""
    path.write_text(file)
    started = ["finetune.init=models:/eae@pretrained", "finetune.max_steps=30", "grid.batch_size=[16]"]
    save_state(resolved(load_space(path, started)), "parent-run")
    space = resume_space(load_space(path))  # no override repeated
    assert space.finetune["init"] == "models:/eae@pretrained" and space.finetune["max_steps"] == 30
    assert space.grid == {"lr": [1e-3, 3e-4], "batch_size": [16]} and space.sweep.max_concurrent == 1
    assert resume_space(load_space(path, started)).to_dict() == space.to_dict()  # repeated: the same
    assert capsys.readouterr().err == ""
    # a relaunch of another cluster may wait for a node that holds a trial: that setting is the command line's
    assert resume_space(load_space(path, ["sweep.wait_for_resources=true"])).sweep.wait_for_resources
    for overrides, said in (
        (["finetune.max_steps=40", "finetune.init=models:/eae@pretrained", "grid.lr=[1.0e-3]"],
         "finetune.max_steps (started with 30, now 40); grid.lr (started with [0.001, 0.0003], now [0.001]): "),
        (["finetune.init=models:/other@pretrained"], "finetune.init (started with 'models:/eae@pretrained', now "),
    ):
        assert cli.main(["tune", "--space", str(path), "--resume", *(f"--set={o}" for o in overrides)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("eae: error: sweep saved was started with other settings than this command line "
                              "gives: " + said) and err.count("\n") == 1, err
        assert "resume without them (the sweep's saved settings are used)" in err
    path.write_text(file.replace("max_steps: 20", "max_steps: 20, log_every: 5"))  # the file edited since
    with pytest.raises(ValueError, match=r"gives: finetune.log_every \(started with 10, now 5\): "):
        resume_space(load_space(path))
    path.write_text(file)
    # a sweep.json of before the space file was saved: its saved space, overrides checked, a note
    state = tmp_path / "tune" / "saved" / "sweep.json"
    saved = json.loads(state.read_text())
    state.write_text(json.dumps({"parent_run_id": saved["parent_run_id"], "space": saved["space"]}))
    assert resume_space(load_space(path)).to_dict() == space.to_dict()
    assert capsys.readouterr().err.startswith("eae: note: sweep saved was started before eae tune saved its space file")
    with pytest.raises(ValueError, match="finetune.max_steps"):
        resume_space(load_space(path, ["finetune.max_steps=40"]))
    capsys.readouterr()
    state.unlink()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        resume_space(load_space(path))


def test_tune_refuses_what_no_trial_could_run_before_any_trial(synth_pretrained, ray_cluster, tmp_path, capsys):
    """Trials no node can hold (Tune would wait for ever, warning each minute), a missing model
    or data (every trial would fail in turn): each refused at once, nothing left to resume."""
    tmp, _, uri = synth_pretrained
    path = _space(tmp, tmp_path, uri, """
sweep: {{name: fits, max_concurrent: 1, cpus_per_trial: 1, storage_path: "{storage}"}}
finetune: {{init: "{init}", data: "synth:{world}", max_steps: 20, mlflow_uri: "{uri}"}}
grid: {{lr: [1.0e-3, 3.0e-4]}}
""")
    # in processes of their own on the tests' cluster (one node of 2 CPUs): without the check
    # each would wait for ever, and the timeout fails the test instead of hanging it
    jobs = {asked: subprocess.Popen([sys.executable, "-m", "eae_platform.cli", "tune", "--space", str(path), "--set",
                                     override, "--set", f"sweep.name=fits-{name}",
                                     "--address", ray_cluster.get_runtime_context().gcs_address],
                                    cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            for name, override, asked in (("gpu", "sweep.gpus_per_trial=1", "1 CPU and 1 GPU"),
                                          ("cpu", "sweep.cpus_per_trial=3", "3 CPUs and 0 GPUs"))}
    try:
        for asked, job in jobs.items():
            out, _ = job.communicate(timeout=120)
            assert job.returncode == 2, out[-3000:]
            assert f"a trial asks for {asked} on one node" in out and "(its nodes: 2 CPUs and 0 GPUs)" in out, out[-3000:]
    finally:
        for job in jobs.values():
            job.kill()
    assert cli.main(["tune", "--space", str(path), "--set", f"finetune.data=synth:{tmp_path / 'nowhere'}"]) == 2
    assert f"{tmp_path / 'nowhere' / 'questions.jsonl'}: not found" in capsys.readouterr().err
    assert cli.main(["tune", "--space", str(path), "--set", f"finetune.init={tmp_path / 'nowhere'}"]) == 2
    assert "neither an MLflow model URI nor a model directory" in capsys.readouterr().err
    assert not (tmp_path / "tune").exists()  # no sweep begun: no Tune state, no parent run
    assert not MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()],
                                             "attributes.run_name = 'fits'")
    check_trial_fits(SweepConfig(gpus_per_trial=1, wait_for_resources=True))  # where an autoscaler adds the node
    for asked in ({"gpus_per_trial": 1}, {"gpus_per_trial": 2}):  # one of a unit, not '1 CPUs and 1 GPUs'
        with pytest.raises(ValueError) as caught:
            check_trial_fits(SweepConfig(cpus_per_trial=1, **asked))
        assert str(caught.value).startswith(f"a trial asks for 1 CPU and {asked['gpus_per_trial']} "
                                            f"GPU{'s' if asked['gpus_per_trial'] > 1 else ''} on one node"), caught.value


def test_compare_names_a_sweeps_dataset(tmp_path, capsys):
    """A sweep's parent run (eae tune) logs its space, not the trials' eae.dataset tag: its
    dataset cell was empty beside an `eae finetune qa` run's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("sweep"), run_name="synth-grid",
                               tags={"eae.task": "qa-sweep"}).info.run_id
    client.log_param(run_id, "finetune.data", f"synth:{tmp_path / 'world'}")
    client.log_metric(run_id, "dev/em", 0.099)
    assert cli.main(["compare", "synth-grid", "--mlflow-uri", uri]) == 0
    assert "| synth-grid | synth | 9.9 |" in capsys.readouterr().out


def test_compare_of_a_store_that_is_not_there_is_one_line(tmp_path, monkeypatch, capsys):
    """`eae compare RUN --mlflow-uri` naming a SQLite file that is not there made an empty store
    (and its directories) to find nothing in; a dead server took ~8 minutes of MLflow's retries,
    then "MlflowException: API request ... failed" and a traceback file."""
    from tests.conftest import free_port

    missing = tmp_path / "nowhere" / "mlflow.db"
    assert cli.main(["compare", "qa-eae", "--mlflow-uri", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err == (f"eae: error: {missing} does not exist: no MLflow run with id or name "
                                       f"'qa-eae' in sqlite:///{missing}\n")
    assert not (tmp_path / "nowhere").exists()

    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)  # find_runs sets them; monkeypatch puts them back
    dead = f"http://127.0.0.1:{free_port()}"  # a real port nothing listens on (a few seconds of retries)
    assert cli.main(["compare", "qa-eae", "--mlflow-uri", dead]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"eae: error: cannot look up run 'qa-eae': tracking store {dead} unreachable (")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"  # tracking.FAST_FAIL_ENV's retries, not MLflow's 7


def test_compare_prints_the_paper_tables_for_known_runs(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("known")
    runs = {}
    for name, params, tags, metrics in [
        ("eae", {"model.preset": "paper"}, {}, {"dev/entity_accuracy": 0.581, "dev/token_accuracy": 0.452,
                                                 "dev/perplexity": 18.93, "topk/1/entity_accuracy": 0.301,
                                                 "topk/all/entity_accuracy": 0.582, "topk/1/qa_em": 0.1}),
        ("no-eae", {"model.preset": "no_eae"}, {}, {"dev_entity_acc": 0.503, "dev_token_acc": 0.443,
                                                    "dev_ppl": 21.27}),  # as pretraining logs them
        ("qa", {}, {"eae.dataset": "synth"}, {"dev/em": 0.4312, "test/em": 0.3958, "test/prior_em": 0.0521,
                                              "test/oracle": 1.0}),
    ]:
        run_id = client.create_run(exp, run_name=name, tags=tags).info.run_id
        for k, v in params.items():
            client.log_param(run_id, k, v)
        for k, v in metrics.items():
            client.log_metric(run_id, k, 0.0, step=0)  # an older value: compare shows the latest
            client.log_metric(run_id, k, v, step=1)
        runs[name] = run_id
    assert cli.main(["compare", runs["eae"], "no-eae", "qa", "--mlflow-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "| eae | paper | 58.1 | 45.2 | 18.93 |" in out
    assert "| no-eae | no_eae | 50.3 | 44.3 | 21.27 |" in out
    assert "| qa | synth | 43.1 | 39.6 | 5.2 | 100.0 |" in out
    assert "| 1 | 30.1 | – | – | 10.0 |" in out and "| all | 58.2 | – | – | – |" in out
    rows = list(csv.DictReader(io.StringIO(to_csv(find_runs([runs["qa"], runs["eae"]], uri)))))
    assert [r["run_name"] for r in rows] == ["qa", "eae"]
    assert float(rows[0]["test/em"]) == 0.3958 and rows[1]["test/em"] == "" and float(rows[1]["dev/perplexity"]) == 18.93
    assert markdown(find_runs(["qa"], uri)).count("###") == 1  # only the tables with metrics
    assert cli.main(["compare", "no-such-run", "--mlflow-uri", uri]) == 2
    assert "no MLflow run with id or name 'no-such-run'" in capsys.readouterr().err


def test_optuna_tpe_runs_its_trial_budget(synth_pretrained, tmp_path):
    tmp, _, uri = synth_pretrained
    space = load_space(_space(tmp, tmp_path, uri, """
sweep: {{name: tpe, search: optuna-tpe, num_samples: 2, max_concurrent: 2, cpus_per_trial: 1, storage_path: "{storage}"}}
finetune: {{init: "{init}", data: "synth:{world}", max_steps: 10, log_every: 10, mlflow_uri: "{uri}"}}
grid: {{lr: [1.0e-3, 3.0e-4, 1.0e-4], batch_size: [16, 32]}}
"""))
    summary = run_sweep(space)
    assert len(summary["trials"]) == 2 and not summary["failed"]
    assert all(t["lr"] in (1e-3, 3e-4, 1e-4) and t["batch_size"] in (16, 32) for t in summary["trials"])
    assert summary["best"]["dev_em"] == max(t["dev_em"] for t in summary["trials"])
    with pytest.raises(ValueError, match="num_samples"):
        load_space(_space(tmp, tmp_path, uri, "sweep: {{search: optuna-tpe}}\ngrid: {{lr: [1.0e-3]}}\n"))
    with pytest.raises(ValueError, match="grid key 'lrr'"):
        load_space(_space(tmp, tmp_path, uri, "grid: {{lrr: [1.0e-3]}}\n"))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        load_space(_space(tmp, tmp_path, uri, "grid: {{batch_size: [16, 0]}}\n"))


def test_qa_em_is_broken_down_by_what_pretraining_read_beside_the_prior(synth_pretrained):
    """QATask.breakdown on hand-set correctness: EM per group (stated / unstated) and the
    prior-only baseline (always the relation's most frequent training answer)."""
    import collections

    tmp, _, _ = synth_pretrained
    config = load_finetune_config(None, [], init=str(tmp / "model"), data=f"synth:{tmp / 'world'}")
    task = QATask(config, resolve_init(config.init).vocab_dir, 128)
    test = task.examples["test"]
    rows = [{"correct": i % 3 == 0} for i in range(len(test))]  # every third answered right
    stated = lambda subject_id: subject_id % 2 == 0  # noqa: E731 - a hand-made split
    m = task.breakdown("test", rows, stated)
    groups = collections.defaultdict(list)
    for ex, r in zip(test, rows):
        groups["stated" if ex.meta["subject_id"] % 2 == 0 else "unstated"].append(r["correct"])
    for g, hits in groups.items():
        assert m[f"test/questions_{g}"] == len(hits) and m[f"test/em_{g}"] == sum(hits) / len(hits)
    top = collections.defaultdict(collections.Counter)
    for ex in task.examples["train"]:
        top[ex.meta["relation"]][ex.answers[0]] += 1
    prior_hits = [top[ex.meta["relation"]].most_common(1)[0][0] in ex.answers for ex in test]
    assert m["test/prior_em"] == sum(prior_hits) / len(test)
    # questions naming no relation (fanoutqa, TriviaQA): the most frequent training answer overall
    for ex in task.examples["train"] + test:
        ex.meta.pop("relation")
    overall = collections.Counter(ex.answers[0] for ex in task.examples["train"]).most_common(1)[0][0]
    m = task.breakdown("test", rows)
    assert m["test/prior_em"] == sum(overall in ex.answers for ex in test) / len(test) > 0


def test_qa_memory_off_em_equals_the_model_with_its_memory_output_zeroed(synth_pretrained):
    """finetune.memory_off_eval: the test EM it logs is the EM of the same model with W_b
    zeroed, it differs from the model's own predictions, and the model gets its memory back."""
    from eae_model.checkpoint import load_model
    from eae_platform.evaluate.probes import stated_subjects
    from eae_platform.finetune.qa import memory_off_em

    tmp, _, _ = synth_pretrained
    config = load_finetune_config(None, [], init=str(tmp / "model"), data=f"synth:{tmp / 'world'}")
    init, cpu = resolve_init(config.init), torch.device("cpu")
    model = load_init_model(init, cpu)
    task = QATask(config, init.vocab_dir, model.config.max_length)
    own, own_rows = task.evaluate(model, "test", cpu)
    stated = stated_subjects(str(tmp / "data"))
    off, off_rows = memory_off_em(model, task, cpu, stated, config.init)

    zeroed = load_model(init.model_dir)
    with torch.no_grad():
        zeroed.entity_memory.project_value.weight.zero_()
    reference, reference_rows = task.evaluate(zeroed, "test", cpu)
    assert [r["top_k"] for r in off_rows] == [r["top_k"] for r in reference_rows]
    assert off["test/em_memory_off"] == reference["em"]
    groups = task.breakdown("test", reference_rows, stated)
    assert off["test/em_stated_memory_off"] == groups["test/em_stated"]
    assert off["test/em_unstated_memory_off"] == groups["test/em_unstated"]
    assert [r["top_k"] for r in reference_rows] != [r["top_k"] for r in own_rows]  # the memory reaches the scores
    again, _ = task.evaluate(model, "test", cpu)  # the hook is gone
    assert again["em"] == own["em"]


def test_a_stopped_sweep_ends_its_runs_killed(synth_pretrained, ray_cluster, tmp_path):
    """`eae tune` stopped while its trials train, by Ctrl-C (SIGINT) and, in a second sweep
    beside it, by `ray job stop`/kill (SIGTERM, which the sweep hands to Tune as a Ctrl-C): each
    sweep's MLflow run and every trial run it started end KILLED, none stays RUNNING; its log
    has a line per trial event and none of Tune's status tables. (Side by side: one sweep's
    start-up, most of its time, overlaps the other's.)"""
    tmp, _, _ = synth_pretrained

    def start(name):
        (tmp_path / name).mkdir()
        uri = f"sqlite:///{tmp_path / name / 'mlflow.db'}"
        space = _space(tmp, tmp_path / name, uri, """
sweep: {{name: stopped, max_concurrent: 2, cpus_per_trial: 0.5, storage_path: "{storage}"}}
finetune: {{init: "{init}", data: "synth:{world}", max_steps: 100000, log_every: 5, mlflow_uri: "{uri}"}}
grid: {{lr: [1.0e-3, 3.0e-4]}}
""")
        # the store's tables made before the sweep starts: this test's polling client and the sweep
        # creating them at once in a new SQLite file collided ("table ... already exists", CI)
        MlflowClient(uri).search_experiments()
        job = subprocess.Popen([sys.executable, "-m", "eae_platform.cli", "tune", "--space", str(space),
                                "--address", ray_cluster.get_runtime_context().gcs_address],
                               cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        return job, uri

    def trial_runs(uri):
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("eae-qa")
        if exp is None:
            return []
        return [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]

    sweeps = {signal.SIGINT: start("ctrl-c"), signal.SIGTERM: start("sigterm")}
    deadline = time.time() + 300
    waiting = dict(sweeps)
    while waiting:  # each sweep gets its signal once a trial has logged a training loss
        for sig, (job, uri) in list(waiting.items()):
            assert job.poll() is None, job.communicate()[0][-3000:]
            if any("train/loss" in r.data.metrics for r in trial_runs(uri)):
                job.send_signal(sig)
                del waiting[sig]
        assert time.time() < deadline, f"no trial logged a training loss in {sorted(map(str, waiting))}"
        time.sleep(1)
    for sig, (job, uri) in sweeps.items():
        out, _ = job.communicate(timeout=180)
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("eae-qa").experiment_id])
        (parent,) = [r for r in runs if r.data.tags.get("eae.task") == "qa-sweep"]
        trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert parent.info.run_name == "stopped" and parent.info.status == "KILLED", (sig, out[-3000:])
        assert trials and all(r.info.status == "KILLED" for r in trials), [(r.info.run_name, r.info.status) for r in trials]
        assert job.returncode != 0
        # the log: a line per trial event, not Tune's status tables (those come with --verbose)
        assert ": started" in out and "Trial status" not in out and "Configuration for experiment" not in out, out[-3000:]


def test_a_qa_run_is_named_after_its_out_directory_unless_named():
    from eae_platform.finetune.qa import run_name

    assert run_name(load_finetune_config(None, [], out="runs/qa/eae"), "synth") == "qa-eae"
    assert run_name(load_finetune_config(None, [], out="runs/qa/no_eae/"), "synth") == "qa-no_eae"
    assert run_name(load_finetune_config(None, ["finetune.run_name=mine"], out="runs/qa/eae"), "synth") == "mine"
    assert run_name(load_finetune_config(None, []), "fanoutqa") == "qa-fanoutqa"


def test_grad_clip_zero_is_no_clipping_as_in_pretraining():
    """torch's clip_grad_norm_ with max_norm 0 zeroes every gradient: `finetune.grad_clip=0`
    trained nothing, silently. 0 (or below) is no clipping, as pretraining reads it."""
    layer = torch.nn.Linear(3, 1)
    layer(torch.ones(2, 3)).sum().mul(100).backward()
    before = [p.grad.clone() for p in layer.parameters()]
    clip_gradients(layer, 0.0)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, layer.parameters()))
    clip_gradients(layer, 1.0)  # the norm (~350) is clipped to 1
    assert abs(float(torch.cat([p.grad.flatten() for p in layer.parameters()]).norm()) - 1.0) < 1e-3


def test_qa_data_with_no_training_question_says_so_not_that_none_resolves(tmp_path):
    """An empty questions.jsonl, or a file whose every record is skipped, was reported as "no
    training question ... resolves to an entity of the model's vocabulary": a vocabulary
    mismatch, when there was no question to resolve."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    vocab = tmp_path / "vocab"
    vocab.mkdir()
    pq.write_table(pa.table({"entity_id": [0, 1], "title": ["Paris", "Lyon"], "count": [1, 1]}), vocab / "entities.parquet")
    (tmp_path / "world").mkdir()
    (tmp_path / "world" / "questions.jsonl").write_text("")
    config = load_finetune_config(None, [], data=f"synth:{tmp_path / 'world'}")
    with pytest.raises(ValueError, match="holds no training question$"):
        QATask(config, vocab, 128)
    (tmp_path / "wq.json").write_text(json.dumps([{"utterance": "where?", "targetValue": "(list)"}, {"url": "x"}]))
    config = load_finetune_config(None, [], data=f"webquestions:{tmp_path / 'wq.json'},{tmp_path / 'wq.json'}")
    with pytest.raises(ValueError, match=r"holds no training question \(4 records skipped: "):
        QATask(config, vocab, 128)


def test_a_space_or_config_file_that_is_not_yaml_is_named_in_the_error(tmp_path):
    """`eae tune --space` and `eae finetune qa --config` on a file YAML cannot read said where it
    broke only as "<unicode string>", line 3: not which file (the space, the config or a --set)."""
    import yaml

    space = tmp_path / "space.yaml"
    space.write_text("sweep:\n  name: x\n  max_concurrent: [2\n")
    with pytest.raises(yaml.YAMLError, match=f'in "{space}", line 3'):
        load_space(space)
    config = tmp_path / "qa.yaml"
    config.write_text("finetune:\n  lr: [3\n")
    with pytest.raises(yaml.YAMLError, match=f'in "{config}", line 2'):
        load_finetune_config(config)


def test_a_tie_on_dev_em_selects_the_first_created_trial():
    """`_select` lists the trials in the order Tune created them (the grid's; Optuna's suggestions
    in turn) whatever order Tune returns them in (a restored sweep's come newest first), and a tie
    goes to the first of them. Not the lowest trial id: Optuna's ids are random."""
    from eae_platform.finetune.sweep import best_trial

    grid = [{"trial": "db6ca_00000", "dev_em": 0.132}, {"trial": "db6ca_00001", "dev_em": 0.1},
            {"trial": "db6ca_00002", "dev_em": 0.132}, {"trial": "db6ca_00003", "dev_em": 0.132}]
    assert best_trial(grid)["trial"] == "db6ca_00000"
    assert best_trial(grid[1:])["trial"] == "db6ca_00002"
    optuna = [{"trial": "e81900a8", "dev_em": 0.05}, {"trial": "f0c1d2e3", "dev_em": 0.132},
              {"trial": "8f768299", "dev_em": 0.132}]
    assert best_trial(optuna)["trial"] == "f0c1d2e3"
