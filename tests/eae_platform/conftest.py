"""The pretraining run that several modules compare against: 2 workers with the sharded entity
table, 12 steps of the tiny preset on the gensim Wikipedia sample, once per test session
(test_pretrain.py resumes and crashes runs against it; test_multinode.py runs it over two nodes;
test_pretrain_storage.py on a failing disk; test_log.py's `eae pretrain` runs read its data),
and the example traces that compare them."""

import json
import signal
from pathlib import Path

import pytest

from eae_platform.preprocess.build import build, embedded_settings
from eae_platform.pretrain.config import load_pretrain_config
from eae_platform.pretrain.job import run

STEPS = 12
WINDOWS = list(range(4, STEPS + 1, 4))  # the steps that end a log window (train.log_every=4)


def trace_records(run_dir: Path, rank: int) -> list[dict]:
    """A rank's example-trace records (run_dir: train.storage_path/<name>) in the order written:
    one per step a worker process ran, with its example ids and that process's pid (a relaunch or
    a replacement appends to the same file); [] before the first."""
    path = run_dir / f"examples-rank{rank}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def example_trace(run_dir: Path) -> dict[tuple[int, int], list[int]]:
    """{(rank, step): example ids} of both ranks, the last record winning (a resumed step is redone)."""
    return {(rank, r["step"]): r["ids"] for rank in (0, 1) for r in trace_records(run_dir, rank)}


@pytest.fixture(scope="session")
def wiki(ray_cluster, tmp_path_factory):
    """The gensim sample built with 3,000 entities in files of 500 contexts."""
    out = tmp_path_factory.mktemp("wiki")
    build(embedded_settings(str(out), entities=3000, shard_rows=500))
    return out


def pretrain_overrides(wiki, tmp, name, **train) -> list[str]:
    """The `--set` overrides of the reference run (tiny preset), then `train.<key>=<value>` for each of train."""
    return [
        "model.num_entities=3000", "model.max_length=128",
        f"train.data={wiki}", f"train.storage_path={tmp / 'ray'}", f"train.name={name}",
        "train.batch_size=16", f"train.max_steps={STEPS}", "train.lr=0.002", "train.num_workers=2",
        "train.cpus_per_worker=0.5", "train.log_every=4", "train.checkpoint_every=4", "train.eval_batches=2",
        # the GPU study's switches (docs/results.md): two Adam groups, the table's at 10x, so a
        # resume that restored one group's lr only would part from the uninterrupted run
        "train.memory_lr_scale=10", "train.shuffle_rows=true",
        f"train.mlflow_uri=sqlite:///{tmp / 'mlflow.db'}",
    ] + [f"train.{k}={v}" for k, v in train.items()]


def pretrain_config(wiki, tmp, name, **train):
    return load_pretrain_config(None, pretrain_overrides(wiki, tmp, name, **train), preset="tiny")


@pytest.fixture(scope="session")
def uninterrupted(wiki, tmp_path_factory):
    """(dir, config, summary) of the reference run on the session's one-node cluster, named
    "plain", its final model in dir/model, registered as models:/eae-test@pretrained."""
    tmp = tmp_path_factory.mktemp("run")
    config = pretrain_config(wiki, tmp, "plain", out=str(tmp / "model"), register_as="eae-test")
    before = signal.getsignal(signal.SIGINT)
    summary = run(config)
    # Ray Train's Ctrl-C handler (abort the run) does not outlive fit(): the one before it is back
    assert signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT)
    return tmp, config, summary
