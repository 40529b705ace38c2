"""The full-softmax entity memory computed over blocks of the entity table, flash-attention
style: the [M, N] score matrix is never materialised.

For queries H [M, d] and the table E [N, d], with S = H E^T:
    lse_i = log sum_j exp(S_ij)                      (the entity-linking loss's normaliser)
    R_i   = sum_j softmax(S)_ij E_j                   (E_m of the memory, k = all)
computed with a running maximum and sum per query over blocks of rows of E. The backward
recomputes each block's scores. With P = exp(S - lse), upstream gradients dO = dL/dR and
g = dL/dlse, and delta_i = dO_i . R_i - g_i:
    dS = P o (dO E^T - delta)          dH = dS E          dE = dS^T H + P^T dO
(with dO = 0 when only lse is wanted, as in the EntityPred head: then dS = -delta o P and
dH = -delta o R, so the forward computes R anyway and the backward skips the dH pass, one
matmul in the forward for two in the backward). These two functions,
`block_forward` and `block_backward`, are the whole interface: `impl="chunked"` runs them in
plain PyTorch (any device, the reference the tests compare against), `impl="triton"` runs the
fused GPU kernels of eae_model.kernels.triton_memory with the same signature. The sharded table
(eae_model.sharded_table) calls the same pair for its local rows.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from eae_data.constants import NULL_ENTITY

IMPLS = ("auto", "dense", "chunked", "triton")


def triton_interpreted() -> bool:
    """Whether TRITON_INTERPRET is on (as Triton reads it): Triton's interpreter then runs the
    kernels on CPU tensors (the CPU tests of impl="triton"; tests/conftest.py turns it on
    where there is no GPU). Read here without importing triton."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes", "y")


def triton_runs_on(t: torch.Tensor) -> bool:
    """Whether impl="triton" takes tensors on t's device: CUDA, or any under the interpreter."""
    return t.is_cuda or triton_interpreted()


def resolve_impl(impl: str, t: torch.Tensor) -> str:
    """The implementation that impl="auto" means for tensors like t: the fused Triton kernels
    on CUDA (1.11x the BERT step at the paper's size on an H100, against 1.64x for dense,
    docs/performance.md), the dense [M, N] logits elsewhere (the fastest on CPUs at the sizes
    CPUs train). Other impls are returned as they are."""
    if impl != "auto":
        return impl
    return "triton" if t.is_cuda and importlib.util.find_spec("triton") is not None else "dense"


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def chunked_forward(
    H: torch.Tensor, E: torch.Tensor, retrieve: bool, chunk_rows: int = 65536
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """H [M, d], E [N, d] (same dtype) -> (R [M, d] float32 or None, lse [M] float32)."""
    M, acc = H.shape[0], _acc(H.dtype)
    m = torch.full((M,), -math.inf, dtype=acc, device=H.device)
    z = torch.zeros(M, dtype=acc, device=H.device)
    v = torch.zeros(M, E.shape[1], dtype=acc, device=H.device) if retrieve else None
    for a in range(0, E.shape[0], chunk_rows):
        Ec = E[a : a + chunk_rows]
        S = (H @ Ec.T).to(acc)
        m_new = torch.maximum(m, S.amax(1))
        alpha = torch.exp(m - m_new)  # rescales what was summed under the old maximum
        P = torch.exp(S - m_new[:, None])
        z = z * alpha + P.sum(1)
        if retrieve:
            v = v * alpha[:, None] + (P.to(E.dtype) @ Ec).to(acc)
        m = m_new
    lse = m + torch.log(z)
    return (v / z[:, None] if retrieve else None), lse


def chunked_backward(
    H: torch.Tensor,
    E: torch.Tensor,
    dO: torch.Tensor | None,
    lse: torch.Tensor,
    delta: torch.Tensor,
    chunk_rows: int = 65536,
    need_dh: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Gradients of the block forward: H [M, d], E [N, d], dO [M, d] (None: lse only),
    lse [M], delta [M] (see the module docstring) -> (dH [M, d] or None when not need_dh,
    dE [N, d]), float32."""
    acc = _acc(H.dtype)
    dH = torch.zeros(H.shape, dtype=acc, device=H.device) if need_dh else None
    dE = torch.empty(E.shape, dtype=acc, device=E.device)
    dOc = dO.to(H.dtype) if dO is not None else None
    for a in range(0, E.shape[0], chunk_rows):
        Ec = E[a : a + chunk_rows]
        P = torch.exp((H @ Ec.T).to(acc) - lse[:, None])
        dP = (dOc @ Ec.T).to(acc) if dO is not None else 0.0
        dS = P * (dP - delta[:, None])
        dE[a : a + chunk_rows] = (dS.T.to(H.dtype) @ H).to(acc)
        if dO is not None:
            dE[a : a + chunk_rows] += (P.T.to(H.dtype) @ dOc).to(acc)
        if need_dh:
            dH += (dS.to(H.dtype) @ Ec).to(acc)
    return dH, dE


def block_forward(H, E, retrieve: bool, impl: str, chunk_rows: int = 65536):
    if impl == "triton":
        from eae_model.kernels.triton_memory import memory_forward

        return memory_forward(H, E, retrieve)
    return chunked_forward(H, E, retrieve, chunk_rows)


def block_backward(H, E, dO, lse, delta, impl: str, chunk_rows: int = 65536, R=None, into=None):
    """R: the forward's normalised R, given when dO is None, gives dH = -delta o R directly.
    into: a float32 [N, d] gradient that dE is added to in place (and returned as dE)."""
    need_dh = dO is not None or R is None
    if impl == "triton":
        from eae_model.kernels.triton_memory import memory_backward

        dH, dE = memory_backward(H, E, dO, lse, delta, need_dh, into)
    else:
        dH, dE = chunked_backward(H, E, dO, lse, delta, chunk_rows, need_dh)
        if into is not None:
            dE = into.add_(dE)
    return (dH if need_dh else -delta[:, None] * R), dE


def compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """bf16/fp16 under autocast (as the dense layer's matmuls would run), else the inputs'."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(h.dtype, weight.dtype)


# Optimizer steps taken in this process, by any optimizer: part of cast_rows' cache key.
# Fused optimizers (torch.optim.Adam(fused=True), what the pretraining loop uses on GPUs) update
# parameters in place without moving their version counter (torch 2.11-2.13), so a key of the
# version alone kept the table's first cast for the whole run: the fused kernels' log-sum-exp
# then read the step-0 rows while the gold score read the current ones, and the entity-linking
# losses fell without bound (to -50,000 in 3,000 steps; docs/results.md).
_optimizer_steps = 0


def _count_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_step)


def cast_rows(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (the float32 entity table) detached, contiguous, in `dtype` (the kernels' bf16).

    A step reads the table up to four times (the memory and EntityPred, forward and backward;
    the sharded table casts in both), and each cast of 1M x 256 floats moves 1.5 GB. The cast
    is therefore kept on the parameter and reused until the parameter changes: an in-place
    update moves its version counter (copy_, add_, non-fused optimizers) or the count of
    optimizer steps (`_optimizer_steps`), both part of the key."""
    w = weight.detach()
    if w.dtype == dtype and w.is_contiguous():
        return w
    key = (dtype, weight._version, _optimizer_steps, w.data_ptr(), tuple(w.shape))
    cached = getattr(weight, "_eae_cast", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    out = w.to(dtype).contiguous()
    if isinstance(weight, torch.nn.Parameter):
        weight._eae_cast = (key, out)
    return out


class _BlockAttention(torch.autograd.Function):
    """(h [M, d], E [N, d], targets [M] or None) -> (R [M, d] or empty, lse [M], gold [M] or
    empty); saves only h, E (in the compute dtype), R and lse. The gold score h . E_t is
    computed here too, so that its gradient is added into the kernel's dE rows in place
    rather than through a second dense [N, d] gradient of E."""

    @staticmethod
    def forward(ctx, h, weight, targets, retrieve: bool, impl: str, chunk_rows: int, cd: torch.dtype):
        H, E = h.detach().to(cd).contiguous(), cast_rows(weight, cd)
        # R also when only lse is returned: the backward then gets dH = g o R for free.
        R, lse = block_forward(H, E, True, impl, chunk_rows)
        gold = lse.new_empty(0)
        linked = rows = None
        if targets is not None:  # unlinked mentions read row 0 and are masked (no host sync)
            linked = (targets != NULL_ENTITY).to(lse.dtype)
            rows = targets.clamp(min=0)
            gold = (H.to(lse.dtype) * E[rows].to(lse.dtype)).sum(-1) * linked
        ctx.retrieve, ctx.impl, ctx.chunk_rows = retrieve, impl, chunk_rows
        ctx.h_dtype, ctx.w_dtype = h.dtype, weight.dtype
        ctx.weight = weight if impl == "triton" and weight.is_leaf and weight.dtype == torch.float32 else None
        ctx.save_for_backward(H, E, R, lse, linked, rows)
        return (R.to(cd) if retrieve else R.new_empty(H.shape[0], 0)), lse, gold

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_R, g_lse, g_gold):
        H, E, R, lse, linked, rows = ctx.saved_tensors
        g_lse = torch.zeros_like(lse) if g_lse is None else g_lse.to(lse.dtype)
        dO = None
        delta = -g_lse
        if ctx.retrieve and g_R is not None:
            dO = g_R.to(lse.dtype)
            delta = (dO * R).sum(1) - g_lse
        # The table's gradient straight into weight.grad, as AccumulateGrad would leave it: the
        # memory and EntityPred both read E, and adding their two dense float32 [N, d]
        # gradients would move 3 GB per step; the second kernel adds into the first's instead.
        grad = ctx.weight.grad if ctx.weight is not None else None
        direct = ctx.weight is not None and ctx.needs_input_grad[1] and (
            grad is None or (grad.dtype == torch.float32 and grad.is_contiguous() and grad.shape == E.shape))
        dH, dE = block_backward(H, E, dO, lse, delta, ctx.impl, ctx.chunk_rows, R, into=grad if direct else None)
        if linked is not None and g_gold is not None:
            g = (g_gold.to(lse.dtype) * linked)[:, None]
            dH += g * E[rows].to(lse.dtype)
            dE.index_add_(0, rows, g * H.to(lse.dtype))
        if direct:
            ctx.weight.grad = dE
            return dH.to(ctx.h_dtype), None, None, None, None, None, None
        return dH.to(ctx.h_dtype), dE.to(ctx.w_dtype), None, None, None, None, None


def block_attention(
    h: torch.Tensor,
    weight: torch.Tensor,
    retrieve: bool = True,
    impl: str = "chunked",
    chunk_rows: int = 65536,
    targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Softmax over all N entities without the [M, N] matrix: h [M, d], weight E [N, d],
    targets [M] (NULL_ENTITY: unlinked) -> (R = softmax(h E^T) E [M, d] or None, lse [M]
    float32, gold [M] = h . E_target float32, 0 where unlinked, or None without targets).
    Differentiable in h and E."""
    if impl not in ("chunked", "triton"):
        raise ValueError(f"block attention impl must be chunked or triton, got {impl!r}")
    if impl == "triton" and not triton_runs_on(h):
        raise ValueError("memory_impl=triton needs CUDA tensors (or TRITON_INTERPRET=1); use chunked on CPU")
    R, lse, gold = _BlockAttention.apply(h, weight, targets, retrieve, impl, chunk_rows, compute_dtype(h, weight))
    return (R if retrieve else None), lse, (gold if targets is not None else None)


def linking_loss_from_lse(lse: torch.Tensor, gold: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over linked mentions: lse - gold (as F.cross_entropy over all E)."""
    linked = targets != NULL_ENTITY
    return ((lse - gold) * linked).sum() / linked.sum().clamp(min=1)
