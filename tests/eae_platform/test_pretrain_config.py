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


def test_register_as_without_out_is_refused():
    """No --out, no final model directory: --register-as NAME registered nothing, silently."""
    with pytest.raises(ValueError, match=r"register_as 'eae' needs out, the final model directory it registers \(--out DIR\)"):
        load_pretrain_config(preset="tiny", overrides=["train.register_as=eae"])
    load_pretrain_config(preset="tiny", overrides=["train.register_as=eae", "train.out=runs/models/eae"])


@pytest.mark.parametrize("split", ["train", "dev"])
def test_a_shard_that_is_not_parquet_is_named_on_the_driver(tmp_path, split):
    """An empty or garbled shard (a disk filled mid-copy) is refused by its path, train's or dev's,
    before any worker starts: pyarrow's own error ("Parquet file size is 0 bytes") names no file,
    and a dev file was first read by a worker at its first evaluation."""
    from eae_data.shards import shard_files
    from eae_platform.pretrain.checks import check_data

    (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"max_length": 128}, "counts": {"entities": 10}}))
    for s in ("train", "dev"):
        (tmp_path / "shards" / s).mkdir(parents=True)
        pq.write_table(pa.table({"context_id": [1], "token_ids": [[101, 7, 102]]}),
                       tmp_path / "shards" / s / "part-00000-0000.parquet")
    config = load_pretrain_config(None, [f"train.data={tmp_path}", "train.batch_size=1", "train.num_workers=1",
                                         "model.max_length=128"],
                                  preset="tiny")
    check_data(config)  # sound data passes
    for content in (b"", b"not parquet"):
        bad = tmp_path / "shards" / split / "part-00001-0000.parquet"
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=f"{bad}: not a readable Parquet shard"):
            shard_files(tmp_path, split)
        with pytest.raises(ValueError, match=f"{bad}: not a readable Parquet shard"):
            check_data(config)


def test_a_misspelled_section_is_named_not_answered_with_trains_keys():
    """`--set modle.x=1` was told its override "must be model.<key> or train.<key> (one of" and
    train's 60-odd keys, as if the key were wrong: now the unknown section and the sections."""
    result = subprocess.run([str(EAE), "pretrain", "--preset", "tiny", "--set", "modle.x=1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("eae: error: override 'modle.x': unknown section 'modle'; the sections are model and "
                             "train (model.<key>, train.<key>)\n"), result.stderr
    with pytest.raises(ValueError, match=r"override 'train.lrr': train has no key 'lrr' \(its keys: .*\blr\b"):
        load_pretrain_config(preset="tiny", overrides=["train.lrr=1"])
    with pytest.raises(ValueError, match="override 'train' names no key: model.<key> or train.<key>"):
        load_pretrain_config(preset="tiny", overrides=["train=1"])
