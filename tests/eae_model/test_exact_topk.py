"""Exact top-k search: tile_top_k (the fused Triton pass, here through Triton's interpreter)
equals the brute-force reference, including where its shortcut does not apply."""

import pytest
import torch

from eae_model.kernels.common import TILE_ROWS
from eae_model.kernels.exact_topk import STATS, chunked_top_k, error_bound, tile_top_k
from eae_model.kernels.fused_memory import triton_interpreted
from eae_model.kernels.triton_topk import KEY_ERROR, key_scores, select_tiles, tile_top2

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
    E[129] = E[130] = E[129].abs() * 3  # tied best rows of tile 1: distinct keys, equal scores
    best, arg, second = tile_top2(h, E)
    S = torch.full((h.shape[0], 8 * TILE_ROWS), -torch.inf, device=DEVICE)
    S[:, :1000] = h @ E.T
    top = S.view(h.shape[0], 8, TILE_ROWS).topk(2, dim=2)
    # keys: the scores to within KEY_ERROR, each carrying its own column
    torch.testing.assert_close(best, top.values[..., 0], rtol=KEY_ERROR, atol=1e-6)
    torch.testing.assert_close(second, top.values[..., 1], rtol=KEY_ERROR, atol=1e-6)
    assert (best > second).all() and (best < 0).any()
    assert torch.equal(arg % TILE_ROWS, best.view(torch.int32) % TILE_ROWS)
    got = S.gather(1, arg.long())  # the best row: the true best where no other score is within 2^-15 of it
    clear = top.values[..., 0] - top.values[..., 1] > 2 * KEY_ERROR * top.values[..., 0].abs() + 1e-6
    want = top.indices[..., 0] + torch.arange(8, device=DEVICE) * TILE_ROWS
    assert torch.equal(arg.long()[clear], want[clear]) and clear.float().mean() > 0.8  # all but the tie
    torch.testing.assert_close(got, top.values[..., 0], rtol=2 * KEY_ERROR, atol=1e-6)
    assert torch.equal(key_scores(best[:, 1]), key_scores(second[:, 1])) and set(arg[:, 1].tolist()) <= {129, 130}


@pytest.mark.parametrize("k", [1, 5, 20])
def test_tile_top_k_equals_brute_force(k):
    E, h = _table(M=16)  # 16 random queries: the interpreter's time grows with them
    before = STATS["fallbacks"]
    _same(tile_top_k(h, E, k), chunked_top_k(h, E, k))
    assert STATS["fallbacks"] == before  # random queries: the shortcut always applies


@pytest.mark.parametrize("query_block", [16384, 20])  # one block of queries, or two (the aimed ones in both)
def test_repeated_rows_flag_whole_tiles_and_stay_exact(query_block):
    # 300 near-copies of one row (distinct scores, no ties): for the queries aimed at them
    # the whole top-k lies in the same few tiles, every one of them flagged.
    E, h = _table(M=24)
    E[1000:1300] = E[7] + 1e-3 * torch.randn(300, E.shape[1], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    h[18:23] = E[7] * 40
    _same(tile_top_k(h, E, 5, query_block=query_block), chunked_top_k(h, E, 5))
    # With room for only one flagged tile those queries fall back to the reference: still exact.
    before = STATS["fallbacks"]
    _same(tile_top_k(h, E, 5, max_flagged=1, query_block=query_block), chunked_top_k(h, E, 5))
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


def test_queries_whose_scores_could_overflow_are_answered_by_the_reference():
    E, h = _table()
    h[3] *= 2.0**125  # |q| max|E| >= 2^127: the pass's keys could be NaN
    before = STATS["fallbacks"]
    _same(tile_top_k(h, E, 5), chunked_top_k(h, E, 5))
    assert STATS["fallbacks"] - before == 1


def test_mixed_dtypes_are_a_clear_error():
    E, h = _table()
    with pytest.raises(ValueError, match="one dtype"):
        tile_top_k(h.double(), E, 5)


def _tile_outputs(M=6, NT=40, seed=0):
    """tile_top2-like outputs with distinct tile maxima 1/8 apart (so tau = v - 2 eps, eps =
    0.01, keeps exactly the k best tiles) and second-best scores on either side of tau."""
    g = torch.Generator().manual_seed(seed)
    tmax = torch.stack([torch.randperm(NT, generator=g) for _ in range(M)]).float() / 8
    tsec = tmax - torch.rand(M, NT, generator=g) * 0.05  # >= tau for some of the best tiles
    targ = torch.randint(0, TILE_ROWS, (M, NT), generator=g, dtype=torch.int32) + torch.arange(NT, dtype=torch.int32) * TILE_ROWS
    return tmax.to(DEVICE), targ.to(DEVICE), tsec.to(DEVICE), torch.full((M,), 0.01, device=DEVICE)


# (tiles, k, group, block): the bisection over tile maxima or over maxima of 2 or 4 tiles (with
# a partial last group), the group maxima in one block or several.
@pytest.mark.parametrize("NT, k, group, block", [(40, 7, 1, 2048), (40, 7, 1, 8), (256, 2, 4, 2048), (258, 2, 4, 16),
                                                 (258, 3, 2, 32)])
def test_select_tiles_keeps_the_tiles_above_tau_and_flags_two_rows_above_it(NT, k, group, block):
    tmax, targ, tsec, eps = _tile_outputs(NT=NT)
    N = NT * TILE_ROWS
    best, flagged, count, nflag = select_tiles(tmax, targ, tsec, eps, k, k + 4, 8, N, group, block)
    padded = torch.cat([tmax, tmax[:, -1:].expand(-1, -NT % group)], 1)  # the last group's maximum is its own
    v = padded.view(tmax.shape[0], -1, group).amax(-1).topk(k, dim=1).values[:, -1:]  # <= the k-th best tile
    above = tmax >= v - 2 * eps[:, None]
    flag = above & (tsec >= v - 2 * eps[:, None])
    assert torch.equal(count.long(), above.sum(1)) and (count >= k).all() and (count <= k + 4).all()
    assert torch.equal(nflag.long(), flag.sum(1)) and (nflag > 0).any()
    for i in range(tmax.shape[0]):  # in tile order: the best row of each unflagged tile, N for a flagged one
        want = torch.where(flag[i][above[i]], N, targ[i][above[i]])
        n = len(want)
        assert torch.equal(best[i, :n].sort().values, want.sort().values) and (best[i, n:] == N).all()
        ftiles = flag[i].nonzero().flatten()
        assert torch.equal(flagged[i, : len(ftiles)].long(), ftiles) and (flagged[i, len(ftiles):] == -1).all()


def test_select_tiles_counts_what_does_not_fit():
    tmax, targ, tsec, eps = _tile_outputs()
    tmax[0], tsec[0] = 3.0, 0.0  # every tile of query 0 ties at the top: all 40 are above tau
    tsec[1] = tmax[1]  # every tile of query 1 is flagged
    best, flagged, count, nflag = select_tiles(tmax, targ, tsec, eps, 5, 9, 2, 40 * TILE_ROWS)
    # counted past the slots (9 and 2) they fill; for query 0 past the 16 groups (tiles, here)
    # the kernel looks into, too
    assert count[0] == 40 and count[1] == 5 and nflag[1] == 5
    assert (best[0] != 40 * TILE_ROWS).all() and (flagged[1] >= 0).all()


def test_select_tiles_flags_a_tile_whose_second_best_is_nan():
    tmax, targ, tsec, eps = _tile_outputs()
    top = tmax.argmax(1)
    tsec[torch.arange(tmax.shape[0]), top] = torch.nan  # an infinite score's key
    _, flagged, _, nflag = select_tiles(tmax, targ, tsec, eps, 5, 9, 8, 40 * TILE_ROWS)
    assert (flagged == top[:, None]).any(1).all()
