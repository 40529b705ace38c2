"""Triton kernels for the entity table on GPUs: the fused full-softmax memory (forward and
recompute backward, the interface of eae_model.kernels.fused_memory.block_forward/block_backward).

Shapes are the paper's: few queries (M ~ 1k mentions per step) against many rows (N = 1M),
d = 256. So the work is split over N, flash-decoding style: a program owns BLOCK_M queries and
one slice of the rows, keeps a running max, sum and weighted sum for its slice, and the slices
are merged in PyTorch (a few MB). Programs that share a slice of E are launched next to each
other (queries vary fastest) so E is read from HBM about once per pass.

Imported only when memory_impl=triton is used: needs triton and CUDA, or Triton's interpreter
(TRITON_INTERPRET=1 before triton is imported), which runs them on CPU tensors with numpy: how
the CPU tests check them (tests/eae_model/test_triton_kernels.py). The interpreter's switch and
the helpers the kernels share with the top-k kernels: eae_model.kernels.common.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from eae_model.kernels.common import check, m_key, multiprocessors, tuned

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)  # kernels may only read constexpr globals


_SPLIT_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 2), (64, 64, 8, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3)]
]
_SPLIT_CONFIGS = tuned(_SPLIT_CONFIGS, _SPLIT_CONFIGS[0])


@triton.autotune(configs=_SPLIT_CONFIGS, key=["M_KEY", "D", "RETRIEVE", "ROWS"], reset_to_zero=[])
@triton.jit
def _forward_kernel(
    H, E, ACC, MAX, SUM, M, M_KEY, N, ROWS, D: tl.constexpr, RETRIEVE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Program (query block, slice s of ROWS rows): per query the slice's max m, sum of
    exp(S - m) and (RETRIEVE) sum of exp(S - m) E_j, unnormalised, into [splits, M, ...]."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(H + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < M, other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    start = pid_s * ROWS
    end = tl.minimum(start + ROWS, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        e = tl.load(E + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < end, other=0.0)
        s = tl.dot(q, tl.trans(e), input_precision=PRECISION) * _LOG2E  # base-2 scores: exp2 is the fast instruction
        s = tl.where(offs_n[None, :] < end, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if RETRIEVE:
            acc = acc * alpha[:, None] + tl.dot(p.to(e.dtype), e, input_precision=PRECISION)
        m_i = m_new
    out = pid_s * M + offs_m
    tl.store(MAX + out, m_i, mask=offs_m < M)
    tl.store(SUM + out, l_i, mask=offs_m < M)
    if RETRIEVE:
        tl.store(ACC + out[:, None] * D + offs_d[None, :], acc, mask=offs_m[:, None] < M)


@triton.autotune(configs=_SPLIT_CONFIGS, key=["M_KEY", "D", "RETRIEVE", "ROWS"], reset_to_zero=[])
@triton.jit
def _grad_h_kernel(
    H, E, DO, LSE, DELTA, DH, M, M_KEY, N, ROWS, D: tl.constexpr, RETRIEVE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Program (query block, slice s): dH partial = sum over the slice of dS E, into [splits, M, D]."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < M
    q = tl.load(H + offs_m[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    if RETRIEVE:
        do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + offs_m, mask=row_ok, other=float("inf")) * _LOG2E
    delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    start = pid_s * ROWS
    end = tl.minimum(start + ROWS, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        e = tl.load(E + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < end, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(e), input_precision=PRECISION) * _LOG2E - lse[:, None])
        if RETRIEVE:
            ds = p * (tl.dot(do, tl.trans(e), input_precision=PRECISION) - delta[:, None])
        else:
            ds = p * (-delta[:, None])
        dq += tl.dot(ds.to(e.dtype), e, input_precision=PRECISION)
    out = pid_s * M + offs_m
    tl.store(DH + out[:, None] * D + offs_d[None, :], dq, mask=row_ok[:, None])


_ROW_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 2), (64, 64, 8, 2), (32, 128, 8, 2), (64, 128, 8, 2), (32, 64, 4, 3)]
]
_ROW_CONFIGS = tuned(_ROW_CONFIGS, _ROW_CONFIGS[-1])


# restore_value: with ACCUMULATE the kernel adds into DE, and autotuning runs it once per config.
@triton.autotune(configs=_ROW_CONFIGS, key=["M_KEY", "D", "RETRIEVE"], restore_value=["DE"])
@triton.jit
def _grad_e_kernel(
    H, E, DO, LSE, DELTA, DE, M, M_KEY, N, D: tl.constexpr, RETRIEVE: tl.constexpr, PRECISION: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Program (block of BLOCK_N rows of E): dE rows = sum over all queries of dS^T H + P^T dO,
    computed transposed (rows of E x queries) so each program owns its output rows.
    ACCUMULATE: added to what DE holds (the table's gradient from another call)."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    row_ok = offs_n < N
    e = tl.load(E + offs_n[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    de = tl.zeros([BLOCK_N, D], tl.float32)
    for m0 in range(0, M, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        q_ok = offs_m < M
        q = tl.load(H + offs_m[:, None] * D + offs_d[None, :], mask=q_ok[:, None], other=0.0)
        lse = tl.load(LSE + offs_m, mask=q_ok, other=float("inf")) * _LOG2E
        delta = tl.load(DELTA + offs_m, mask=q_ok, other=0.0)
        pt = tl.exp2(tl.dot(e, tl.trans(q), input_precision=PRECISION) * _LOG2E - lse[None, :])  # [BLOCK_N, BLOCK_M]
        if RETRIEVE:
            do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :], mask=q_ok[:, None], other=0.0)
            dst = pt * (tl.dot(e, tl.trans(do), input_precision=PRECISION) - delta[None, :])
            de += tl.dot(pt.to(e.dtype), do, input_precision=PRECISION)
        else:
            dst = pt * (-delta[None, :])
        de += tl.dot(dst.to(e.dtype), q, input_precision=PRECISION)
    if ACCUMULATE:
        de += tl.load(DE + offs_n[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    tl.store(DE + offs_n[:, None] * D + offs_d[None, :], de.to(DE.dtype.element_ty), mask=row_ok[:, None])


def _splits(M: int, N: int, device: torch.device, block_m: int = 64) -> tuple[int, int]:
    """(number of slices of E, rows per slice): about 4 programs per SM in all, the same for
    every M of one m_key (a key of the autotuning too)."""
    sms = multiprocessors(device)
    blocks = max(1, math.ceil(m_key(M) / block_m))
    splits = max(1, min(math.ceil(4 * sms / blocks), math.ceil(N / 128)))
    rows = math.ceil(N / splits / 128) * 128  # a multiple of every BLOCK_N
    return math.ceil(N / rows), rows


def _precision(E: torch.Tensor) -> str:
    """tl.dot's input precision: float32 inputs as PyTorch's own float32 matmuls would run
    (TF32 only where torch.backends.cuda.matmul.allow_tf32 says so); ignored for bf16/fp16."""
    return "tf32" if E.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"


def memory_forward(H: torch.Tensor, E: torch.Tensor, retrieve: bool):
    """block_forward on the GPU: H [M, d], E [N, d] (bf16/fp16/fp32) -> (R [M, d] fp32 | None, lse [M] fp32)."""
    check(H, E)
    M, D = H.shape
    N = E.shape[0]
    if M == 0:  # a batch without mentions: nothing to launch
        return (H.new_zeros(0, D, dtype=torch.float32) if retrieve else None), H.new_zeros(0, dtype=torch.float32)
    splits, rows = _splits(M, N, H.device)
    mx = torch.empty(splits, M, device=H.device, dtype=torch.float32)
    sm = torch.empty_like(mx)
    acc = torch.empty(splits, M, D, device=H.device, dtype=torch.float32) if retrieve else mx
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
    _forward_kernel[grid](H, E, acc, mx, sm, M, m_key(M), N, rows, D=D, RETRIEVE=retrieve, PRECISION=_precision(E))
    # Merge the slices (base-2 maxima).
    m = mx.amax(0)
    w = torch.exp2(mx - m)
    z = (w * sm).sum(0)
    lse = (m + torch.log2(z)) / LOG2E
    R = torch.einsum("sm,smd->md", w, acc) / z[:, None] if retrieve else None
    return R, lse


def memory_backward(H, E, dO, lse, delta, need_dh: bool = True, into: torch.Tensor | None = None):
    """block_backward on the GPU -> (dH [M, d] fp32 or None, dE [N, d] fp32). into: a
    contiguous float32 [N, d] that dE is added to in place (and returned)."""
    check(H, E)
    M, D = H.shape
    N = E.shape[0]
    if M == 0:
        de = E.new_zeros(N, D, dtype=torch.float32) if into is None else into
        return (H.new_zeros(0, D, dtype=torch.float32) if need_dh else None), de
    retrieve = dO is not None
    dO = dO.to(H.dtype).contiguous() if retrieve else H
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    dh = None
    if need_dh:
        splits, rows = _splits(M, N, H.device)
        dh = torch.empty(splits, M, D, device=H.device, dtype=torch.float32)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
        _grad_h_kernel[grid](H, E, dO, lse, delta, dh, M, m_key(M), N, rows, D=D, RETRIEVE=retrieve, PRECISION=_precision(E))
    de = torch.empty(N, D, device=H.device, dtype=torch.float32) if into is None else into
    grid_e = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    _grad_e_kernel[grid_e](H, E, dO, lse, delta, de, M, m_key(M), N, D=D, RETRIEVE=retrieve, PRECISION=_precision(E),
                           ACCUMULATE=into is not None)
    return (dh.sum(0) if need_dh else None), de


def pretune_buckets(M: int, margin: float) -> list[int]:
    """The m_key buckets, sorted, of the counts in [floor(M (1 - margin)), ceil(M (1 + margin))]
    (counts >= 1) other than M's own: where a mention count that moves around M by up to
    `margin` of it lands, and what `pretune` can tune ahead of time."""
    lo, hi = max(1, math.floor(M * (1 - margin))), math.ceil(M * (1 + margin))
    if hi < lo:
        return []
    buckets, b = [], m_key(lo)
    while b <= m_key(hi):
        buckets.append(b)
        b *= 2
    return [b for b in buckets if b != m_key(M)]


@torch.no_grad()
def pretune(E: torch.Tensor, M: int, retrieve: bool) -> None:
    """Run the memory kernels, forward and backward (with dH), on M random queries against
    E [N, d], results discarded: Triton's autotuner then times its configs for m_key(M) and
    this E's rows, dim and dtype now (the queries are in E's dtype, as a table call's are: the
    tensors' dtypes are part of the autotuning key).

    Why: a mention count that first crosses into a new power-of-two bucket otherwise re-times
    every config at that step, a 3-15 s stall in the middle of a pretraining run
    (docs/performance.md, benchmarks/autotune_buckets.py); called for the buckets next to the
    first step's count (`pretune_buckets`), the tuning is part of start-up. The queries come from
    a generator of their own, so the global random stream (dropout, masking) is not moved."""
    g = torch.Generator(device=E.device).manual_seed(0)
    d = E.shape[1]
    H = torch.randn(M, d, generator=g, device=E.device, dtype=E.dtype)
    _, lse = memory_forward(H, E, retrieve)
    dO = torch.randn(M, d, generator=g, device=E.device, dtype=E.dtype) if retrieve else None
    delta = torch.randn(M, generator=g, device=E.device, dtype=torch.float32)
    memory_backward(H, E, dO, lse, delta, need_dh=True)
