"""The entity table E sharded over the training workers, parameter-server style.

`ShardedEntityTable` computes what `eae_model.entity_table.entity_attention` and the entity-linking
(EL) loss compute for an unsharded E, but the N rows of E are split into W contiguous,
near-equal blocks, one per worker of a torch.distributed group. Worker r owns rows
[lo_r, hi_r) as its own `nn.Parameter` (so its optimizer state covers only those rows) and does
all the work that touches them: scores, top-k candidates, softmax normalisers, weighted partial
sums and their gradient. Only per-mention queries, candidates and partial results cross workers;
E is never replicated or gathered. Pure PyTorch + torch.distributed: any backend with
`all_to_all_single` (gloo on CPU, NCCL on GPU). With one worker, or no process group, nothing
is sent and the same code runs locally.

Data parallel use: every worker has its own batch, and so its own M_w mentions (queries h_w,
targets t_w with -1 = unlinked); `attend` returns the results for that worker's mentions only.
The M = sum_w M_w mentions are numbered in rank order (worker 0's first). One step of
`attend`, for worker r as *shard* (rows of E) and as *owner* (of its mentions):

  R0  sizes: all_gather of (M_w, error flag), so that bad input raises on every worker (on the
      host, over gloo, when the group is NCCL's). Or exchanged ahead of the call
      (`exchange_counts`, then `expect`): the training loop does it for the coming batches in a
      thread ahead of the steps, so that a step's table calls never wait for the other hosts.
  R1  queries: every worker sends h_w (and t_w) to every other: H [M, d], T [M] everywhere.
  --  local pass over E_r in chunks of `chunk_rows` rows (online softmax): S = H E_r^T; per
      mention the local max m_r, z_r = sum exp(S - m_r) over all own rows, and for k < all the
      local top-min(k, N_r) candidates (sorted).
  R2  (k < all) candidate scores to their mention's owner, who takes the global top-k among the
      W * k candidates; as every shard's list is sorted, the winners are a prefix of each list:
  R3  (k < all) the owner sends every shard the length of its prefix (one int per mention).
  R4  partials to the owner: v_r = sum over own selected rows of exp(S - m_r) E_j, z_r,
      z_sel,r (the same sum over the selected rows only), the gold score h.E_t if the shard
      owns t, and m_r. The owner merges with m = max_r m_r:
          z = sum_r e^(m_r - m) z_r,  lse = m + log z,   E_m = sum_r e^(m_r - m) v_r / z_sel,
      and the EL loss of a linked mention is lse - gold (cross-entropy over ALL N entities,
      as in the unsharded model, also when retrieval uses top-k).
  Backward, with g_R, g_lse, g_gold the gradients of the owner's outputs:
  B1  the owner sends every shard, per mention, u = g_R / z_sel, b = g_R.E_m / z_sel,
      e = g_lse / z, g_gold and m. Each shard recomputes its scores chunk by chunk
      (nothing of size M x N_r is kept between forward and backward) and forms
          dL/dS_ij = sel_ij q_ij (u_i.E_j - b_i) + q_ij e_i + g_gold_i [j = t_i],  q = e^(S - m),
          dL/dE_j  = sum_i dL/dS_ij h_i + sum_i sel_ij q_ij u_i    (kept locally),
          dL/dH_i  = sum_j dL/dS_ij E_j                             (a partial over own rows)
  B2  partial dL/dH to the owner, who sums over shards: dL/dh_w.

Bytes moved per step (forward + backward of one `attend` call). M = mentions per step summed
over the W workers, d = entity dim, q = bytes of the query/table dtype, a = bytes of the
accumulation dtype (max(q, 4): partials are float32 at least), k' = min(k, ceil(N / W)) the
(padded) per-shard candidate count, d' = d with retrieval and 0 for a loss-only call
(`retrieve=False`, e.g. the EntityPred head). Every message is an all_to_all: a worker never
sends rows to itself, and whatever the split of M over workers, each message below sends
(W - 1) * M * (its bytes per mention) in all, over all workers:

  | message                      | per mention, to each other worker | bytes per mention |
  |------------------------------|-----------------------------------|-------------------|
  | R0 sizes (per worker, not M) | 2 int64                           | 16 per worker     |
  | R1 queries (+ targets)       | h [d] (+ t, int32)                | d q (+ 4)         |
  | R2 candidates (k < all only) | k' scores                         | k' a              |
  | R3 prefix lengths (k < all)  | 1 int32                           | 4                 |
  | R4 partials                  | v [d'], z, z_sel, gold, m         | (d' + 4) a        |
  | B1 output gradients          | u [d'], b, e, g_gold, m           | (d' + 4) a        |
  | B2 query-gradient partials   | dL/dh [d]                         | d a               |

  total sent per step, all workers = (W - 1) * M * (d q + 4 + 2 (d' + 4) a + d a
                                                    + [k < all] (k' a + 4)) + 16 W (W - 1)
  per worker (on average; exactly, when M divides evenly) = total / W, which is also what each
  worker receives on average.

For the paper's setting (d = 256, float32, k = all in training, batch 4096 contexts x ~4.4
mentions = M ~ 18k per step, W = 8) the memory layer moves 16 d + 36 = 4132 bytes per mention,
~65 MB sent per worker per step, and the EntityPred head (a second, loss-only call) 8 d + 36 =
2084, ~33 MB; all-reducing the gradient of a replicated 1M x 256 table instead would send
~1.8 GB per worker per step (2 (W - 1) / W N d a).
`bytes_per_step` computes these numbers. They do not grow with N (only k' is capped by it):
the work on the rows scales with N / W, the traffic with M. Prediction (`top_k`, no backward)
sends R0, the queries (d q) and k' candidates with their ids (k' (a + 8)) per mention.

Gradient convention (data parallel). Each worker calls `loss_w.backward()` on its own loss,
and DDP *averages* the gradients of replicated parameters, i.e. it optimises
J = (1/W) sum_w L_w, while the activations of worker w receive dL_w/d(activation), unscaled.
The table follows the same convention:
  * `weight.grad` on worker r = the rows [lo_r, hi_r) of dJ/dE (grad_average=True, default;
    with grad_average=False it is dsum_w L_w/dE, for a loss that is already a global mean);
  * the gradient reaching worker w's queries h_w is dL_w/dh_w (= W dJ/dh_w), exactly what a
    replicated table would give on that worker before DDP's averaging of the replicated
    parameters upstream of h (W_f, the transformer), which then yields dJ/dtheta there.
The table's parameter must not be wrapped by DDP (its shape differs per worker): keep the
table outside the DDP module or name it in
`DistributedDataParallel._set_params_and_buffers_to_ignore_for_model`. Gradient clipping by
global norm needs the squared norms of the shards' gradients all-reduced.

Collective rules: every worker of the group must call `attend`/`top_k` the same number of
times with the same k, retrieve and whether targets are given, and (when training) backward
through outputs of every call (any of them: the backward is one autograd node per call, run
as soon as any output gets a gradient); h must require grad on all workers or on none.

Numerics: scores are computed in the table's dtype (like h @ E^T in the unsharded layer), all
softmax pieces, partials and gradients in at least float32. Ties among top-k scores are broken
arbitrarily, as by torch.topk. With one worker the results equal `entity_attention` up to
float rounding (different summation order), not bit for bit.
"""

from __future__ import annotations

import math
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from eae_data.constants import NULL_ENTITY as UNLINKED
from eae_model.entity_table import TableOutput
from eae_model.kernels import fused_memory
from eae_model.kernels.fused_memory import block_backward, block_forward, cast_rows, compute_dtype



def shard_bounds(num_entities: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of E owned by `rank`: contiguous blocks whose sizes differ by at most one
    (the first N mod W blocks have one row more)."""
    base, extra = divmod(num_entities, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# ----------------------------------------------------------------------------- communication


class _Comm:
    """The process group and the all_to_all exchanges of rows of per-mention data."""

    def __init__(self, group=None):
        self.group = group
        self.host_group = None  # where R0 runs: None = `group` itself
        # the caller's timing hook (the Ray layer passes its pretrain.profiling.SpanTimer): an
        # object whose span(name) is a context manager; each all_to_all is timed as "exchange"
        self.timer = None
        if group is None and not (dist.is_available() and dist.is_initialized()):
            self.world, self.rank = 1, 0
        else:
            self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
            if self.world > 1 and group is None and "gloo" not in str(dist.get_backend()).lower():
                # Under NCCL, R0 on GPU tensors made the host wait for the GPU to reach it
                # (its result sizes the next messages) at each of a step's table calls; over
                # gloo the hosts exchange the counts they already know. A collective: every
                # worker builds its table in the same order.
                self.host_group = dist.new_group(backend="gloo")

    def sizes(self, count: int, error: int, device: torch.device) -> tuple[list[int], list[int]]:
        """R0: every worker's number of mentions and error code."""
        if self.world == 1:
            return [count], [error]
        on_host = self.host_group is not None
        mine = torch.tensor([count, error], dtype=torch.int64, device="cpu" if on_host else device)
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.host_group if on_host else self.group)
        rows = torch.stack(parts).tolist()
        return [c for c, _ in rows], [e for _, e in rows]

    def exchange(self, tensors: list[torch.Tensor], send: list[int], recv: list[int], replicate=False):
        """all_to_all of rows: the rows of `tensors` (same length) go out in blocks of `send`
        rows (block w to worker w; with replicate=True all rows go to every worker), blocks of
        `recv` rows come in, in rank order. Tensors of any dtypes travel in one message."""
        if self.world == 1:
            return tensors
        rows = tensors[0].shape[0]
        specs, cols = [], []
        for t in tensors:
            flat = t.reshape(rows, math.prod(t.shape[1:])).contiguous().view(torch.uint8)
            specs.append((t.dtype, t.shape[1:], flat.shape[1]))
            cols.append(flat)
        buf = torch.cat(cols, 1) if len(cols) > 1 else cols[0]
        if replicate:
            buf = buf.repeat(self.world, 1)
        out = buf.new_empty(sum(recv), buf.shape[1])
        with self.timer.span("exchange") if self.timer is not None else nullcontext():
            dist.all_to_all_single(out, buf, output_split_sizes=recv, input_split_sizes=send, group=self.group)
        result, offset = [], 0
        for dtype, shape, width in specs:
            piece = out[:, offset : offset + width].clone(memory_format=torch.contiguous_format).view(dtype)
            result.append(piece.reshape(out.shape[0], *shape))
            offset += width
        return result

    def gather_rows(self, tensors, counts):
        """Each worker's rows to every worker: [M_r, ...] -> [M, ...] in rank order."""
        return self.exchange(tensors, [counts[self.rank]] * self.world, counts, replicate=True)

    def to_owners(self, tensors, counts):
        """Rows of all M mentions -> the owner's rows from every worker: [W, M_r, ...]."""
        mine = counts[self.rank]
        out = self.exchange(tensors, counts, [mine] * self.world)
        return [t.reshape(self.world, mine, *t.shape[1:]) for t in out]


# ----------------------------------------------------------------------------- local work


@dataclass
class _Plan:
    comm: _Comm
    counts: list[int]  # mentions per worker
    lo: int
    hi: int
    num_entities: int
    max_shard_rows: int
    k: int | None  # retrieval top-k; None = softmax over all rows
    retrieve: bool
    has_targets: bool
    chunk_rows: int
    grad_scale: float
    fused: torch.dtype | None = None  # memory_impl=triton: the kernels' compute dtype, else None


def _local_pass(H, E, k, want_sums, want_v, chunk, acc):
    """Over the rows of E in chunks: per query the max score m, z = sum exp(S - m) and
    (want_v) v = sum exp(S - m) E_j over all rows, and (k) the top-min(k, rows) scores and
    local row ids, sorted."""
    M, N = H.shape[0], E.shape[0]
    m = torch.full((M,), -math.inf, dtype=acc, device=H.device)
    z = torch.zeros(M, dtype=acc, device=H.device)
    v = torch.zeros(M, E.shape[1], dtype=acc, device=H.device) if want_v else None
    vals = torch.empty(M, 0, dtype=acc, device=H.device)
    ids = torch.empty(M, 0, dtype=torch.long, device=H.device)
    for a in range(0, N, chunk):
        Ec = E[a : a + chunk]
        S = (H @ Ec.T).to(acc)
        if want_sums:
            m_new = torch.maximum(m, S.amax(1)) if M else m
            alpha = torch.exp(m - m_new)
            P = torch.exp(S - m_new[:, None])
            z = z * alpha + P.sum(1)
            if want_v:
                v = v * alpha[:, None] + (P.to(E.dtype) @ Ec).to(acc)
            m = m_new
        if k is not None:
            tv, ti = S.topk(min(k, S.shape[1]), dim=1)
            vals, ids = torch.cat([vals, tv], 1), torch.cat([ids, ti + a], 1)
            vals, j = vals.topk(min(k, vals.shape[1]), dim=1)
            ids = ids.gather(1, j)
    return m, z, v, vals, ids


def _gold_rows(T, lo, hi):
    """own [M] bool: the targets among this shard's rows; rows [M]: their local row, 0 for
    the others (whose terms the callers zero: masks, not boolean indexing, which would make
    the host wait for the GPU)."""
    own = (T >= lo) & (T < hi)
    return own, torch.where(own, T - lo, 0).long()


def _candidate_winners(plan: _Plan, vals, width):
    """R2: this shard's sorted candidate scores [M, k_r] go to the owners; the owner's
    [W, M_r, width] (padded with -inf) give the global top-k. Returns, per owner mention and
    shard, how many of that shard's candidates won: [M_r, W]."""
    comm = plan.comm
    padded = F.pad(vals, (0, width - vals.shape[1]), value=-math.inf)
    (got,) = comm.to_owners([padded], plan.counts)  # [W, M_r, width]
    mine = got.shape[1]
    flat = got.permute(1, 0, 2).reshape(mine, comm.world * width)
    _, j = flat.topk(min(plan.k, plan.num_entities), dim=1)
    won = torch.zeros(mine, comm.world, dtype=torch.int32, device=vals.device)
    return won.scatter_add_(1, torch.div(j, width, rounding_mode="floor"), torch.ones_like(j, dtype=torch.int32))


def _fused_forward(plan: _Plan, M: int) -> bool:
    """Whether the forward over M mentions (all workers') runs the fused kernels: with
    memory_impl=triton, for the full softmax (retrieval with k = all, or lse only); top-k
    retrieval takes the chunked pass for its candidates."""
    return plan.fused is not None and M > 0 and (plan.k is None or not plan.retrieve)


class _Attend(torch.autograd.Function):
    """One sharded memory access: (h [M_r, d], E_r, targets) -> (E_m [M_r, d], lse [M_r],
    gold [M_r]) for this worker's mentions. Forward and backward each run a fixed sequence
    of collectives (see the module docstring)."""

    @staticmethod
    def forward(ctx, h, weight, targets, plan: _Plan):
        comm, counts = plan.comm, plan.counts
        E = weight.detach()
        cd, acc = E.dtype, _acc_dtype(E.dtype)
        d = E.shape[1]
        # R1: all queries (and targets) to every shard.
        send = [h.detach().to(cd)]
        if plan.has_targets:
            send.append(targets.to(torch.int32 if plan.num_entities < 2**31 else torch.int64))
        got = comm.gather_rows(send, counts)
        H = got[0]
        T = got[1].long() if plan.has_targets else None
        M = H.shape[0]

        dense_v = plan.retrieve and plan.k is None
        if _fused_forward(plan, M):
            # The fused kernels give this shard's normalised R and lse: as partials, m = lse, z = 1.
            R_loc, m = block_forward(H.to(plan.fused), cast_rows(weight, plan.fused), dense_v, "triton")
            z, v = torch.ones_like(m), R_loc
            vals, ids = torch.empty(M, 0, dtype=acc, device=H.device), torch.empty(M, 0, dtype=torch.long, device=H.device)
        else:
            m, z, v, vals, ids = _local_pass(H, E, plan.k if plan.retrieve else None, True, dense_v, plan.chunk_rows, acc)
        z_sel = z
        chosen = torch.empty(M, dtype=torch.int32, device=H.device)
        if plan.retrieve and plan.k is not None:
            width = min(plan.k, plan.max_shard_rows)
            won = _candidate_winners(plan, vals, width)  # [M_r, W]
            # R3: each shard learns how many of its candidates won, for all M mentions.
            (chosen,) = comm.exchange(
                [won.T.contiguous().reshape(-1)], [counts[comm.rank]] * comm.world, counts
            )
            sel = torch.arange(vals.shape[1], device=H.device)[None, :] < chosen[:, None]
            w = torch.exp(vals - m[:, None]) * sel
            z_sel = w.sum(1)
            if vals.shape[1] and M:
                v = F.embedding_bag(ids, E, per_sample_weights=w.to(cd), mode="sum").to(acc)
            else:
                v = torch.zeros(M, d, dtype=acc, device=H.device)
        gold = torch.zeros(M, dtype=acc, device=H.device)
        if plan.has_targets:
            own, rows = _gold_rows(T, plan.lo, plan.hi)
            gold = torch.where(own, (H.to(acc) * E[rows].to(acc)).sum(-1), 0)

        # R4: partials to the owners, who merge them.
        part = torch.stack([z, z_sel, gold, m], 1)
        if plan.retrieve:
            part = torch.cat([v, part], 1)
        (P,) = comm.to_owners([part], counts)  # [W, M_r, d' + 4]
        ms = P[..., -1]
        m_all = ms.amax(0)
        scale = torch.exp(ms - m_all)
        z_all = (scale * P[..., -4]).sum(0)
        zsel_all = (scale * P[..., -3]).sum(0)
        gold_all = P[..., -2].sum(0)
        lse = m_all + torch.log(z_all)
        if plan.retrieve:
            R = (scale[..., None] * P[..., :d]).sum(0) / zsel_all[:, None]
        else:
            R = torch.zeros(counts[comm.rank], 0, dtype=acc, device=H.device)

        ctx.plan = plan
        ctx.h_dtype = h.dtype
        ctx.save_for_backward(
            weight, H, T if T is not None else H.new_empty(0), vals, ids, chosen, R, z_all, zsel_all, m_all
        )
        return R.to(E.dtype), lse, gold_all

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_R, g_lse, g_gold):
        plan: _Plan = ctx.plan
        comm, counts = plan.comm, plan.counts
        weight, H, T, vals, ids, chosen, R, z_all, zsel_all, m_all = ctx.saved_tensors
        E = weight.detach()
        cd, acc = E.dtype, _acc_dtype(E.dtype)
        d = E.shape[1]
        M = H.shape[0]

        # B1: what every shard needs about the gradients of this worker's outputs.
        cols = [
            ((g_R.to(acc) * R).sum(1) / zsel_all) if plan.retrieve else torch.zeros_like(z_all),
            g_lse.to(acc) / z_all,
            g_gold.to(acc) if plan.has_targets else torch.zeros_like(z_all),
            m_all,
        ]
        msg = torch.stack(cols, 1)
        if plan.retrieve:
            msg = torch.cat([g_R.to(acc) / zsel_all[:, None], msg], 1)
        (B,) = comm.gather_rows([msg], counts)  # [M, d' + 4]
        U = B[:, :d] if plan.retrieve else None
        b, e, gg, m = B[:, -4], B[:, -3], B[:, -2], B[:, -1]

        dense_sel = plan.retrieve and plan.k is None
        if plan.fused is not None and M:
            # Same dS with P = exp(S - m), dO = U (dense) and delta = b - e: the fused backward.
            delta = (b if dense_sel else torch.zeros_like(b)) - e
            gH, gE = block_backward(
                H.to(plan.fused), cast_rows(weight, plan.fused), U if dense_sel else None, m, delta, "triton"
            )
            chunks = range(0)
        else:
            gE = torch.zeros(E.shape, dtype=acc, device=E.device)
            gH = torch.zeros(M, d, dtype=acc, device=E.device)
            chunks = range(0, E.shape[0], plan.chunk_rows)
        Hc = H.to(cd)
        Uc = U.to(cd) if dense_sel else None
        for a in chunks:
            Ec = E[a : a + plan.chunk_rows]
            Q = torch.exp((Hc @ Ec.T).to(acc) - m[:, None])
            gS = Q * e[:, None]
            if dense_sel:
                gS = gS + Q * ((Uc @ Ec.T).to(acc) - b[:, None])
                gE[a : a + plan.chunk_rows] = (gS.T.to(cd) @ Hc).to(acc) + (Q.T.to(cd) @ Uc).to(acc)
            else:
                gE[a : a + plan.chunk_rows] = (gS.T.to(cd) @ Hc).to(acc)
            gH += (gS.to(cd) @ Ec).to(acc)

        if plan.retrieve and plan.k is not None and vals.shape[1] and M:
            # Top-k retrieval: the selected candidates only, in blocks of mentions.
            kr = vals.shape[1]
            sel = torch.arange(kr, device=E.device)[None, :] < chosen[:, None]
            w = torch.exp(vals - m[:, None]) * sel  # [M, k_r]
            block = max(1, (plan.chunk_rows * max(M, 1)) // (kr * d))
            for s in range(0, M, block):
                rows = ids[s : s + block]
                Eg = E[rows].to(acc)  # [B, k_r, d]
                Ub = U[s : s + block]
                coef = w[s : s + block] * (torch.einsum("bkd,bd->bk", Eg, Ub) - b[s : s + block, None])
                gH[s : s + block] += torch.einsum("bk,bkd->bd", coef, Eg)
                contrib = coef[..., None] * H[s : s + block, None, :].to(acc)
                contrib = contrib + w[s : s + block, :, None] * Ub[:, None, :]
                gE.index_add_(0, rows.reshape(-1), contrib.reshape(-1, d))

        if plan.has_targets:
            own, rows = _gold_rows(T, plan.lo, plan.hi)
            g_own = torch.where(own, gg, 0)[:, None]
            gE.index_add_(0, rows, g_own * H.to(acc))
            gH += g_own * E[rows].to(acc)

        # B2: partial query gradients to their owners.
        (parts,) = comm.to_owners([gH], counts)
        g_h = parts.sum(0).to(ctx.h_dtype)
        g_E = (gE * plan.grad_scale).to(E.dtype) if ctx.needs_input_grad[1] else None
        return (g_h if ctx.needs_input_grad[0] else None), g_E, None, None


# ----------------------------------------------------------------------------- the module


_ERRORS = {1: "h must be [M, dim]", 2: "targets must be [M] integers in [-1, num_entities)"}


def exchange_counts(counts: list[int], group=None) -> list[list[int]]:
    """R0 ahead of time: this worker's mention counts for its next table calls (the same
    number of calls on every worker) -> [call][worker] counts for `ShardedEntityTable.expect`.
    A collective over `group` (a gloo group: host tensors); with one worker, no communication."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return [[c] for c in counts]
    mine = torch.tensor(counts, dtype=torch.int64)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts, 1).tolist()


class ShardedEntityTable(nn.Module):
    """E [num_entities, dim], rows split over the workers of `group` (default: the default
    process group if initialized, else one worker owning everything).

    `weight` is this worker's rows [lo, hi). Initialisation is N(0, init_std^2) drawn in fixed
    blocks of rows from `seed`, so the table is the same whatever the number of workers.
    `chunk_rows` bounds the [M, chunk_rows] score blocks held at once. `pretune_margin`
    (memory_impl=triton): at the first fused call of each kernel variant, the kernels are
    autotuned for the mention-count buckets within that fraction of the call's count too
    (`_pretune`), so that a later step's count does not stall the run to tune them.
    """

    INIT_BLOCK = 4096

    def __init__(
        self,
        num_entities: int,
        dim: int,
        group=None,
        init_std: float = 0.02,
        trainable: bool = True,
        seed: int = 0,
        chunk_rows: int = 65536,
        grad_average: bool = True,
        memory_impl: str = "auto",
        device=None,
        dtype: torch.dtype | None = None,
        pretune_margin: float = 0.0,
    ):
        super().__init__()
        if num_entities < 1 or dim < 1 or chunk_rows < 1:
            raise ValueError("num_entities, dim and chunk_rows must be positive")
        self._comm = _Comm(group)
        self.num_entities, self.dim = num_entities, dim
        self.rank, self.world_size = self._comm.rank, self._comm.world
        self.lo, self.hi = shard_bounds(num_entities, self.world_size, self.rank)
        self.max_shard_rows = shard_bounds(num_entities, self.world_size, 0)[1]
        self.chunk_rows = chunk_rows
        if memory_impl not in ("auto", "dense", "chunked", "triton"):
            raise ValueError(f"memory_impl must be auto, dense, chunked or triton, got {memory_impl!r}")
        # dense and chunked both run the PyTorch chunked pass (E is never in one piece here);
        # auto and triton the fused kernels where they run (CUDA), the chunked pass elsewhere.
        self.memory_impl = memory_impl
        if not 0.0 <= pretune_margin < 1.0:
            raise ValueError(f"pretune_margin must be in [0, 1), got {pretune_margin}")
        self.pretune_margin = pretune_margin
        self.pretuned: set[tuple[bool, int]] = set()  # (RETRIEVE, bucket) tuned ahead by `_pretune`
        self._pretune_seen: set[bool] = set()  # the RETRIEVE variants past their first fused call
        self.grad_average = grad_average
        rows = torch.empty(self.hi - self.lo, dim, dtype=dtype or torch.float32)
        for block in range(self.lo // self.INIT_BLOCK, -(-self.hi // self.INIT_BLOCK)):
            start = block * self.INIT_BLOCK
            gen = torch.Generator().manual_seed(seed * 1_000_003 + block)
            values = torch.randn(self.INIT_BLOCK, dim, generator=gen) * init_std
            a, b = max(start, self.lo), min(start + self.INIT_BLOCK, self.hi)
            rows[a - self.lo : b - self.lo] = values[a - start : b - start]
        self.weight = nn.Parameter(rows.to(device), requires_grad=trainable)
        self._expected: deque[list[int]] = deque()  # `expect`: R0 done ahead for the next calls

    @property
    def timer(self):
        """A `SpanTimer` (eae_platform.pretrain.profiling) that times every exchange of this
        table's calls as "exchange"; None (default): not timed."""
        return self._comm.timer

    @timer.setter
    def timer(self, timer) -> None:
        self._comm.timer = timer

    def extra_repr(self) -> str:
        rows = f"rows=[{self.lo}, {self.hi}), shards={self.world_size}"
        return f"num_entities={self.num_entities}, dim={self.dim}, {rows}"

    @torch.no_grad()
    def load_full(self, matrix: torch.Tensor) -> None:
        """Take this worker's rows from a full [num_entities, dim] matrix."""
        if tuple(matrix.shape) != (self.num_entities, self.dim):
            raise ValueError(f"expected [{self.num_entities}, {self.dim}], got {list(matrix.shape)}")
        self.weight.copy_(matrix[self.lo : self.hi])

    def expect(self, counts: list[list[int]]) -> None:
        """The next len(counts) calls' mention counts on every worker ([call][worker], from
        `exchange_counts`): those calls skip R0. A call whose own count differs raises; a
        bad input then raises on this worker only (R0 would raise on all), so the caller
        checks its inputs first, as the training loop's `data.collate` does."""
        if self._expected:
            raise RuntimeError(f"{len(self._expected)} expected table call(s) of the previous step were not made")
        self._expected.extend(list(c) for c in counts)

    def _check(self, h: torch.Tensor, targets: torch.Tensor | None) -> list[int]:
        error = 0
        if h.dim() != 2 or h.shape[1] != self.dim:
            error = 1
        elif targets is not None:
            if targets.shape != (h.shape[0],) or targets.dtype.is_floating_point:
                error = 2
            else:
                in_range = ((targets >= UNLINKED) & (targets < self.num_entities)).all()
                if targets.device.type == "cpu":
                    error = 0 if bool(in_range) else 2
                else:
                    # bool() would make the host wait for the GPU at every call; the device
                    # checks instead and stops the process with this message (EaEModel has
                    # already checked its mentions' entity ids with clear errors).
                    torch._assert_async(in_range, _ERRORS[2])
        count = h.shape[0] if h.dim() == 2 else 0
        if self._expected:
            counts = self._expected.popleft()
            if error or counts[self.rank] != count:
                self._expected.clear()
                raise ValueError(_ERRORS[error] if error else
                                 f"this call has {count} mentions, {counts[self.rank]} were expected (`expect`)")
            return counts
        counts, errors = self._comm.sizes(count, error, h.device)
        bad = [f"worker {w}: {_ERRORS[code]}" for w, code in enumerate(errors) if code]
        if bad:
            raise ValueError("; ".join(bad))
        return counts

    def attend(
        self, h: torch.Tensor, k: int | None = None, targets: torch.Tensor | None = None, retrieve: bool = True
    ) -> TableOutput:
        """The memory access for this worker's mentions: h [M_r, dim] pseudo entity embeddings,
        k the retrieval top-k (None or >= num_entities: softmax over all), targets [M_r] gold
        entity ids (-1 = unlinked) for the EL loss. retrieve=False computes only lse, gold and
        the loss (the EntityPred head), and without targets nothing. A collective (but for that
        last case): see the module docstring."""
        if k is not None and k < 1:
            raise ValueError("k must be None or >= 1")
        if not retrieve and targets is None:
            # Nothing asked (EntityPred given spans without entity ids, as in an evaluation,
            # whose predictions are `top_k`), so no collective: every worker's forward takes
            # this branch alike (EaEModel.table_call_sizes counts no call here).
            return TableOutput(retrieved=None, lse=None, gold=None, loss=None)
        counts = self._check(h, targets)
        plan = _Plan(
            comm=self._comm,
            counts=counts,
            lo=self.lo,
            hi=self.hi,
            num_entities=self.num_entities,
            max_shard_rows=self.max_shard_rows,
            k=None if k is None or k >= self.num_entities else int(k),
            retrieve=retrieve,
            has_targets=targets is not None,
            chunk_rows=self.chunk_rows,
            grad_scale=1.0 / self.world_size if self.grad_average else 1.0,
            fused=compute_dtype(h, self.weight) if self._fused(h) else None,
        )
        self._pretune(plan, sum(counts))
        retrieved, lse, gold = _Attend.apply(h, self.weight, targets, plan)
        loss = None
        if targets is not None:
            linked = targets != UNLINKED
            # where() rather than [linked]: boolean indexing is a host sync
            loss = torch.where(linked, lse - gold, 0).sum() / linked.sum().clamp(min=1)
        return TableOutput(
            retrieved=retrieved if retrieve else None,
            lse=lse,
            gold=gold if targets is not None else None,
            loss=loss,
        )

    forward = attend

    def _fused(self, h: torch.Tensor) -> bool:
        """Whether this call runs the fused Triton kernels: memory_impl=triton where they run
        (CUDA, or Triton's interpreter), auto on CUDA (fused_memory.resolve_impl)."""
        if self.memory_impl == "triton":
            return fused_memory.triton_runs_on(h)
        return fused_memory.resolve_impl(self.memory_impl, h) == "triton"

    def _pretune(self, plan: _Plan, M: int) -> None:
        """At the first call of each kernel variant (RETRIEVE: the memory's retrieval; not:
        EntityPred's lse only) that runs the fused kernels, tune them for the m_key buckets of
        the counts within pretune_margin of M, the mentions of all workers that this shard's
        kernels see. A step's count moves around its mean, and the first one past a power of two
        would otherwise stall that step for seconds while Triton times every config. Local to
        this worker (no collective), so the same with counts from `expect`."""
        if plan.retrieve in self._pretune_seen or not _fused_forward(plan, M):
            return
        self._pretune_seen.add(plan.retrieve)
        from eae_model.kernels import triton_memory

        E = cast_rows(self.weight, plan.fused)  # the parameter's cached cast, which the call then reuses
        for bucket in triton_memory.pretune_buckets(M, self.pretune_margin):
            triton_memory.pretune(E, bucket, plan.retrieve)
            self.pretuned.add((plan.retrieve, bucket))

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k highest scores h.E_j over all entities and their global ids, [M_r, k] each,
        sorted (k is capped at num_entities). Prediction (EntityPred argmax, serving)."""
        if k < 1:
            raise ValueError("k must be >= 1")
        counts = self._check(h, None)
        comm, E = self._comm, self.weight.detach()
        acc = _acc_dtype(E.dtype)
        k = min(k, self.num_entities)
        (H,) = comm.gather_rows([h.detach().to(E.dtype)], counts)
        _, _, _, vals, ids = _local_pass(H, E, k, False, False, self.chunk_rows, acc)
        width = min(k, self.max_shard_rows)
        pad = width - vals.shape[1]
        vals = F.pad(vals, (0, pad), value=-math.inf)
        ids = F.pad(ids + self.lo, (0, pad), value=-1)
        got_v, got_i = comm.to_owners([vals, ids], counts)  # [W, M_r, width]
        mine = got_v.shape[1]
        flat_v = got_v.permute(1, 0, 2).reshape(mine, comm.world * width)
        flat_i = got_i.permute(1, 0, 2).reshape(mine, comm.world * width)
        scores, j = flat_v.topk(k, dim=1)
        return scores, flat_i.gather(1, j)

    # Checkpoints hold this worker's rows and which rows they are.
    def get_extra_state(self):
        return {"lo": self.lo, "hi": self.hi, "num_entities": self.num_entities, "dim": self.dim}

    def set_extra_state(self, state) -> None:
        mine = self.get_extra_state()
        if state != mine:
            raise ValueError(
                f"checkpoint holds rows [{state['lo']}, {state['hi']}) of {state['num_entities']} x {state['dim']}, "
                f"this worker owns [{self.lo}, {self.hi}) of {self.num_entities} x {self.dim}: reshard with "
                "ShardedEntityTable.full_from_shards and load_full"
            )

    @staticmethod
    def full_from_shards(state_dicts: list[dict], prefix: str = "") -> torch.Tensor:
        """The full matrix from every worker's state dict (offline resharding, export)."""
        parts = sorted(
            ((sd[prefix + "_extra_state"], sd[prefix + "weight"]) for sd in state_dicts), key=lambda p: p[0]["lo"]
        )
        end = 0
        for info, rows in parts:
            if info["lo"] != end or rows.shape[0] != info["hi"] - info["lo"]:
                raise ValueError(f"shards do not tile the table: rows [{info['lo']}, {info['hi']}) after {end}")
            end = info["hi"]
        if end != parts[-1][0]["num_entities"]:
            raise ValueError(f"shards cover {end} of {parts[-1][0]['num_entities']} rows")
        return torch.cat([rows for _, rows in parts])


def bytes_per_step(
    num_mentions_total: int,
    dim: int,
    k: int | None,
    shards: int,
    dtype_bytes: int = 4,
    num_entities: int | None = None,
    targets: bool = True,
    retrieve: bool = True,
) -> dict:
    """Bytes sent per step by one `attend` call (forward + backward), per message, summed over
    all workers (exact for any split of the mentions) and per worker (the mean). k is taken as
    the per-shard candidate count k' = min(k, ceil(N / W)) when num_entities is given; k None
    (or >= num_entities) is the full softmax. `replicated_allreduce_per_worker` (with
    num_entities) is what a ring all-reduce of a replicated table's gradient would send."""
    M, d, W, q = num_mentions_total, dim, shards, dtype_bytes
    a = max(q, 4)
    topk = retrieve and k is not None and (num_entities is None or k < num_entities)
    width = (min(k, -(-num_entities // W)) if num_entities is not None else k) if topk else 0
    dv = d if retrieve else 0
    per_mention = {
        "queries": d * q + (4 if targets else 0),
        "candidates": width * a,
        "prefix_lengths": 4 if topk else 0,
        "partials": (dv + 4) * a,
        "output_grads": (dv + 4) * a,
        "query_grads": d * a,
    }
    messages = {name: (W - 1) * M * b for name, b in per_mention.items()}
    messages["sizes"] = 16 * W * (W - 1)
    total = sum(messages.values())
    out = {
        "messages": messages,
        "bytes_per_mention": sum(per_mention.values()),
        "total": total,
        "per_worker": total / W,
    }
    if num_entities is not None:
        out["replicated_allreduce_per_worker"] = 2 * (W - 1) / W * num_entities * d * a
    return out
