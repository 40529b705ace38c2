"""What `eae pretrain` prints, run as a user runs it (its own local Ray cluster, or one named by
--address): rank 0's
progress line once per logging window, none of Ray's internals unless --verbose, and a failure's
cause as the last lines with its traceback in a file."""

import os
import subprocess
import sys
from pathlib import Path

EAE = Path(sys.executable).parent / "eae"
RAY_INTERNALS = ("TrainingReport(", "Execution plan", "RayTrainWorker", "TrainController", "PlacementGroupCleaner")

# wiki: the session's gensim sample (tests/eae_platform/conftest.py), built once for every
# module that pretrains on it


def _pretrain(wiki, tmp, *extra):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a new local cluster
    return subprocess.run(
        [str(EAE), "pretrain", "--preset", "tiny", "--data", str(wiki), "--batch-size", "16", "--max-steps", "8",
         "--num-workers", "2", "--set", "train.cpus_per_worker=0.5", "--set", "train.log_every=4",
         "--set", "train.checkpoint_every=8", "--set", "train.eval_batches=1",
         "--set", f"train.storage_path={tmp / 'ray'}", "--set", f"train.mlflow_uri=sqlite:///{tmp / 'mlflow.db'}",
         *extra],
        capture_output=True, text=True, timeout=300, cwd=tmp, env=env)


def test_a_pretraining_prints_each_progress_line_once_and_no_ray_internals(wiki, new_mlflow_store, tmp_path):
    new_mlflow_store(tmp_path / "mlflow.db")  # the store _pretrain names, its tables made
    result = _pretrain(wiki, tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for step in (4, 8):
        assert out.count(f"step {step}: loss") == 1, out  # rank 0 only, printed once
    assert out.count("step 8 dev: ") == 1, out
    # no --out: no model directory, and the command says where the model is instead of "None"
    assert "model:       not written (no --out): the last checkpoint, below, holds it\ncheckpoints: " in out, out
    assert [s for s in RAY_INTERNALS if s in out] == [], out
    assert "Ray's own output (workers, Ray Train, Ray Data): " in out and "--verbose shows it here" in out


def test_a_failing_pretraining_ends_with_its_cause_and_keeps_the_traceback_in_a_file(wiki, ray_cluster, tmp_path):
    # rank 0 cannot make this tracking store's directory (an OSError, not bad input's ValueError: a
    # URI of no scheme MLflow knows is one line, exit 2): the worker fails inside Ray Train (on the
    # session's cluster, as `--address` names one: a new local one is the test above's)
    result = _pretrain(wiki, tmp_path, "--set", "train.mlflow_uri=sqlite:////dev/null/sub/mlflow.db",
                       "--address", ray_cluster.get_runtime_context().gcs_address)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-2:]
    assert last[0].startswith("eae: error: ") and "/dev/null/sub" in last[0], result.stderr
    saved = last[1].removeprefix("(full traceback: ").split(";")[0]
    assert "Traceback" in Path(saved).read_text() and last[1].endswith("--verbose prints it)")
