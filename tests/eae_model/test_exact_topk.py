"""Exact top-k search: tile_top_k (the fused Triton pass, here through Triton's interpreter)
equals the brute-force reference, including where its shortcut does not apply."""

import pytest
import torch

from eae_model.exact_topk import STATS, chunked_top_k, error_bound, tile_top_k
from eae_model.fused_memory import triton_interpreted
from eae_model.triton_kernels import TILE_ROWS, tile_top2

if not triton_interpreted() and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is off and there is no GPU", allow_module_level=True)
DEVICE = "cpu" if triton_interpreted() else "cuda"  # on a GPU: the compiled kernels, float32 inputs


def _table(N=5000, d=32, M=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, d, generator=g) * 0.05).to(DEVICE), torch.randn(M, d, generator=g).to(DEVICE)


def _same(got, want):
    (gv, gi), (wv, wi) = got, want
    assert gi.shape == wi.shape
    torch.testing.assert_close(gv, wv, rtol=1e-5, atol=1e-6)
    assert torch.equal(gi.sort(1).values, wi.sort(1).values)


def test_tile_pass_keeps_each_tiles_best_row_and_second_score():
    E, h = _table(N=1000)  # 8 tiles, the last one partial
    E[896:], h = -E[896:].abs(), h.abs()  # the partial tile scores < 0: its missing rows must not count as 0
    best, arg, second = tile_top2(h, E)
    S = torch.full((h.shape[0], 8 * TILE_ROWS), -torch.inf, device=DEVICE)
    S[:, :1000] = h @ E.T
    top = S.view(h.shape[0], 8, TILE_ROWS).topk(2, dim=2)
    torch.testing.assert_close(best, top.values[..., 0])
    torch.testing.assert_close(second, top.values[..., 1])
    assert torch.equal(arg.long(), top.indices[..., 0] + torch.arange(8, device=DEVICE) * TILE_ROWS)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_tile_top_k_equals_brute_force(k):
    E, h = _table()
    before = STATS["fallbacks"]
    _same(tile_top_k(h, E, k), chunked_top_k(h, E, k))
    assert STATS["fallbacks"] == before  # random queries: the shortcut always applies


def test_repeated_rows_flag_whole_tiles_and_stay_exact():
    # 300 near-copies of one row (distinct scores, no ties): for the queries aimed at them
    # the whole top-k lies in the same few tiles, every one of them flagged.
    E, h = _table()
    E[1000:1300] = E[7] + 1e-3 * torch.randn(300, E.shape[1], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    h[:5] = E[7] * 40
    _same(tile_top_k(h, E, 5), chunked_top_k(h, E, 5))
    # With room for only one flagged tile those queries fall back to the reference: still exact.
    before = STATS["fallbacks"]
    _same(tile_top_k(h, E, 5, max_flagged=1), chunked_top_k(h, E, 5))
    assert STATS["fallbacks"] - before >= 5


def test_small_table_and_no_queries():
    E, h = _table(N=300)  # fewer rows than (k + slack) tiles: the reference answers
    _same(tile_top_k(h, E, 10), chunked_top_k(h, E, 10))
    vals, ids = tile_top_k(h[:0], *_table()[:1], 4)
    assert vals.shape == (0, 4) and ids.shape == (0, 4)


def test_error_bound_covers_float32_rounding():
    E, h = _table(d=256)
    exact = h.double() @ E.double().T
    rounded = h @ E.T
    assert ((rounded.double() - exact).abs() <= error_bound(h, E)[:, None].double()).all()


def test_mixed_dtypes_are_a_clear_error():
    E, h = _table()
    with pytest.raises(ValueError, match="one dtype"):
        tile_top_k(h.double(), E, 5)
