"""A fine-tuned model whose registration was queued (the tracking server was away when training
ended) and made when the run closed: eae finetune qa and eae tune print where it went."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from eae_platform.finetune.config import FinetuneConfig
from eae_platform.finetune.qa import register_qa_model, registered_at_close
from eae_platform.tracking import Tracker


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
