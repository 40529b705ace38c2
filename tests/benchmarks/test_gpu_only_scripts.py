"""The benchmarks that only run on a CUDA GPU, run without one: one line saying so, exit 2
(each was torch's "Torch not compiled with CUDA enabled" traceback)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.mark.parametrize("script, args", [("check_triton_model.py", []), ("profile_step.py", ["--no-compile"])])
def test_without_a_gpu_it_says_it_needs_one(script, args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on a machine with one too
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{script} needs a CUDA GPU") and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == "", done.stdout
