"""Exact top-k entities by dot product, without the [M, N] score matrix.

`chunked_top_k` (any device, the reference): per block of rows of E, the block's top-k, merged
with the running top-k.

`tile_top_k` (Triton; CUDA, or CPU under Triton's interpreter), for serving: one fused pass
over E (eae_model.kernels.triton_topk.tile_top2) keeps, per query and tile of 128 rows, only the
best score, its row and the second-best score (as keys within KEY_ERROR of the scores); the
[M, N] scores never reach memory. Then:

- v, the k-th largest tile maximum, bounds the k-th best score from below (those k maxima
  are k distinct rows), and so does any v' <= v. With eps bounding the pass's float error,
  every row of the true top-k scores >= tau = v' - 2 eps in the pass.
- A tile whose best score is < tau holds none of them; one whose second-best is < tau holds
  at most its best row; only a tile with two scores >= tau ("flagged") must be read whole.
- The candidates, the best row of every tile above tau and every row of flagged tiles, are
  rescored in float32 and their top-k is the answer.

Two more Triton kernels (eae_model.kernels.triton_topk): select_tiles finds v', the k-th largest
maximum of groups of 4 tiles (k groups >= v' hold k distinct rows), by bisection on counts to
within 2^-20 of their range below, and compacts the groups above tau and then their tiles
above it; rescore_top_k rescores each query's candidates and keeps their top k. Nothing
waits for the GPU until every block of queries is queued.

For random queries about k^2 / (2 N / 128) tiles per query are flagged (0.6 for top-100 of
1M), so ~180 rows are rescored instead of N. A query with more than k + slack tiles above
tau, with more flagged tiles than `max_flagged` or with |q| max|E| >= 2^127 (a score could
overflow) is answered by `chunked_top_k` instead (counted in `STATS`): exact either way.
(Earlier versions and their H100 figures: docs/performance.md.)
"""

from __future__ import annotations

import torch


def chunked_top_k(h: torch.Tensor, E: torch.Tensor, k: int, chunk_rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, d], E [N, d] -> (scores [M, k] float32, ids [M, k] int64), sorted descending.
    Scores in float32 whatever the inputs' dtype (the exact reference for bf16 tables)."""
    k = min(k, E.shape[0])
    vals = torch.empty(h.shape[0], 0, dtype=torch.float32, device=h.device)
    ids = torch.empty(h.shape[0], 0, dtype=torch.long, device=h.device)
    for a in range(0, E.shape[0], chunk_rows):
        S = h.float() @ E[a : a + chunk_rows].float().T
        tv, ti = S.topk(min(k, S.shape[1]), dim=1)
        vals, ids = torch.cat([vals, tv], 1), torch.cat([ids, ti + a], 1)
        vals, j = vals.topk(min(k, vals.shape[1]), dim=1)
        ids = ids.gather(1, j)
    return vals, ids


def error_bound(h: torch.Tensor, E: torch.Tensor, row_norm_max: float | None = None) -> torch.Tensor:
    """[M] float32: a bound on |pass key - rescored score| per query. Both scores are float32
    sums of d products, exact for bf16 x bf16 (float32 x float32 products add one rounding each,
    inside the slack below): a rounded sum is within
    d 2^-24 sum_i |q_i e_i| <= d 2^-24 |q| max_j |E_j| of the exact value, twice that if the
    tensor cores truncate instead of rounding; two such sums: d 2^-22 |q| max_j |E_j|. The
    pass's key is within KEY_ERROR |score| <= KEY_ERROR |q| max_j |E_j| of its score
    (eae_model.kernels.triton_topk)."""
    if row_norm_max is None:
        row_norm_max = float(E.float().norm(dim=1).max()) if E.shape[0] else 0.0
    return h.float().norm(dim=1) * row_norm_max * _error_per_norm(h.shape[1]) + 1e-30


def _error_per_norm(d: int) -> float:
    from eae_model.kernels.triton_topk import KEY_ERROR

    return d * 2.0**-22 + KEY_ERROR


STATS = {"fallbacks": 0}  # queries tile_top_k answered with chunked_top_k (bench and tests read it)


@torch.no_grad()
def tile_top_k(
    h: torch.Tensor, E: torch.Tensor, k: int, slack: int = 16, max_flagged: int = 16, query_block: int = 16384,
    row_norm_max: float | None = None, kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, d], E [N, d] (bf16 for speed; CUDA, or CPU under TRITON_INTERPRET=1) ->
    (scores [M, k] float32, ids [M, k] int64), sorted descending. row_norm_max: max_j |E_j|,
    if the caller keeps it (else computed, one pass over E). kernel: the pass's
    (triton_topk.tile_top2)."""
    from eae_model.kernels.common import TILE_ROWS
    from eae_model.kernels.triton_topk import rescore_top_k, select_tiles, tile_top2

    if h.dtype != E.dtype:
        raise ValueError(f"queries ({h.dtype}) and table ({E.dtype}) must have one dtype: rounding the "
                         "queries would change the answer")
    N = E.shape[0]
    k = min(k, N)
    if N < (k + slack) * TILE_ROWS:  # a small table: the reference is as cheap
        return chunked_top_k(h, E, k)
    if row_norm_max is None:
        row_norm_max = float(E.float().norm(dim=1).max()) if N else 0.0
    if not h.shape[0]:
        return torch.empty(0, k, device=h.device), torch.empty(0, k, dtype=torch.long, device=h.device)
    eps_finite = 2.0**127 * _error_per_norm(h.shape[1])  # error_bound at |q| max|E| = 2^127
    out_v, out_i, out_ok = [], [], []
    for a in range(0, h.shape[0], query_block):  # queued without waiting: the GPU runs them back to back
        q = h[a : a + query_block].contiguous()
        tmax, targ, tsec = tile_top2(q, E, kernel=kernel)  # [Mq, NT] each
        # Per query: every tile with a score >= tau, its best row (N where the tile is flagged)
        # and the flagged tiles; then the top k of those rows, rescored.
        eps = error_bound(q, E, row_norm_max)
        best_rows, flagged, above, n_flagged = select_tiles(tmax, targ, tsec, eps, k, k + slack, max_flagged, N)
        vals, ids = rescore_top_k(q, E, best_rows, flagged, n_flagged, k)
        out_v.append(vals)
        out_i.append(ids)
        # Too many tiles above tau or flagged, or |q| max|E| >= 2^127 (a score may be infinite,
        # its key NaN): the reference answers.
        out_ok.append((above <= k + slack) & (n_flagged <= max_flagged) & (eps < eps_finite))
    vals, ids = torch.cat(out_v), torch.cat(out_i)
    bad = (~torch.cat(out_ok)).nonzero(as_tuple=True)[0]  # one wait for all blocks
    if bad.numel():
        STATS["fallbacks"] += bad.numel()
        vals[bad], ids[bad] = chunked_top_k(h[bad], E, k)
    return vals, ids
