"""eae finetune qa through a tracking server outage: a registration queued while the server was
away and made when the run closed is printed (eae tune's too); what the run could not log at all
is said, with its journal (eae eval's too)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from eae_platform import cli
from eae_platform.finetune.config import FinetuneConfig
from eae_platform.finetune.qa import register_qa_model, registered_at_close
from eae_platform.tracking import Tracker, read_unsent, replay_unsent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from eae_model.checkpoint import save_model
    from eae_model.config import load_config
    from eae_model.model import EaEModel

    return save_model(EaEModel(load_config("tiny")), tmp_path_factory.mktemp("tiny") / "tiny-model")


@pytest.mark.parametrize("register_as", [None, "eae-queued"])
def test_a_registration_queued_during_an_outage_and_made_at_close_is_reported(
        server, model_dir, tmp_path, monkeypatch, register_as):
    monkeypatch.chdir(tmp_path)  # the tracker's unsent journal
    config = FinetuneConfig(register_as=register_as)
    tracker = Tracker("qa-queued", uri=server.url, retry_interval_s=3600.0, close_wait_s=60.0)
    server.kill()
    tracker.log_metrics({"train/loss": 1.0}, step=1)  # finds the server away: no retry for an hour
    server.start()
    registered = register_qa_model(tracker, config, model_dir, step=1)
    assert registered["model_uri"] is None  # queued
    assert tracker.close().ok
    summary = {**registered, **registered_at_close(tracker, registered)}
    client = MlflowClient(server.url)
    name = register_as or "eae-qa"
    version = max(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    if register_as:
        assert summary["model_uri"] == f"models:/{name}@qa"
        assert summary["alias_version"] == str(version) == client.get_model_version_by_alias(name, "qa").version
    else:
        assert summary["model_uri"] == f"models:/{name}/{version}"


def test_what_a_qa_run_could_not_log_is_said_with_its_journal(synth_pretrained, server, tmp_path):
    """The tracking server dies mid-run and stays down: eae finetune qa trains to the end (exit
    0) and says on stderr what MLflow did not get and which journal holds it. The tracker said so
    only inside the Ray task, whose output the command does not show: the command said nothing."""
    tmp, _, _ = synth_pretrained
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.url, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eae_platform.cli", "finetune", "qa", "--init", str(tmp / "model"),
         "--data", f"synth:{tmp / 'world'}", "--max-steps", "60", "--batch-size", "8",
         "--set", "finetune.log_every=10", "--set", "finetune.run_name=qa-outage"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith("step 10/"):
                server.kill()  # and it stays down: close() gives up after its 10 s
                break
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.start()
    assert proc.returncode == 0, err[-3000:]
    journals = list(tmp_path.glob("mlflow-unsent-*.jsonl"))
    assert len(journals) == 1
    said = [line for line in err.splitlines() if line.startswith("eae: MLflow run ")]
    assert len(said) == 1 and "NOT logged" in said[0] and f"written to {journals[0]}" in said[0], err[-3000:]


def test_what_an_evaluation_could_not_log_is_said_with_its_journal(synth_pretrained, server, capsys):
    """The tracking server dies while eae eval typing trains its classifier, and stays down until
    the evaluation is over: it ends (exit 0) and says on stderr, as eae finetune qa does, what
    MLflow did not get and which journal holds it; the journal sends it once the server is back.
    It said nothing: the tracker's own line stayed in the Ray task, whose output is not shown."""
    tmp, _, _ = synth_pretrained
    name, client, done = "typing-outage", MlflowClient(server.url), threading.Event()

    def kill_once_the_run_is_open():  # its config logged: its metrics and its end are to come
        # Not as soon as the run is listed: the Tracker, having created it, still searches for a
        # duplicate (Tracker's create_request), and a kill then stops eae eval at its start (exit 1)
        while not done.is_set():
            experiment = client.get_experiment_by_name("eae-eval")
            runs = experiment and client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
            if runs and runs[0].data.params:
                server.kill()
                return
            time.sleep(0.1)

    with server.outage(kill_once_the_run_is_open, done, join_s=60):  # started again after the block
        assert cli.main(["eval", "typing", "--model", str(tmp / "model"), "--data", f"synth:{tmp / 'world'},{tmp / 'data'}",
                         "--set", f"eval.mlflow_uri={server.url}", "--set", f"eval.run_name={name}",
                         "--set", "eval.steps=200", "--set", "eval.batch_size=16", "--set", "eval.max_examples=300"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("eae: MLflow run ")]
    assert len(said) == 1 and "NOT logged" in said[0] and "the final status FINISHED" in said[0], err[-3000:]
    journal = Path(said[0].partition("; written to ")[2].partition(" (send later")[0])
    _, records = read_unsent(journal)
    assert any(r.get("key") == "test/micro_f1" for r in records), records
    run_id = said[0].removeprefix("eae: MLflow run ").partition(" ")[0]
    assert replay_unsent(journal).ok and not journal.exists()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "test/micro_f1" in run.data.metrics
