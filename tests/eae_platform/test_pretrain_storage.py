"""Checkpoint storage that stops taking writes in the middle of `eae pretrain` (issue 26): a
real tmpfs mounted by the test as the run's storage_path, filled up while the run trains, then
remounted read-only, then writable again; the real Ray cluster and MLflow store of the session.
Root cannot be kept out of a directory by its permissions: a full or read-only filesystem can."""

import errno
import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from eae_model.checkpoint import load_model
from eae_platform import cli
from eae_platform.pretrain.job import last_checkpoint_state, run
from eae_platform.pretrain.storage import append_record
from tests.eae_platform.conftest import STEPS, example_trace, pretrain_config, pretrain_overrides, trace_records


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size): a tmpfs of `size` at tmp_path/name, unmounted after the test. A mount
    that fails fails the test, saying why, and never skips it: CI runs as root, as this machine
    does, and a skip would leave the behaviour unchecked without anyone noticing."""
    mounted = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs at {path} (this test needs root, CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_a_trace_record_is_appended_whole_or_not_at_all(tmpfs):
    """On a one-page tmpfs the trace fills the page; the record that does not fit is a short
    write, then ENOSPC: the file keeps its whole lines only, so a relaunch's first record
    starts a line of its own."""
    trace = tmpfs("page", "4k") / "examples-rank0.jsonl"
    step = 0
    with pytest.raises(OSError) as refused:
        while True:
            append_record(trace, {"step": step, "ids": list(range(step, step + 5))})
            step += 1
    assert refused.value.errno == errno.ENOSPC
    text = trace.read_text()
    assert text.endswith("\n") and [json.loads(x)["step"] for x in text.splitlines()] == list(range(step))
    refused_line = json.dumps({"step": step, "ids": list(range(step, step + 5))}) + "\n"
    assert len(text) + len(refused_line) > 4096  # the page was full: the refused record did not fit


def test_storage_full_mid_run_keeps_the_last_checkpoint_and_a_relaunch_resumes_from_it(
        wiki, uninterrupted, tmpfs, tmp_path, capsys):
    """The reference run (12 steps, a checkpoint every 4) with its storage on a 96 MB tmpfs
    (a checkpoint is ~26 MB), which fills up as soon as Ray Train has registered the checkpoint
    of step 4. The run stops at its next write with one paragraph naming the storage, ENOSPC,
    the intact checkpoint and the steps lost; its MLflow run ends FAILED, tagged with them.
    Relaunched with the storage read-only, it stops before starting, saying EROFS. Relaunched
    with the storage writable again, it resumes from that checkpoint, byte for byte as it was,
    and ends with the uninterrupted run's examples and weights, in the same MLflow run."""
    plain_tmp, plain_config, plain = uninterrupted
    disk = tmpfs("ray", "96m")  # the storage_path of pretrain_overrides
    run_dir, model = disk / "full", tmp_path / "model"
    # the reference run's MLflow store: its tables exist (a new SQLite store takes ~2 s to create them)
    train = {"out": str(model), "register_as": "", "mlflow_uri": plain_config.train.mlflow_uri}
    args = ["pretrain", "--preset", "tiny"]
    for override in pretrain_overrides(wiki, tmp_path, "full", **train):
        args += ["--set", override]
    filled, stop = {}, threading.Event()

    def fill_after_the_first_checkpoint():
        while not stop.is_set():
            last = last_checkpoint_state(str(disk), "full")
            if last is not None:
                filled.update(path=last[0], step=last[1]["step"], digests=_digests(last[0]))
                with open(disk / "filler", "wb", buffering=0) as f:
                    try:
                        while True:
                            f.write(bytes(1 << 20))
                    except OSError as error:
                        filled["errno"] = error.errno
                return
            time.sleep(0.05)

    filler = threading.Thread(target=fill_after_the_first_checkpoint, daemon=True)
    filler.start()
    try:
        assert cli.main(args) == 1
    finally:
        stop.set()
        filler.join(timeout=10)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (err,) = [line for line in err.splitlines() if line.startswith("eae: error:")]  # besides MLflow's INFO lines
    assert filled.get("errno") == errno.ENOSPC and filled["step"] == 4, filled
    trained = [[r["step"] for r in trace_records(run_dir, rank)] for rank in (0, 1)]
    failed = len(trained[0])  # steps trained: the failed write was the next checkpoint's, after its step's record
    assert trained == [list(range(failed))] * 2 and failed in (8, 12), trained
    lost = failed - 4
    assert err.startswith(f"eae: error: checkpoint storage {run_dir} stopped taking writes (ENOSPC: No space left "
                          "on device): rank "), err
    assert (f"could not write its part of the checkpoint of step {failed} after training step {failed}, and the run "
            f"stopped (its MLflow run ends FAILED); its last good checkpoint, step 4 ({filled['path']}), is intact; "
            f"lost: the {lost} steps (5-{failed}) trained after it, which a relaunch trains again.") in err, err
    assert "run the same command with --name full to resume from step 4." in err
    client = MlflowClient(plain_config.train.mlflow_uri)
    experiment, this_run = client.get_experiment_by_name("eae-pretrain").experiment_id, "attributes.run_name = 'full'"
    (failed_run,) = client.search_runs([experiment], this_run)
    assert failed_run.info.status == "FAILED" and failed_run.data.tags["eae.steps_lost"] == str(lost)
    assert failed_run.data.tags["eae.error"] == err.removeprefix("eae: error: ")
    # the last good checkpoint: still the one a relaunch resumes, its files byte for byte as they were
    assert last_checkpoint_state(str(disk), "full")[0] == filled["path"]
    assert _digests(filled["path"]) == filled["digests"]

    (disk / "filler").unlink()
    _remount(disk, "ro")
    try:
        assert cli.main(args) == 1
    finally:
        _remount(disk, "rw")
    err = capsys.readouterr().err
    assert err == (f"eae: error: checkpoint storage {run_dir} is not writable (EROFS: Read-only file system): "
                   "nothing was started, and nothing there changed. Make it writable, then run the same command "
                   "again.\n")

    before = {rank: trace_records(run_dir, rank) for rank in (0, 1)}
    summary = run(pretrain_config(wiki, tmp_path, "full", **train))
    # the relaunch's new workers start at the checkpoint's step
    for rank, records in {rank: trace_records(run_dir, rank) for rank in (0, 1)}.items():
        added = records[len(before[rank]):]
        assert [r["step"] for r in added] == list(range(4, STEPS)), (rank, added)
        assert {r["pid"] for r in added}.isdisjoint(r["pid"] for r in before[rank])
    assert _digests(filled["path"]) == filled["digests"]
    # nothing lost: the uninterrupted run's examples, then its weights, in the one MLflow run
    assert example_trace(run_dir) == example_trace(plain_tmp / "ray" / "plain")
    resumed, reference = load_model(model), load_model(plain["model"])
    for (name, a), (_, b) in zip(resumed.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    (finished,) = client.search_runs([experiment], this_run)
    assert (finished.info.run_id, finished.info.status) == (failed_run.info.run_id, "FINISHED")
    assert summary["mlflow_run_id"] == failed_run.info.run_id
