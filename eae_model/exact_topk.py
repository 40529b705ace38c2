"""Exact top-k entities by dot product, without the [M, N] score matrix.

`chunked_top_k` (any device, the reference): per block of rows of E, the block's top-k, merged
with the running top-k.

`tile_top_k` (Triton; CUDA, or CPU under Triton's interpreter), for serving: one fused pass
over E (eae_model.triton_kernels.tile_top2) keeps, per query and tile of 128 rows, only the
best score, its row and the second-best score; the [M, N] scores never reach memory. Then:

- v, the k-th largest tile maximum, bounds the k-th best score from below (those k maxima
  are k distinct rows). With eps bounding the pass's float error, every row of the true
  top-k scores >= tau = v - 2 eps in the pass.
- A tile whose best score is < tau holds none of them; one whose second-best is < tau holds
  at most its best row; only a tile with two scores >= tau ("flagged") must be read whole.
- The candidates, the best rows of the best k + slack tiles and every row of flagged tiles,
  are rescored in float32 and their top-k is the answer.

For random queries about k^2 / (2 N / 128) tiles per query are flagged (0.6 for top-100 of
1M), so ~180 rows are rescored instead of N. A query whose tiles above tau do not fit the
k + slack best tiles, or with more flagged tiles than `max_flagged`, is answered by
`chunked_top_k` instead (counted in `STATS`): exact either way. (Earlier
versions and their H100 figures: docs/performance.md.)
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
    """[M] float32: a bound on |pass score - rescored score| per query. Both are float32 sums
    of d products, exact for bf16 x bf16 (float32 x float32 products add one rounding each,
    inside the slack below): a rounded sum is within
    d 2^-24 sum_i |q_i e_i| <= d 2^-24 |q| max_j |E_j| of the exact value, twice that if the
    tensor cores truncate instead of rounding; two such sums: d 2^-22 |q| max_j |E_j|."""
    if row_norm_max is None:
        row_norm_max = float(E.float().norm(dim=1).max()) if E.shape[0] else 0.0
    return h.float().norm(dim=1) * row_norm_max * (h.shape[1] * 2.0**-22) + 1e-30


STATS = {"fallbacks": 0}  # queries tile_top_k answered with chunked_top_k (bench and tests read it)


@torch.no_grad()
def tile_top_k(
    h: torch.Tensor, E: torch.Tensor, k: int, slack: int = 16, max_flagged: int = 16, query_block: int = 16384,
    row_norm_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, d], E [N, d] (bf16 for speed; CUDA, or CPU under TRITON_INTERPRET=1) ->
    (scores [M, k] float32, ids [M, k] int64), sorted descending. row_norm_max: max_j |E_j|,
    if the caller keeps it (else computed, one pass over E)."""
    from eae_model.triton_kernels import TILE_ROWS, rescore, tile_top2

    if h.dtype != E.dtype:
        raise ValueError(f"queries ({h.dtype}) and table ({E.dtype}) must have one dtype: rounding the "
                         "queries would change the answer")
    N = E.shape[0]
    k = min(k, N)
    if N < (k + slack) * TILE_ROWS:  # a small table: the reference is as cheap
        return chunked_top_k(h, E, k)
    if row_norm_max is None:
        row_norm_max = float(E.float().norm(dim=1).max()) if N else 0.0
    out_v, out_i = [], []
    rows_in_tile = torch.arange(TILE_ROWS, device=h.device)
    for a in range(0, h.shape[0], query_block):
        q = h[a : a + query_block].contiguous()
        tmax, targ, tsec = tile_top2(q, E)  # [Mq, NT] each
        NT = tmax.shape[1]
        kt = k + slack
        best, tiles = tmax.topk(kt, dim=1)  # the best kt tiles, sorted
        tau = best[:, k - 1] - 2 * error_bound(q, E, row_norm_max)
        complete = best[:, -1] < tau  # every tile with a score >= tau is among the kt taken
        above = best >= tau[:, None]
        flagged = above & (tsec.gather(1, tiles) >= tau[:, None])  # two rows >= tau: read whole
        n_flagged = flagged.sum(1)
        F = min(int(n_flagged.max()) if q.shape[0] else 0, max_flagged)
        ok = complete & (n_flagged <= F)
        # Candidates: the best row of each tile above tau that is not flagged, and every row of
        # the (at most F) flagged tiles; N marks "no candidate" (not read, scores -inf).
        best_rows = torch.where(above & ~flagged, targ.gather(1, tiles).long(), N)
        cands = [best_rows]
        if F:
            order = flagged.to(torch.int32).topk(F, dim=1)  # flagged tiles first
            ftiles = torch.where(order.values.bool(), tiles.gather(1, order.indices), -1)  # [Mq, F]
            rows = ftiles[:, :, None] * TILE_ROWS + rows_in_tile
            cands.append(torch.where((ftiles[:, :, None] >= 0) & (rows < N), rows, N).flatten(1))
        cand = torch.cat(cands, 1)
        scores = rescore(q, E, cand)
        vals, j = scores.topk(k, dim=1)
        ids = cand.gather(1, j)
        bad = (~ok).nonzero(as_tuple=True)[0]
        if bad.numel():
            STATS["fallbacks"] += bad.numel()
            vals[bad], ids[bad] = chunked_top_k(q[bad], E, k)
        out_v.append(vals)
        out_i.append(ids)
    if not out_v:
        return torch.empty(0, k, device=h.device), torch.empty(0, k, dtype=torch.long, device=h.device)
    return torch.cat(out_v), torch.cat(out_i)
