"""`eae bench` on a machine without a GPU: the step benchmark runs (chunked and dense memory),
GPU-only benchmarks refuse clearly, and the FLOP counts match a hand count."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eae_model.config import load_config
from eae_platform.bench import bert_flops, eae_flops
from eae_platform.cli import main

EAE = Path(sys.executable).parent / "eae"


def run(*args):
    return subprocess.run([str(EAE), *args], capture_output=True, text=True, timeout=300)


def test_bench_step_on_cpu_writes_figures(tmp_path):
    out = tmp_path / "step.json"
    result = run("bench", "step", "--preset", "tiny", "--batch", "2", "--steps", "1", "--no-bert",
                 "--impl", "chunked", "--impl", "dense", "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["tokens"] == 2 * 64 and data["mentions"] > 0
    assert set(data["results"]) == {"eae_chunked", "eae_dense"}
    for figures in data["results"].values():
        assert figures["ms"] > 0 and figures["tokens_per_s"] == pytest.approx(128 / figures["ms"] * 1e3)
    assert "eae_chunked" in result.stdout


@pytest.mark.parametrize("what", ["topk", "memory", "scaling"])
def test_gpu_benchmarks_refuse_without_cuda(what, capsys):
    assert main(["bench", what]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_flop_counts_by_hand():
    c = load_config("paper")
    tokens, length = 256 * 128, 128
    layer = 2 * (4 * 768 * 768 + 2 * 768 * 3072) + 2 * 2 * 128 * 768  # per token, forward
    head = 2 * (768 * 768 + 768 * 30522)
    assert bert_flops(c, tokens, length) == 3 * tokens * (12 * layer + head)
    # EaE: the head at 450 masked tokens; per mention 2 passes over 1M x 256 (memory scores and
    # weighted sum) plus W_f, W'_f and W_b; per linked mention (563) EntityPred's scores.
    per_mention = 2 * 2 * 1_000_000 * 256 + 2 * (2 * 768 * 256) * 2 + 2 * 256 * 768
    per_linked = 2 * 1_000_000 * 256
    assert eae_flops(c, tokens, length, 1126, 450, 563) == 3 * (
        tokens * 12 * layer + 450 * head + 1126 * per_mention + 563 * per_linked)
