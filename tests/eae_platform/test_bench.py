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
    data = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the JSON: not valid JSON"))
    assert data["device"] == "cpu" and data["tokens"] == 2 * 64 and data["mentions"] > 0
    assert set(data["results"]) == {"eae_chunked", "eae_dense"}
    for figures in data["results"].values():
        assert figures["ms"] > 0 and figures["tokens_per_s"] == pytest.approx(128 / figures["ms"] * 1e3)
        assert figures["peak_gib"] is None  # measured on CUDA only (it was NaN, which strict JSON readers refuse)
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


def test_make_batch_has_the_asked_mentions_per_context():
    from eae_platform.bench import make_batch

    default = make_batch(64, 128, 1000, 30522, "cpu")
    assert all(a.equal(b) for a, b in zip(default[:2], make_batch(64, 128, 1000, 30522, "cpu", mentions_per_context=4.4)[:2]))
    assert 4.0 <= len(default[2]) / 64 <= 5.0
    assert 6.9 <= len(make_batch(256, 128, 1000, 30522, "cpu", mentions_per_context=7.2)[2]) / 256 <= 7.5
    with pytest.raises(ValueError, match="mentions_per_context must be in"):
        make_batch(4, 16, 1000, 30522, "cpu", mentions_per_context=5)


def _scaling_steps(rank: int, world: int) -> list:
    import torch

    from eae_platform.bench import measure_steps

    torch.set_num_threads(1)
    return measure_steps(rank, world, torch.device("cpu"), "tiny", 4, 2, ["memory_impl=chunked"], mentions=6.0)


def test_scaling_steps_time_the_exchanges_and_the_all_reduce_wait(tmp_path):
    """`eae bench scaling`'s timed steps on two real gloo workers (CPU): every worker's step
    time, table footprint (half the rows each) and, per step, the time in the table's
    exchanges and waiting for the gradients' all-reduces, all gathered on every worker."""
    from tests.eae_platform.gloo_workers import run_workers

    got = run_workers(_scaling_steps, 2, tmp_path, timeout=240)
    assert got[0] == got[1]  # gathered: the same figures on both
    tiny = load_config("tiny")
    for seconds, peak, table_gib, exchange_ms, wait_ms in got[0]:
        assert seconds > 0 and peak == 0.0
        assert table_gib == pytest.approx(16 * (tiny.num_entities // 2) * tiny.entity_dim / 2**30, rel=0.01)
        assert 0 < exchange_ms < seconds * 1e3 and 0 < wait_ms < seconds * 1e3
