"""On a Hopper GPU (not in CI: tests/conftest.py leaves this folder out without CUDA; run by
scripts/gpu/kernels): the Gluon pass gives the Triton pass's results, and tile_top_k over a
bf16 table with it is exact."""

import pytest
import torch

from eae_model.kernels import hopper_topk as hk
from eae_model.kernels.exact_topk import STATS, chunked_top_k, tile_top_k
from eae_model.kernels.triton_topk import KEY_ERROR, key_scores, tile_top2

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper GPU", allow_module_level=True)


def _table(N, M, d=256, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    E = (torch.randn(N, d, device="cuda", generator=g) * 0.05).bfloat16()
    return E, torch.randn(M, d, device="cuda", generator=g).bfloat16()


@pytest.mark.parametrize("N, M", [(100_000, 1000), (4097, 130), (70_000, 64)])  # partial tiles, partial query blocks
def test_hopper_pass_equals_the_triton_pass(N, M):
    E, h = _table(N, M)
    E[3000:3003] = E[17]  # tied best rows in one tile: its second-best key's score equals its best
    h[:4] = E[17].float().mul(40).bfloat16()
    want = tile_top2(h, E, kernel="triton")
    got = tile_top2(h, E, kernel="hopper")
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    rows = got[1].long().clamp(max=N - 1)  # each best row scores the tile's best score
    scores = (h.float()[:, None, :] * E.float()[rows]).sum(-1)
    torch.testing.assert_close(scores, got[0], rtol=2 * KEY_ERROR, atol=1e-5)
    assert torch.equal(key_scores(got[2][:4, 3000 // 128]), key_scores(got[0][:4, 3000 // 128]))  # the tie


def test_tile_top_k_with_the_hopper_pass_is_exact():
    E, h = _table(300_000, 3000, seed=1)
    h[:3] = E[5].float().mul(30).bfloat16()
    E[1000:1200] = E[5] + 0.002 * torch.randn(200, 256, device="cuda").bfloat16()  # whole tiles flagged
    before = STATS["fallbacks"]
    vals, ids = tile_top_k(h, E, 50)
    ref_vals, ref_ids = chunked_top_k(h, E, 50)
    torch.testing.assert_close(vals, ref_vals, rtol=1e-5, atol=1e-5)
    # The same rows, up to swaps of rows whose float32 scores tie to within their rounding (the
    # reference's matmul sums in another order): their float64 scores are the reference's.
    assert (ids.sort(1).values.diff(dim=1) > 0).all()  # distinct rows
    exact = lambda rows: torch.stack([(h[i].double() * E[rows[i]].double()).sum(-1) for i in range(len(rows))])  # noqa: E731
    torch.testing.assert_close(exact(ids).sort(1).values, exact(ref_ids).sort(1).values, rtol=1e-5, atol=1e-5)
    assert (ids.sort(1).values != ref_ids.sort(1).values).any(1).sum() <= 3
    assert STATS["fallbacks"] - before <= 3


def test_unsupported_shapes_fall_back_to_the_triton_pass():
    E, h = _table(5000, 10, d=512)  # d > 256: the queries and two tiles would not fit shared memory
    assert not hk.supported(h, E)
    want = tile_top2(h, E, kernel="triton")
    assert torch.equal(tile_top2(h, E)[0], want[0])
