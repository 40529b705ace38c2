"""The MLflow layer (eae_platform.tracking) against the embedded SQLite store and a real
`mlflow server` on PostgreSQL, including the server dying mid-run.

The server tests need PostgreSQL on 127.0.0.1:5432 (trust auth, as on these machines); each
module run creates its own database and drops it at the end. The server runs on a free port
and is started and stopped by its process group id only."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import unittest.mock
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import mlflow
from mlflow.tracking import MlflowClient

from eae_platform import tracking
from tests.conftest import free_port
from eae_platform.tracking import (
    PARAM_TRUNCATED,
    Tracker,
    download_model_dir,
    load_pyfunc,
    replay_unsent,
)

MODEL_FILES = ("model.safetensors", "config.json")


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_mlflow_env():
    """Tracker sets MLflow's HTTP retry variables with setdefault: keep them out of other tests."""
    keys = [*tracking.FAST_FAIL_ENV, "MLFLOW_TRACKING_URI"]
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from eae_model.checkpoint import save_model
    from eae_model.config import load_config
    from eae_model.model import EaEModel

    return save_model(EaEModel(load_config("tiny")), tmp_path_factory.mktemp("tiny") / "tiny-model")


@pytest.fixture
def embedded(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


# --- helpers ---------------------------------------------------------------------------------


def _config():
    from eae_model.config import load_config

    return {
        "model": load_config("tiny"),
        "train": {"lr": 1e-4, "batch_size": 32, "heads": ["mlm", "el"], "resume": None, "notes": "n" * 7000},
        "data": {"shards": Path("/data/eae/shards"), "dev": {"fraction": 0.002}},
    }


def _same_files(a: Path, b: Path) -> None:
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for name in MODEL_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _exercise_run(model_dir: Path, tmp: Path, experiment: str, model_name: str) -> None:
    """The whole life of a run against the store that tracking_uri() names."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    import torch

    uri = tracking.tracking_uri()
    config = _config()
    with Tracker(experiment, run_name="pretrain-tiny", tags={"preset": "tiny"}) as tr:
        assert tr.uri == uri
        params = tr.log_config(config)
        for step in range(5):
            losses = {"total": 4.0 - step, "mlm": 3.0 - step, "el_memory": 2.0, "el_pred": torch.tensor(1.5)}
            tr.log_train_step(step, losses=losses, step_time_s=0.5, tokens=4096)
        tr.log_dev(4, entity_accuracy=0.25, token_accuracy=0.4, perplexity=12.5)
        ckpt = tr.log_checkpoint(model_dir, step=4)
        model_uri = tr.register_model(model_dir, model_name, alias="champion", step=4)
        with pytest.raises(TypeError):
            tr.log_metrics({"train/loss": "low"}, step=5)
        with pytest.raises(TypeError):
            tr.log_metrics({"train/loss": 1.0}, step=5.0)
        with pytest.raises(ValueError):
            tr.register_model(model_dir, model_name, alias="latest")  # reserved by MLflow
        run_id = tr.run_id
    report = tr.close()  # already closed by the with block: the same report
    assert report.ok and report.unsent_path is None, str(report)
    assert model_uri == f"models:/{model_name}@champion"

    client = MlflowClient(uri, registry_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "pretrain-tiny"
    assert run.data.tags["preset"] == "tiny"
    # params: the flattened config, whole except the truncated long value
    assert run.data.params == params
    assert params["model.hidden_size"] == "64" and params["model.preset"] == "tiny"
    assert params["train.lr"] == "0.0001" and params["train.resume"] == "null"
    assert params["train.heads"] == '["mlm", "el"]'
    assert params["data.shards"] == "/data/eae/shards" and params["data.dev.fraction"] == "0.002"
    assert len(params["train.notes"]) == MAX_PARAM_VAL_LENGTH and params["train.notes"].endswith(PARAM_TRUNCATED)
    # config.json: the whole config
    saved = json.loads(Path(client.download_artifacts(run_id, "config.json", str(tmp))).read_text())
    assert saved["train"]["notes"] == "n" * 7000 and saved["model"]["hidden_size"] == 64
    assert saved["data"] == {"shards": "/data/eae/shards", "dev": {"fraction": 0.002}}
    # metrics with their steps
    assert _history(client, run_id, "train/loss") == [(s, 4.0 - s) for s in range(5)]
    assert _history(client, run_id, "train/loss_mlm") == [(s, 3.0 - s) for s in range(5)]
    assert _history(client, run_id, "train/loss_el_pred") == [(s, 1.5) for s in range(5)]
    assert _history(client, run_id, "train/tokens_per_s") == [(s, 8192.0) for s in range(5)]
    assert _history(client, run_id, "train/step_time_s") == [(s, 0.5) for s in range(5)]
    assert _history(client, run_id, "dev/entity_accuracy") == [(4, 0.25)]
    assert _history(client, run_id, "dev/perplexity") == [(4, 12.5)]
    # the checkpoint, as artifacts
    _same_files(model_dir, Path(client.download_artifacts(run_id, ckpt, str(tmp / "ckpt"))))
    # the registered model behind the alias
    version = client.get_model_version_by_alias(model_name, "champion")
    assert str(version.version) == "1" and version.run_id == run_id
    # the logged model is the run's experiment's, not MLflow's Default experiment's
    (output,) = client.get_run(run_id).outputs.model_outputs
    assert client.get_logged_model(output.model_id).experiment_id == run.info.experiment_id
    _same_files(model_dir, download_model_dir(model_uri, tmp / "downloaded"))
    # no destination: the machine's model cache, one copy a version (each trial and each `eae
    # eval` downloaded into a temporary directory of its own, never removed)
    cache = tmp / "model-cache"
    with unittest.mock.patch.dict(os.environ, {tracking.MODEL_CACHE_ENV: str(cache)}):
        cached = download_model_dir(model_uri)
        _same_files(model_dir, cached)
        assert cached.is_relative_to(cache) and download_model_dir(model_uri) == cached
        assert len(list(cache.iterdir())) == 1, list(cache.iterdir())  # one entry, no partial download left
    loaded = mlflow.pyfunc.load_model(model_uri)  # MLflow's own resolution of the URI
    wrapper = loaded.unwrap_python_model()
    _same_files(model_dir, wrapper.model_dir)
    assert wrapper.engine.model.config.preset == "tiny"
    model = load_pyfunc(model_uri, dst_path=tmp / "pyfunc")
    texts = ["Paris is the capital of France.", "Berlin"]
    out = model.predict(texts)  # /v1/link's answers (tests/eae_platform/test_serving_engine.py)
    assert [o["text"] for o in out] == texts
    for text, answer in zip(texts, out):
        for m in answer["mentions"]:  # a random tiny model: whatever it detects must be well-formed
            assert text[m["start"] : m["end"]] == m["text"] and 0 <= m["entity_id"] < 512
    assert len(model.predict({"text": "Paris"})) == 1 and len(model.predict("Paris")) == 1

    # resume the run by id: metrics append to it, the same config is fine, a changed one is not
    with Tracker(experiment, run_id=run_id) as again:
        assert again.run_id == run_id
        again.log_config(config)
        with pytest.raises(ValueError, match="immutable"):
            again.log_config({**config, "train": {**config["train"], "lr": 3e-4}})
        again.log_metrics({"train/loss": -1.0}, step=5)
        assert client.get_run(run_id).info.status == "RUNNING"
        assert again.register_model(model_dir, model_name, alias="champion", step=5) == model_uri
    assert again.close().ok
    assert _history(client, run_id, "train/loss") == [*[(s, 4.0 - s) for s in range(5)], (5, -1.0)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert str(client.get_model_version_by_alias(model_name, "champion").version) == "2"
    assert not list(Path.cwd().glob("mlflow-unsent-*")), "nothing may be left unsent"


# --- tests -----------------------------------------------------------------------------------


def test_tracking_uri_from_env_else_sqlite_in_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert tracking.tracking_uri() == "http://127.0.0.1:1"
    # a relative SQLite store, given or from the environment, made absolute: Ray's workers and
    # tasks run in other directories, where it would name another, empty store
    assert tracking.tracking_uri("sqlite:///runs/m.db") == f"sqlite:///{tmp_path / 'runs' / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///m.db")
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'm.db'}"
    assert tracking.tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"


def test_the_model_cache_is_the_users_own_unless_eae_model_cache_says(tmp_path, monkeypatch):
    # entries are made readable by their owner only: a cache in the machine's temporary
    # directory, shared by its users, refused the second user's downloads
    monkeypatch.delenv(tracking.MODEL_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tracking.model_cache_dir() == tmp_path / "xdg" / "eae" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tracking.model_cache_dir() == tmp_path / "home" / ".cache" / "eae" / "models"
    monkeypatch.setenv(tracking.MODEL_CACHE_ENV, str(tmp_path / "mine"))
    assert tracking.model_cache_dir() == tmp_path / "mine"


def test_mlflow_s_ui_binds_to_loopback_unless_told_otherwise():
    """The project starts no MLflow server; it prints and documents `mlflow ui` command lines
    (after a run, README.md). Those bind MLflow's default host, 127.0.0.1 (this machine only),
    or name it: none exposes the UI, which has no authentication, to the network."""
    import re

    import click
    from mlflow.utils import cli_args

    # `mlflow server`'s --host (`mlflow ui` is another name of it); not read from mlflow.cli,
    # whose import alone takes ~5 s
    assert click.command()(cli_args.HOST(lambda host: None)).params[0].default == "127.0.0.1"
    repo = Path(__file__).resolve().parents[2]
    files = [repo / "README.md", *(repo / "docs").glob("*.md"), *(repo / "platform").rglob("*.py"),
             *(repo / "experiments").rglob("*.py"), *(p for p in (repo / "scripts").rglob("*") if p.is_file())]
    commands = [(f, c) for f in files for c in re.findall(r"mlflow (?:ui|server)\b[^\n`'\"]*", f.read_text(errors="replace"))]
    assert commands, "the commands the project prints (eae pretrain's summary)"
    for f, command in commands:
        assert re.findall(r"--host[ =](\S+)", command) in ([], ["127.0.0.1"]), f"{f}: {command}"


def test_flatten_config():
    flat = tracking.flatten_config({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": "x", "f": True, "g": {}})
    assert flat == {"a.b": "1", "a.c.d": "[1, 2]", "e": "x", "f": "true", "g": "{}"}


def test_embedded_sqlite_store(embedded, model_dir):
    _exercise_run(model_dir, embedded, "eae-embedded", "eae-embedded-model")
    assert (embedded / "mlflow.db").is_file() and not (embedded / "mlruns").exists()  # artifacts by the store


def test_server_on_postgres(server, model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    _exercise_run(model_dir, tmp_path, "eae-server", "eae-server-model")


def test_server_dies_mid_run(server, model_dir, tmp_path, monkeypatch, capsys):
    """A: the server is killed, training logs on (fast), the server comes back, everything
    arrives. B: the server stays dead until close: the unsent file holds exactly what is
    missing, and replaying it later completes the run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    client = MlflowClient(server.url, registry_uri=server.url)
    a = Tracker("eae-outage", run_name="a", spool_dir=tmp_path / "a", retry_interval_s=5.0)
    b = Tracker("eae-outage", run_name="b", spool_dir=tmp_path / "b", retry_interval_s=5.0)
    for t in (a, b):
        t.log_config({"model": {"hidden_size": 64}, "train": {"lr": 1e-4}})
        for step in range(5):
            t.log_metrics({"train/loss": 10.0 - step, "train/tokens_per_s": 1000.0 + step}, step)
    assert a.reachable and b.reachable

    server.kill()
    t0 = time.monotonic()
    a.log_metrics({"train/loss": 5.0, "train/tokens_per_s": 1005.0}, step=5)  # finds the server dead
    t_dead = time.monotonic()
    first_call = t_dead - t0
    assert first_call < 8.0, f"a log call with a dead server took {first_call:.1f} s"
    assert not a.reachable
    t0 = time.monotonic()
    for step in range(6, 20):
        a.log_metrics({"train/loss": 10.0 - step, "train/tokens_per_s": 1000.0 + step}, step)
    later_calls = (time.monotonic() - t0) / 14
    assert later_calls < 0.2, f"log calls while the server is known dead took {later_calls:.2f} s each"
    assert a.pending["metrics"] == 30
    # a checkpoint logged during the outage is staged: the trainer may delete its own copy
    ckpt = tmp_path / "ckpt-7"
    ckpt.mkdir()
    for name in MODEL_FILES:
        (ckpt / name).write_bytes((model_dir / name).read_bytes())
    a.log_checkpoint(ckpt, step=7)
    for name in MODEL_FILES:
        (ckpt / name).unlink()
    ckpt.rmdir()
    assert a.unsent_path.is_file()  # journal of what is queued, in case the trainer crashes

    # B: logs during the outage, registers its model, closes before the server is back
    for step in range(5, 12):
        b.log_metrics({"train/loss": 10.0 - step, "dev/perplexity": 50.0 - step}, step)
    b.register_model(model_dir, "eae-outage-model", alias="champion")
    t0 = time.monotonic()
    report_b = b.close(wait_s=0.0)
    assert time.monotonic() - t0 < 15.0
    assert not report_b.ok and report_b.status_unsent
    assert report_b.unsent_metrics == 14 and report_b.unsent_models == ["eae-outage-model@champion"]
    assert report_b.unsent_path == b.unsent_path and b.unsent_path.is_file()
    header, records = tracking.read_unsent(b.unsent_path)
    assert header["run_id"] == b.run_id and header["uri"] == server.url
    metrics = sorted((r["key"], r["step"], r["value"]) for r in records if r["type"] == "metric")
    expected = sorted(
        [("train/loss", s, 10.0 - s) for s in range(5, 12)] + [("dev/perplexity", s, 50.0 - s) for s in range(5, 12)]
    )
    assert metrics == expected
    assert [r["type"] for r in records if r["type"] != "metric"] == ["register_model", "end_run"]
    staged_model = Path(next(r["model_dir"] for r in records if r["type"] == "register_model"))
    assert staged_model.is_relative_to(tmp_path / "b") and (staged_model / "model.safetensors").is_file()

    # the server comes back on the same port and database
    server.start()
    time.sleep(max(0.0, 5.0 - (time.monotonic() - t_dead)))  # A's retry interval
    for step in range(20, 25):
        a.log_metrics({"train/loss": 10.0 - step, "train/tokens_per_s": 1000.0 + step}, step)
    assert a.reachable and not any(a.pending.values())
    report_a = a.close()
    assert report_a.ok, str(report_a)
    assert _history(client, a.run_id, "train/loss") == [(s, 10.0 - s) for s in range(25)]
    assert len(client.get_metric_history(a.run_id, "train/tokens_per_s")) == 25
    downloaded = client.download_artifacts(a.run_id, "checkpoints/step-00000007", str(tmp_path / "dl"))
    _same_files(model_dir, Path(downloaded))
    assert client.get_run(a.run_id).info.status == "FINISHED"
    assert not a.unsent_path.exists() and not (tmp_path / "a" / f"mlflow-unsent-{a.run_id}").exists()

    # B's file, sent later: the run completes, the model is registered
    report_replay = replay_unsent(b.unsent_path)
    assert report_replay.ok, str(report_replay)
    assert not b.unsent_path.exists()
    assert _history(client, b.run_id, "train/loss") == [(s, 10.0 - s) for s in range(12)]
    assert _history(client, b.run_id, "dev/perplexity") == [(s, 50.0 - s) for s in range(5, 12)]
    assert client.get_run(b.run_id).info.status == "FINISHED"
    assert client.get_model_version_by_alias("eae-outage-model", "champion").run_id == b.run_id
    _same_files(model_dir, download_model_dir("models:/eae-outage-model@champion", tmp_path / "b-model"))

    err = capsys.readouterr().err
    for run_id in (a.run_id, b.run_id):
        down = [line for line in err.splitlines() if "MLflow unreachable at" in line and run_id in line]
        assert len(down) == 1, err  # said once per outage, not per call
        assert "queued, training continues" in down[0]
    assert sum("MLflow reachable again" in line and a.run_id in line for line in err.splitlines()) == 1
    unsent = "NOT logged: 14 metrics, 1 model registrations, the final status FINISHED"
    assert f"run {b.run_id} at {server.url}: {unsent}" in err


def test_a_new_run_waits_open_wait_s_for_a_restarting_server(server, tmp_path):
    """open_wait_s (a sweep's trials): creating a run while the server is down keeps trying, and
    the run is created on the server once it is back; without it, TrackingUnavailable at once."""
    server.kill()
    restart = threading.Timer(3.0, server.start)
    try:
        with pytest.raises(tracking.TrackingUnavailable, match="unreachable"):
            Tracker("eae-restarting", uri=server.url, spool_dir=tmp_path)
        t0 = time.monotonic()
        restart.start()
        tr = Tracker("eae-restarting", uri=server.url, spool_dir=tmp_path, open_wait_s=120.0)
        waited = time.monotonic() - t0
    finally:
        restart.cancel()  # a failure before the restart: no second server started after this one
        if restart.ident is not None:
            restart.join()
        if server.proc is None:
            server.start()
    assert waited >= 3.0
    tr.log_metrics({"train/loss": 1.0}, step=1)
    assert tr.close().ok
    assert MlflowClient(server.url).get_run(tr.run_id).info.status == "FINISHED"


class _LosesAnAnswer(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the real server: the first create_run it forwards is carried out by
    the server, and its answer lost (the connection closed, as by a server killed mid-request)."""

    upstream: str = ""
    lost: list = []

    def _forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = urllib.request.Request(self.upstream + self.path, data=body if self.command == "POST" else None,
                                         method=self.command, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                status, answer = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, answer = e.code, e.read()
        if self.path.endswith("/runs/create") and not self.lost:
            self.lost.append(json.loads(body))
            self.close_connection = True  # no answer: the client sees the connection dropped
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = do_PATCH = do_DELETE = _forward

    def log_message(self, *args):
        pass


def test_a_run_whose_creation_answer_was_lost_is_created_once(server, tmp_path):
    """create_run is not idempotent: its answer lost after the server created the run, MLflow's
    HTTP retry sends it again. The tracker still makes one run (a sweep through a server restart
    had made a fifth trial run of four)."""
    handler = type("Proxy", (_LosesAnAnswer,), {"upstream": server.url, "lost": []})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        tr = Tracker("eae-lost-answer", run_name="once", uri=f"http://127.0.0.1:{proxy.server_port}", spool_dir=tmp_path)
        tr.log_metrics({"train/loss": 1.0}, step=1)
        assert tr.close().ok
    finally:
        proxy.shutdown()
    assert len(handler.lost) == 1  # the server did create a run whose answer never came
    client = MlflowClient(server.url)
    runs = client.search_runs([client.get_experiment_by_name("eae-lost-answer").experiment_id])
    assert [(r.info.run_id, r.info.run_name, r.info.status) for r in runs] == [(tr.run_id, "once", "FINISHED")]
    assert client.get_metric_history(tr.run_id, "train/loss")[0].value == 1.0


def test_store_unreachable_from_the_start(tmp_path, capsys):
    """No store at all: a new run cannot be created (TrackingUnavailable, before training
    starts); a resumed run goes on offline and its close writes everything to the unsent file."""
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(tracking.TrackingUnavailable, match="unreachable"):
        Tracker("eae-nowhere", uri=dead, spool_dir=tmp_path)
    assert time.monotonic() - t0 < 10.0
    tr = Tracker("eae-nowhere", uri=dead, run_id="0123456789abcdef", spool_dir=tmp_path, retry_interval_s=60.0)
    assert not tr.reachable
    tr.log_config({"train": {"lr": 0.1}})
    t0 = time.monotonic()
    for step in range(100):
        tr.log_metrics({"train/loss": 1.0 / (step + 1)}, step)
    assert time.monotonic() - t0 < 2.0
    report = tr.close(wait_s=0.0)
    assert not report.ok and report.unsent_metrics == 100 and report.unsent_params == 1
    assert json.loads(json.dumps(report.to_dict()))["unsent_path"] == str(tr.unsent_path)
    assert report.unsent_artifacts == ["."] and report.status_unsent  # config.json, the end of the run
    _, records = tracking.read_unsent(report.unsent_path)
    assert [r["step"] for r in records if r["type"] == "metric"] == list(range(100))
    staged = Path(next(r["local_path"] for r in records if r["type"] == "artifacts"))
    assert json.loads(staged.read_text()) == {"train": {"lr": 0.1}}
    assert "MLflow unreachable at" in capsys.readouterr().err


def test_refused_items_are_reported_not_retried(embedded):
    """The store answers but refuses (the run was deleted meanwhile): nothing raises into
    training, and close reports what was refused."""
    tr = Tracker("eae-refused")
    tr.log_metrics({"train/loss": 1.0}, step=0)
    MlflowClient(tr.uri).delete_run(tr.run_id)
    tr.log_metrics({"train/loss": 0.5}, step=1)
    assert tr.reachable and not any(tr.pending.values())
    report = tr.close()
    assert not report.ok and any("train/loss=0.5 at step 1" in r for r in report.rejected), str(report)
    _, records = tracking.read_unsent(report.unsent_path)
    assert any(r["type"] == "rejected" and r["item"]["step"] == 1 for r in records)


def test_a_refused_item_goes_alone_and_a_batch_beyond_mlflow_s_limits_arrives_whole(embedded):
    """Params, tags and metrics go to the store in one MlflowClient.log_batch. The store refuses
    a batch with one bad item whole: that item is reported, the others of its batch arrive. MLflow
    cuts a batch beyond its limits (1,000 metrics, 100 params and tags a request) itself: a replay
    of 150 params and 2,500 metrics queued offline arrives whole."""
    uri = tracking.tracking_uri()
    client = MlflowClient(uri)
    with Tracker("eae-batch") as live:
        live.log_metrics({"train/loss": 1.0, "train/loss?": 2.0}, step=0)  # MLflow takes no "?" in a name
        assert live.reachable and not any(live.pending.values())
    report = live.close()
    assert len(report.rejected) == 1 and "metric train/loss?=2.0 at step 0" in report.rejected[0], str(report)
    assert _history(client, live.run_id, "train/loss") == [(0, 1.0)]

    offline = Tracker("eae-batch", uri=f"http://127.0.0.1:{free_port()}", run_id=live.run_id,
                      spool_dir=embedded / "offline", retry_interval_s=60.0)  # fmt: skip
    offline.log_config({"p": {f"k{i:03d}": i for i in range(150)}})
    offline.set_tags({"eae.batch": "yes"})
    metrics = {f"train/m{i:04d}": float(i) for i in range(2500)}
    offline.log_metrics(metrics, step=1)
    unsent = offline.close(wait_s=0.0)
    assert (unsent.unsent_params, unsent.unsent_tags, unsent.unsent_metrics) == (150, 1, 2500)
    assert replay_unsent(unsent.unsent_path, uri=uri).ok
    run = client.get_run(live.run_id)
    assert run.data.params == {f"p.k{i:03d}": str(i) for i in range(150)} and run.data.tags["eae.batch"] == "yes"
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("train/m")} == metrics
    assert run.info.status == "FINISHED"


def test_a_version_registers_without_moving_an_alias_and_the_with_block_ends_runs_by_outcome(tmp_path, model_dir):
    """register_model(alias=None): a new version, `models:/<name>/<version>`, and no alias
    touched; `with tracker:` ends the run FINISHED, FAILED on an error, KILLED on Ctrl-C or exit."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    before = (os.environ.get("MLFLOW_TRACKING_URI"), mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    with Tracker("eae-status", uri=uri) as first:
        assert first.register_model(model_dir, "eae-versions", alias="kept") == "models:/eae-versions@kept"
    with Tracker("eae-status", uri=uri) as second:
        assert second.register_model(model_dir, "eae-versions", alias=None) == "models:/eae-versions/2"
    assert str(client.get_model_version_by_alias("eae-versions", "kept").version) == "1"  # the alias stayed
    assert client.get_model_version("eae-versions", "2").run_id == second.run_id
    # MLflow's global URIs pointed at the tracker's store for the registration only
    assert (os.environ.get("MLFLOW_TRACKING_URI"), mlflow.get_tracking_uri(), mlflow.get_registry_uri()) == before
    assert tracking.alias_version(uri, "eae-versions", "kept") == "1"
    assert tracking.alias_version(uri, "eae-versions", "missing") is None

    # SystemExit: what Ray's driver makes of SIGTERM (`ray job stop`)
    for error, status in ((RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED"), (SystemExit(15), "KILLED")):
        with pytest.raises(type(error)), Tracker("eae-status", uri=uri) as t:
            raise error
        assert client.get_run(t.run_id).info.status == status
    assert client.get_run(first.run_id).info.status == "FINISHED"


def test_a_model_uri_the_registry_does_not_hold_is_a_lookup_error_naming_it(tmp_path):
    """`--model models:/nope@pretrained` (or a missing alias or version) said "eae: error:
    MlflowException: Registered Model with name=nope not found" and pointed at a traceback file:
    a LookupError, which `eae` reports as one line of bad input, even from inside its Ray task."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri, registry_uri=uri).create_registered_model("eae-held")
    for model_uri, said in (("models:/nope@pretrained", "Registered Model with name=nope not found"),
                            ("models:/eae-held@nope", "alias nope not found"),
                            ("models:/eae-held/9", "version=9) not found")):
        with pytest.raises(LookupError) as raised:
            download_model_dir(model_uri, tmp_path / "model", uri=uri)
        message = str(raised.value)
        assert message.startswith(f"{model_uri}: ") and said in message and message.endswith(f" in {uri}"), message
        assert "\n" not in message
    with pytest.raises(ValueError, match="'models:/eae-held' is not a models:/<name>@<alias> or models:/<name>/<version"):
        download_model_dir("models:/eae-held", tmp_path / "model", uri=uri)  # was "not enough values to unpack"


def test_a_tracking_uri_of_no_store_mlflow_knows_is_a_value_error_that_crosses_ray(capsys):
    """MLFLOW_TRACKING_URI=foo://bar: MLflow's UnsupportedModelRegistryStoreURIException does not
    unpickle, so `eae eval` (its run opened in a Ray task) said "UnserializableException: Failed
    to deserialize exception"; `eae compare` gave MLflow's exception and a traceback file."""
    import pickle

    from eae_platform import cli

    with pytest.raises(ValueError) as raised:
        Tracker("eae-eval", uri="foo://bar")
    said = "tracking URI 'foo://bar': MLflow has no store of that kind (known: file:, "
    assert str(raised.value).startswith(said) and "sqlite:" in str(raised.value)
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)  # as a Ray task's error comes back
    assert cli.main(["compare", "qa-eae", "--mlflow-uri", "foo://bar"]) == 2
    assert capsys.readouterr().err == f"eae: error: {raised.value}\n"
