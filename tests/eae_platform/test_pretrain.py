"""Distributed pretraining on a real local Ray cluster: 2 CPU workers with the sharded entity
table, MLflow in the embedded store and on a PostgreSQL-backed server, exact resumption after
the run is killed, and a worker crash survived through FailureConfig."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from eae_model.checkpoint import load_model
from eae_platform.pretrain import job
from eae_platform.pretrain.config import load_pretrain_config
from eae_platform.pretrain.job import run
from eae_platform.tracking import download_model_dir
from tests.eae_platform.conftest import STEPS, WINDOWS, example_trace, pretrain_config, trace_records


def test_two_workers_train_with_falling_loss(uninterrupted):
    tmp, config, summary = uninterrupted
    client = MlflowClient(config.train.mlflow_uri)
    run_id = summary["mlflow_run_id"]
    losses = [m.value for m in sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)]
    assert len(losses) == STEPS // 4 and losses[-1] < losses[0]
    # both workers consumed different examples at every step
    trace = example_trace(tmp / "ray" / "plain")
    assert len(trace) == 2 * STEPS
    for step in range(STEPS):
        assert not set(trace[0, step]) & set(trace[1, step])
    # the final model: each worker's rows of E in its own file, loadable as one model
    model_dir = Path(summary["model"])
    assert sorted(p.name for p in model_dir.glob("entities-*.safetensors")) == ["entities-00000.safetensors",
                                                                               "entities-00001.safetensors"]
    model = load_model(model_dir)
    assert model.entity_table.weight.shape == (3000, config.model.entity_dim)
    # the entity vocabulary (titles, for serving) travels with the model
    assert (model_dir / "entities.parquet").read_bytes() == (Path(config.train.data) / "entities.parquet").read_bytes()


def test_mlflow_records_the_run(uninterrupted):
    tmp, config, summary = uninterrupted
    client = MlflowClient(config.train.mlflow_uri)
    r = client.get_run(summary["mlflow_run_id"])
    assert r.data.params["model.num_entities"] == "3000" and r.data.params["train.max_steps"] == str(STEPS)
    # every metric named <split>/<metric>, as fine-tuning and evaluation name theirs (docs/tracking.md)
    for key in ("loss", "loss_mention", "loss_memory_el", "loss_entity_pred", "loss_mlm", "tokens_per_s", "table_gib_per_worker",
                "step_time_s", "launch_time_s", "data_wait_s", "gc_s", "exchange_s", "grad_sync_wait_s"):
        assert f"train/{key}" in r.data.metrics, key
    assert {"dev/entity_accuracy", "dev/token_accuracy", "dev/perplexity"} <= set(r.data.metrics)
    assert all(k.startswith(("train/", "dev/")) for k in r.data.metrics), sorted(r.data.metrics)
    assert "train/gpu_lag_s" not in r.data.metrics  # measured on GPUs only
    # each window's clock runs until its steps have finished, past the host's launches
    launched = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "train/launch_time_s")}
    finished = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "train/step_time_s")}
    assert launched and launched.keys() == finished.keys() and all(finished[s] >= launched[s] for s in launched)
    artifacts = [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")]
    assert len(artifacts) == 1
    assert summary["model_uri"] == "models:/eae-test@pretrained"
    assert (str(summary["alias_version"]), summary["alias_was"]) == ("1", None)  # a new alias, said so
    local = download_model_dir(summary["model_uri"], tmp / "downloaded", uri=config.train.mlflow_uri)
    assert torch.equal(load_model(local).entity_table.weight, load_model(summary["model"]).entity_table.weight)
    assert (local / "entities.parquet").is_file()


def _by_process(records: list[dict]) -> list[list[int]]:
    """The steps each worker process ran, one list per process in the order they started."""
    steps: dict[int, list[int]] = {}
    for r in records:
        steps.setdefault(r["pid"], []).append(r["step"])
    return list(steps.values())


def _registered_checkpoint(tmp, name) -> int | None:
    """The step of the checkpoint a restart or relaunch of run `name` resumes: the latest one
    Ray Train has registered (its checkpoint_manager_snapshot.json, rewritten at each
    registration), or None. It can lag the newest checkpoint_* folder on disk: the controller
    takes one report per worker per health check (2 s), metrics and checkpoints alike."""
    snapshot = tmp / "ray" / name / "checkpoint_manager_snapshot.json"
    latest = None
    for _ in range(50):  # a read that meets a write in progress is retried
        try:
            latest = json.loads(snapshot.read_text())["latest_checkpoint_result"] if snapshot.is_file() else None
            break
        except ValueError:
            time.sleep(0.01)
    if latest is None:
        return None
    return json.loads((snapshot.parent / latest["checkpoint_dir_name"] / "state.json").read_text())["step"]


def _kill_rank_when(tmp, name, rank, step, past_checkpoint, sig=signal.SIGKILL):
    """In the background: once `rank` has logged `step` and Ray Train has registered a
    checkpoint after step `past_checkpoint` (its registration, not a logged step, times the kill:
    the steps outrun a poll), SIGKILL its worker process. Returns the thread and a dict it fills
    at the kill: the last step the process logged and the step of the checkpoint Ray Train had
    registered then."""
    trace = tmp / "ray" / name / f"examples-rank{rank}.jsonl"
    killed = {}

    def watch():
        deadline = time.time() + 600
        while time.time() < deadline:
            if trace.is_file():
                records = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
                checkpoint = _registered_checkpoint(tmp, name)
                if records and records[-1]["step"] >= step and (checkpoint or 0) > past_checkpoint:
                    killed.update(step=records[-1]["step"], checkpoint=checkpoint)
                    os.kill(records[-1]["pid"], sig)
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, killed


def test_a_paused_then_killed_run_resumes_each_time_with_exactly_the_same_examples(wiki, uninterrupted, tmp_path):
    """One run stopped twice, relaunched with the same name each time:
    1. out of time (train.time_budget_s): it stops at its first log window with a checkpoint,
       its MLflow run KILLED (tag eae.paused_at_step);
    2. the relaunch starts at that step; its worker is SIGKILLed (max_failures 0) and the run
       ends FAILED;
    3. the second relaunch's new workers start at the step of the checkpoint Ray Train resumes
       (not at step 0: each launch's trace lines are read apart from the earlier ones').
    All three are one MLflow run, which ends FINISHED, with the uninterrupted run's examples
    and weights."""
    plain_tmp, plain_config, plain = uninterrupted
    # the reference run's MLflow store: its tables exist (a new SQLite store takes ~2 s to create
    # them); this run is the one named "stopped" there
    store = plain_config.train.mlflow_uri
    client = MlflowClient(store)

    def relaunch(**train):
        return run(pretrain_config(wiki, tmp_path, "stopped", out=str(tmp_path / "model"), register_as="",
                                   mlflow_uri=store, **train))

    def records():
        return {rank: trace_records(tmp_path / "ray" / "stopped", rank) for rank in (0, 1)}

    def new_records(before):
        """Each rank's records since `before`, written by processes that are all new."""
        now, added = records(), {}
        for rank in (0, 1):
            assert now[rank][: len(before[rank])] == before[rank]
            added[rank] = now[rank][len(before[rank]):]
            assert {r["pid"] for r in added[rank]}.isdisjoint(r["pid"] for r in before[rank])
        return added

    paused = relaunch(time_budget_s=1e-6)
    assert paused["paused_at_step"] == 4 and paused["model"] is None and not (tmp_path / "model").exists()
    assert [r["step"] for r in trace_records(tmp_path / "ray" / "stopped", 0)] == [0, 1, 2, 3]
    (first,) = client.search_runs([client.get_experiment_by_name("eae-pretrain").experiment_id],
                                  "attributes.run_name = 'stopped'")
    assert first.info.status == "KILLED" and first.data.tags["eae.paused_at_step"] == "4"

    before = records()
    # killed once Ray Train has registered a checkpoint past the pause's (step 8): the worker's
    # steps outrun the registration (one report a health check, 2 s), so a kill at a logged step
    # sometimes came after the last step (a CI run); the final checkpoint's registration comes
    # a health check later still, so the run is always killed before it can finish
    watcher, killed = _kill_rank_when(tmp_path, "stopped", rank=1, step=5, past_checkpoint=4)
    with pytest.raises(Exception):
        relaunch()  # max_failures = 0: the run dies with its worker
    watcher.join(timeout=5)
    for rank, steps in new_records(before).items():  # from the pause's checkpoint, until the kill
        assert [r["step"] for r in steps] == list(range(4, 4 + len(steps))), rank
    assert client.get_run(first.info.run_id).info.status == "FAILED"  # not left RUNNING by the killed workers
    # the checkpoint the relaunch resumes: the killed run's latest that Ray Train registered,
    # past the pause's (which a relaunch that ignored the new one would redo), and before the
    # last step (the run really stopped early: the relaunch has steps left to train)
    checkpoint = _registered_checkpoint(tmp_path, "stopped")
    assert checkpoint is not None and 4 < checkpoint <= killed["step"] + 1 and checkpoint < STEPS, (checkpoint, killed)

    before = records()
    done = relaunch()
    assert done["paused_at_step"] is None and done["mlflow_run_id"] == first.info.run_id  # one MLflow run throughout
    assert client.get_run(first.info.run_id).info.status == "FINISHED"
    for rank, steps in new_records(before).items():  # each step after the checkpoint once
        assert [r["step"] for r in steps] == list(range(checkpoint, STEPS)), (rank, checkpoint)
    assert example_trace(tmp_path / "ray" / "stopped") == example_trace(plain_tmp / "ray" / "plain")
    # same examples, same masks, same RNG: the same model as the uninterrupted run
    resumed, reference = load_model(tmp_path / "model"), load_model(plain["model"])
    for (name, a), (_, b) in zip(resumed.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


def test_worker_crash_restarts_from_checkpoint_logging_to_a_postgresql_server(wiki, uninterrupted, server, tmp_path):
    """A worker killed mid-run is replaced from the last checkpoint (FailureConfig): every
    rank's new process starts at that checkpoint's step, not at step 0; the example stream is
    unchanged, and the experiment on a PostgreSQL-backed server holds one run, FINISHED, with
    every step's metrics once."""
    plain_tmp, _, _ = uninterrupted
    config = pretrain_config(wiki, tmp_path, "crash", max_failures=1, mlflow_uri=server.url, register_as="eae-pg",
                             out=str(tmp_path / "model"))
    # killed once Ray Train has registered the first checkpoint (step 4): it registers reports
    # asynchronously (a kill at logged step 6 once found none and restarted from step 0, a CI
    # run), and the next registration is a 2 s health check later, so the kill comes well
    # before the run could finish and the checkpoint read at the kill is the one resumed
    watcher, killed = _kill_rank_when(tmp_path, "crash", rank=0, step=5, past_checkpoint=0)
    summary = run(config)
    watcher.join(timeout=5)
    # the checkpoint the replacement resumes: the latest Ray Train had registered at the kill,
    # one past step 0 (which a replacement that ignored it would redo)
    checkpoint = killed["checkpoint"]
    assert checkpoint is not None and 0 < checkpoint <= killed["step"] + 1, killed
    for rank in (0, 1):
        # the killed worker group and its replacement (Ray Train restarts every worker): the
        # replacement starts at the checkpoint's step, not at step 0, and runs each step after it once
        processes = _by_process(trace_records(tmp_path / "ray" / "crash", rank))
        assert len(processes) == 2, (rank, processes)
        first, replacement = processes
        assert first[0] == 0 and first[-1] >= checkpoint, (rank, first)
        assert replacement == list(range(checkpoint, STEPS)), (rank, checkpoint, replacement)
    assert summary["metrics"]["step"] == STEPS
    assert example_trace(tmp_path / "ray" / "crash") == example_trace(plain_tmp / "ray" / "plain")
    client = MlflowClient(server.url)
    r = client.get_run(summary["mlflow_run_id"])
    assert r.data.params["train.name"] == "crash"
    # the experiment holds this one run across the restart (the server's database is this module's)
    from mlflow.entities import ViewType

    everything = client.search_runs([r.info.experiment_id], run_view_type=ViewType.ALL)
    assert [(x.info.run_id, x.info.status) for x in everything] == [(r.info.run_id, "FINISHED")]
    # one run across the restart: every step's metrics once, the last value of a redone step kept
    assert sorted({m.step for m in client.get_metric_history(r.info.run_id, "train/loss")}) == WINDOWS
    assert "dev/token_accuracy" in r.data.metrics
    assert client.get_model_version_by_alias("eae-pg", "pretrained").run_id == r.info.run_id


def test_an_mlflow_server_down_mid_pretraining_loses_no_metric(wiki, uninterrupted, server, tmp_path, capsys):
    """The PostgreSQL-backed MLflow server is killed while rank 0 trains (at step 3 of 12) and
    restarted only once rank 0 has begun the step after the next log window, so that window
    went to a dead server (its log call gives up after the tracker's few quick retries). The
    run queues what it cannot send and ends FINISHED on the server with every window's metrics
    once, the same values as the uninterrupted run, its config and its registered model. The
    driver says the outage and the recovery as rank 0's tracker meets them (its relay: the
    workers' own output is not streamed, as at `eae pretrain`'s default verbosity)."""
    plain_tmp, _, plain = uninterrupted
    config = pretrain_config(wiki, tmp_path, "outage", mlflow_uri=server.url, register_as="eae-outage",
                     out=str(tmp_path / "model"))
    trace = tmp_path / "ray" / "outage" / "examples-rank0.jsonl"
    outage, finished = {}, threading.Event()

    def kill_then_restart():
        deadline = time.time() + 600
        while time.time() < deadline:
            steps = [r["step"] for r in trace_records(tmp_path / "ray" / "outage", 0)]
            if steps and steps[-1] >= 3:
                server.kill()
                outage["down"] = steps[-1]
                # the first window logged after the kill ends step index w - 1; waiting for step
                # index w to begin means its log call has failed and queued (a restart at once
                # could answer the call's own retries: CI saw that)
                w = next((w for w in WINDOWS if w - 1 >= steps[-1]), STEPS)
                while not finished.is_set() and trace_records(tmp_path / "ray" / "outage", 0)[-1]["step"] < w:
                    time.sleep(0.1)
                outage["up"] = trace_records(tmp_path / "ray" / "outage", 0)[-1]["step"]
                server.start()  # returns once the server answers /health
                return
            time.sleep(0.1)

    with server.outage(kill_then_restart, finished, join_s=300):
        summary = run(config)
    # a window (logged at the end of step index w - 1) went to a dead server: killed no later than
    # that step began, restarted only after the next one began
    assert any(outage.get("down", 99) <= w - 1 < outage.get("up", 0) for w in WINDOWS), (
        outage, trace.read_text()[-500:])
    client = MlflowClient(server.url)
    r = client.get_run(summary["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.params["train.name"] == "outage"
    history = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "train/loss")}
    assert sorted(history) == WINDOWS  # every window once: none lost, none sent twice
    reference = MlflowClient(f"sqlite:///{plain_tmp / 'mlflow.db'}").get_metric_history(plain["mlflow_run_id"], "train/loss")
    assert history == pytest.approx({m.step: m.value for m in reference})  # the same values, in the same steps
    assert "dev/token_accuracy" in r.data.metrics
    assert client.get_model_version_by_alias("eae-outage", "pretrained").run_id == r.info.run_id
    said = capsys.readouterr().err
    assert f"[eae tracking] MLflow unreachable at {server.url}: " in said, said[-2000:]
    assert f"[eae tracking] MLflow reachable again at {server.url}" in said, said[-2000:]


def test_a_stopped_pretraining_ends_its_mlflow_run_killed(wiki, ray_cluster, new_mlflow_store, tmp_path):
    """`eae pretrain` (as `ray job submit -- python jobs/pretrain.py` runs it) stopped mid-run by
    Ctrl-C (SIGINT, which Ray Train answers by aborting its workers and sys.exit) and, in a
    second job beside it, by `ray job stop` (SIGTERM, which Ray's driver turns into sys.exit):
    each one's MLflow run ends KILLED, not RUNNING, each exits saying so (130 and 143), and the
    interrupted one keeps its checkpoint, which the same command resumes with the same MLflow run.
    (Side by side: one job's start-up, most of its time, overlaps the other's.)"""
    import subprocess
    import sys

    from eae_platform.pretrain.job import last_checkpoint_state

    def start(name):
        uri = new_mlflow_store(tmp_path / name / "mlflow.db")  # its own store, its tables made
        # one worker each: two jobs' workers and their data reads fit the session's 2 CPUs
        command = [sys.executable, "jobs/pretrain.py", "--preset", "tiny", "--data", str(wiki), "--name", name,
                   "--address", ray_cluster.get_runtime_context().gcs_address, "--max-steps", "400",
                   "--num-workers", "1",
                   *(x for o in ("model.num_entities=3000", "model.max_length=128",
                                 f"train.storage_path={tmp_path / name / 'ray'}", "train.batch_size=16",
                                 "train.cpus_per_worker=0.5", "train.log_every=4",
                                 # the Ctrl-C'd one has a checkpoint to keep (step 4) before its signal
                                 f"train.checkpoint_every={4 if name == 'ctrl-c' else 100}",
                                 "train.eval_batches=2", f"train.mlflow_uri={uri}")
                     for x in ("--set", o))]
        job = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        return job, uri, tmp_path / name / "ray" / name / "examples-rank0.jsonl", name

    jobs = {signal.SIGINT: start("ctrl-c"), signal.SIGTERM: start("sigterm")}
    deadline = time.time() + 300
    waiting = dict(jobs)
    while waiting:  # each job gets its signal once it has taken 3 steps (the Ctrl-C'd one: registered a checkpoint)
        for sig, (job, _, trace, name) in list(waiting.items()):
            ready = (last_checkpoint_state(str(tmp_path / name / "ray"), name) is not None if sig == signal.SIGINT
                     else trace.is_file() and len(trace.read_text().splitlines()) >= 3)
            if job.poll() is not None or ready:
                job.send_signal(sig)
                del waiting[sig]
        assert time.time() < deadline, "the pretraining never got to step 3"
        time.sleep(0.1)
    out_of, run_of = {}, {}
    for sig, (job, uri, _, name) in jobs.items():
        out, _ = job.communicate(timeout=120)
        out_of[sig] = out
        client = MlflowClient(uri)
        (r,) = client.search_runs([client.get_experiment_by_name("eae-pretrain").experiment_id])
        assert r.info.run_name == name and r.info.status == "KILLED", (sig, out[-3000:])
        run_of[sig] = r.info.run_id
    # SIGTERM said and told by its exit status (128 + 15), as a shell tells a process it ended;
    # before, Ray's SystemExit(1) from inside ray.get: exit 1 in silence, as a failure
    job, *_ = jobs[signal.SIGTERM]
    assert job.returncode == 143 and "eae: terminated (SIGTERM)" in out_of[signal.SIGTERM], job.returncode
    # Ctrl-C the same way (128 + 2), in one line; before, Ray Train's abort ended fit() with
    # Ray's SystemExit(1): exit 1 in silence, as a failure
    job, *_ = jobs[signal.SIGINT]
    out = out_of[signal.SIGINT]
    assert job.returncode == 130 and out.strip().splitlines()[-1] == "eae: interrupted (SIGINT)", (job.returncode, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    kept = last_checkpoint_state(str(tmp_path / "ctrl-c" / "ray"), "ctrl-c")  # what a relaunch resumes
    assert kept is not None and kept[1]["step"] >= 4 and kept[1]["mlflow_run_id"] == run_of[signal.SIGINT], kept


def _sharded_table_worker(config):
    """In each Ray Train worker: the sharded table on fixed inputs; results saved per rank."""
    import ray.train
    from safetensors.torch import save_file

    from eae_model.sharded_table import ShardedEntityTable

    rank = ray.train.get_context().get_world_rank()
    inputs = _table_inputs()
    for k in (None, 3):
        table = ShardedEntityTable(11, 8)
        table.load_full(inputs["E"])
        h = inputs[f"h{rank}"].clone().requires_grad_()
        out = table.attend(h, k, inputs[f"t{rank}"])
        (out.loss + (out.retrieved * inputs[f"g{rank}"]).sum()).backward()
        save_file({"retrieved": out.retrieved.detach(), "loss": out.loss.detach().reshape(1), "h_grad": h.grad,
                   "E_grad": table.weight.grad, "rows": torch.tensor([table.lo, table.hi])},
                  f"{config['dir']}/rank{rank}-k{k}.safetensors")


def _table_inputs():
    g = torch.Generator().manual_seed(0)
    return {"E": torch.randn(11, 8, generator=g), "h0": torch.randn(5, 8, generator=g), "h1": torch.randn(3, 8, generator=g),
            "g0": torch.randn(5, 8, generator=g), "g1": torch.randn(3, 8, generator=g),
            "t0": torch.tensor([1, -1, 4, 10, 0]), "t1": torch.tensor([7, 2, -1])}


def test_sharded_table_equals_unsharded_in_ray_train_workers(ray_cluster, tmp_path):
    """2 Ray Train workers (gloo) against the unsharded layer: outputs and gradients within 1e-5.
    Gradients follow data parallelism: E's is that of the mean of the workers' losses."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from safetensors.torch import load_file

    from eae_model.entity_table import EntityTable

    TorchTrainer(_sharded_table_worker, train_loop_config={"dir": str(tmp_path)},
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(name="table", storage_path=str(tmp_path / "ray"))).fit()
    inputs = _table_inputs()
    for k in (None, 3):
        table = EntityTable(11, 8)
        with torch.no_grad():
            table.weight.copy_(inputs["E"])
        hs = [inputs["h0"].clone().requires_grad_(), inputs["h1"].clone().requires_grad_()]
        outs = [table.attend(h, k, inputs[f"t{r}"]) for r, h in enumerate(hs)]
        losses = [o.loss + (o.retrieved * inputs[f"g{r}"]).sum() for r, o in enumerate(outs)]
        (sum(losses) / 2).backward()
        for rank in (0, 1):
            got = load_file(str(tmp_path / f"rank{rank}-k{k}.safetensors"))
            lo, hi = got["rows"].tolist()
            torch.testing.assert_close(got["retrieved"], outs[rank].retrieved, atol=1e-5, rtol=0)
            torch.testing.assert_close(got["loss"][0], outs[rank].loss, atol=1e-5, rtol=0)
            # a worker's own mentions get the gradient of its own loss (DDP scales upstream)
            torch.testing.assert_close(got["h_grad"], 2 * hs[rank].grad, atol=1e-5, rtol=0)
            torch.testing.assert_close(got["E_grad"], table.weight.grad[lo:hi], atol=1e-5, rtol=0)


def test_a_table_smaller_than_the_vocabulary_is_noted(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {"entities": 3000}}))
    config = load_pretrain_config(None, [f"train.data={tmp_path}", "model.num_entities=2000"], preset="tiny")
    assert "has 3,000 entities, the model's table 2,000" in job.vocabulary_note(config)
    config = load_pretrain_config(None, [f"train.data={tmp_path}", "model.num_entities=3000"], preset="tiny")
    assert job.vocabulary_note(config) is None


def test_a_relaunch_resumes_only_a_checkpoint_of_the_same_settings(tmp_path, capsys):
    """A run without a name gets a fresh one; a named run's checkpoint is resumed only when it
    was made with the same settings (how long, logged or kept may change), else the error lists
    what differs; --resume without a checkpoint is an error."""
    def config(*overrides):
        return load_pretrain_config(None, [f"train.storage_path={tmp_path}", *overrides], preset="tiny")

    fresh = config()
    job.name_run(fresh)
    assert fresh.train.name.startswith("pretrain-") and "relaunch with --name pretrain-" in capsys.readouterr().out
    saved = config("train.name=r1")
    for stamp, step in (("00-00-00", 8), ("00-01-00", 12)):
        checkpoint = tmp_path / "r1" / f"checkpoint_2026-01-01_{stamp}.000000"
        checkpoint.mkdir(parents=True)
        (checkpoint / "state.json").write_text(json.dumps({"step": step, "config": saved.to_dict()}))
    # what Ray Train registered (as it writes it): step 8; step 12's folder came after, unregistered
    registered = {"checkpoint_dir_name": "checkpoint_2026-01-01_00-00-00.000000", "metrics": {"step": 8}}
    assert job.check_resume(config("train.name=r1")) is None  # nothing registered: Ray resumes nothing
    (tmp_path / "r1" / "checkpoint_manager_snapshot.json").write_text(json.dumps(
        {"ray_version": "2.60.0", "checkpoint_results": [registered], "latest_checkpoint_result": registered}))
    assert job.check_resume(config("train.name=r1", "train.max_steps=500", "train.time_budget_s=60")) == 8
    with pytest.raises(ValueError, match=r"step 8 .*model.k_train: None -> 5; train.batch_size: 32 -> 16"):
        job.check_resume(config("train.name=r1", "model.k_train=5", "train.batch_size=16"))
    assert job.check_resume(config("train.name=r2")) is None  # a new run of that name
    with pytest.raises(ValueError, match="run 'r2' has no checkpoint"):
        job.name_run(config("train.name=r2"), resume=True)
