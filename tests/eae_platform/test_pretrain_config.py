"""TrainConfig's out-of-range values are refused by `eae pretrain` on the driver, before Ray
starts, with one `eae: error:` line: a negative lr (torch's refusal came from the workers), a
negative train.eval_batches (a run without dev metrics, silently) and a worker of no CPU and no
GPU (Ray's "Bundles cannot be an empty dictionary")."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eae_platform.pretrain.config import load_pretrain_config

EAE = Path(sys.executable).parent / "eae"


def test_pretrain_refuses_out_of_range_train_values_before_ray_starts(tmp_path):
    # data that passes the driver's data checks (tests/eae_platform/test_cli.py), so that only
    # the values are wrong
    (tmp_path / "shards" / "train").mkdir(parents=True)
    (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"max_length": 128}, "counts": {"entities": 10}}))
    pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}),
                   tmp_path / "shards" / "train" / "part-00000-0000.parquet")
    result = subprocess.run([str(EAE), "pretrain", "--preset", "tiny", "--data", str(tmp_path), "--batch-size", "1",
                             "--max-steps", "1", "--out", str(tmp_path / "model"), "--set", f"train.storage_path={tmp_path}",
                             "--set", "train.lr=-1",
                             "--set", "train.eval_batches=-1", "--set", "train.cpus_per_worker=0",
                             "--set", "train.max_failures=-2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("eae: error: invalid TrainConfig:"), result.stderr
    for problem in ("lr must be >= 0, got -1.0", "eval_batches must be >= 0 (0: the whole dev split), got -1",
                    "cpus_per_worker must be positive (or 0 with use_gpu), got 0",
                    "max_failures must be >= -1 (-1: any number), got -2"):
        assert problem in result.stderr
    assert "Ray's own output" not in result.stdout + result.stderr


@pytest.mark.parametrize("override", ["train.lr=0", "train.eval_batches=0", "train.cpus_per_worker=0.5",
                                      "train.max_failures=-1", "train.grad_clip=0"])
def test_the_bounds_themselves_are_accepted(override):
    load_pretrain_config(preset="tiny", overrides=[override])


def test_a_gpu_worker_may_ask_no_cpu():
    load_pretrain_config(preset="tiny", overrides=["train.use_gpu=true", "train.cpus_per_worker=0"])


def test_a_profile_range_past_the_runs_end_is_refused():
    """The profile is written after its last step: 5-9 in a 6-step run wrote nothing, silently."""
    with pytest.raises(ValueError, match="train.profile_steps '5-9' ends after max_steps 6: no profile would be written"):
        load_pretrain_config(preset="tiny", overrides=["train.max_steps=6", "train.profile_steps=5-9"])
    load_pretrain_config(preset="tiny", overrides=["train.max_steps=6", "train.profile_steps=5-6"])
