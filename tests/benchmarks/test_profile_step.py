"""benchmarks/profile_step.py without a GPU: one line saying it needs one, exit 2."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "profile_step.py"


def test_without_a_gpu_it_says_it_needs_one():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on a machine with one too
    done = subprocess.run([sys.executable, str(SCRIPT), "--no-compile"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("profile_step.py needs a CUDA GPU") and len(done.stderr.splitlines()) == 1, \
        done.stderr
    assert done.stdout == "", done.stdout
