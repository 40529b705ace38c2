"""Exact top-k entities by dot product, without the [M, N] score matrix.

`chunked_top_k` (any device, the reference): per block of rows of E, the block's top-k, merged
with the running top-k.

`group_top_k` (CUDA, Triton), for serving: one fused pass over E keeps, per query, only the
best score of each group of G consecutive rows ([M, N / G] maxima) and of each 128-row
super-group; the [M, N] scores never reach memory. The k-th largest group maximum is a lower
bound of the k-th best score (those k maxima are k distinct rows), so every row of the true
top-k lies in one of the k best groups. The best k + slack groups (slack absorbs rounding
differences between the two passes) are found by a two-level top-k (super-groups first, then
the groups of the best super-groups), their (k + slack) G rows are rescored in float32, and
the top-k of those is the answer: exact by construction, no fallback. (Earlier versions and
their H100 figures: docs/performance.md.)
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
def group_top_k(
    h: torch.Tensor, E: torch.Tensor, k: int, group: int = 16, slack: int = 8, query_block: int = 16384
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, d], E [N, d] on CUDA (bf16 for speed) -> (scores [M, k] fp32, ids [M, k] int64)."""
    from eae_model.triton_kernels import SUPER_ROWS, group_maxima, rescore

    N = E.shape[0]
    k = min(k, N)
    per = SUPER_ROWS // group
    out_v, out_i = [], []
    for a in range(0, h.shape[0], query_block):
        q = h[a : a + query_block].contiguous()
        gmax, smax = group_maxima(q, E, group)  # [Mq, NG], [Mq, NS]
        NG = gmax.shape[1]
        kg = min(k + slack, NG)
        # The best k_g super-groups hold the best k_g groups (the same argument, one level up).
        supers = smax.topk(min(kg, smax.shape[1]), dim=1).indices
        gids = (supers[:, :, None] * per + torch.arange(per, device=q.device)).flatten(1)
        gvals = gmax.gather(1, gids.clamp(max=NG - 1)).masked_fill_(gids >= NG, -torch.inf)
        groups = gids.gather(1, gvals.topk(kg, dim=1).indices)  # [Mq, kg]
        cand = (groups[:, :, None] * group + torch.arange(group, device=q.device)).flatten(1)
        scores = rescore(q, E, cand)  # ids past N score -inf
        vals, j = scores.topk(k, dim=1)
        out_v.append(vals)
        out_i.append(cand.gather(1, j))
    return torch.cat(out_v), torch.cat(out_i)
