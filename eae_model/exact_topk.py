"""Exact top-k entities by dot product, without the [M, N] score matrix.

`chunked_top_k` (any device, the reference): per block of rows of E, the block's top-k, merged
with the running top-k.

`threshold_top_k` (CUDA, Triton), for serving: a threshold tau_i that is certainly below the
k-th best score of query i is read off a strided sample of the rows (the k-th best among any
subset is <= the k-th best overall); one fused pass over E then keeps only scores >= tau_i
(a few thousand per query instead of N), and the top-k of those is the exact answer. The
sample's scores come from a bf16 matmul, so tau is lowered by the bf16 rounding bound
(2^-7 |tau|) to stay a lower bound of the fp32-accumulated scores. Queries whose candidates
overflow the buffer fall back to `chunked_top_k`; their number is returned.
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


@torch.no_grad()
def threshold_top_k(
    h: torch.Tensor, E: torch.Tensor, k: int, sample_rows: int = 32768, cap: int = 4096, query_block: int = 16384
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """h [M, d], E [N, d] on CUDA (bf16 for speed) -> (scores [M, k] fp32, ids [M, k] int64,
    number of queries that fell back to the chunked search)."""
    from eae_model.triton_kernels import candidates

    N = E.shape[0]
    k = min(k, N)
    if N <= 4 * sample_rows or sample_rows < 4 * k or cap < 2 * k:
        vals, ids = chunked_top_k(h, E, k)
        return vals, ids, 0
    stride = N // sample_rows
    sample = E[:: stride][:sample_rows]
    out_v, out_i, fallbacks = [], [], 0
    for a in range(0, h.shape[0], query_block):
        q = h[a : a + query_block].contiguous()
        tau = (q @ sample.T).float().topk(k, dim=1).values[:, -1]
        tau = tau - tau.abs() * 2.0**-7 - 1e-30
        scores, rows, count = candidates(q, E, tau, cap)
        vals, j = scores.topk(k, dim=1)
        ids = rows.gather(1, j).long()
        over = (count > cap).nonzero().flatten()
        if over.numel():
            fallbacks += over.numel()
            vals[over], ids[over] = chunked_top_k(q[over], E, k)
        out_v.append(vals)
        out_i.append(ids)
    return torch.cat(out_v), torch.cat(out_i), fallbacks
