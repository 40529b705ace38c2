"""Triton kernels for the entity table on GPUs: the fused full-softmax memory (forward and
recompute backward, the interface of eae_model.fused_memory.block_forward/block_backward) and
the candidate pass of exact top-k search (eae_model.exact_topk).

Shapes are the paper's: few queries (M ~ 1k mentions per step) against many rows (N = 1M),
d = 256. So the work is split over N, flash-decoding style: a program owns BLOCK_M queries and
one slice of the rows, keeps a running max, sum and weighted sum for its slice, and the slices
are merged in PyTorch (a few MB). Programs that share a slice of E are launched next to each
other (queries vary fastest) so E is read from HBM about once per pass.

Imported only when memory_impl=triton (or the GPU top-k) is used: needs triton and CUDA.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634

_SPLIT_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 2), (64, 64, 8, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3)]
]


@triton.autotune(configs=_SPLIT_CONFIGS, key=["M", "D", "RETRIEVE", "ROWS"], reset_to_zero=[])
@triton.jit
def _forward_kernel(
    H, E, ACC, MAX, SUM, M, N, ROWS, D: tl.constexpr, RETRIEVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
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
        s = tl.dot(q, tl.trans(e)) * _LOG2E  # base-2 scores: exp2 is the fast instruction
        s = tl.where(offs_n[None, :] < end, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if RETRIEVE:
            acc = acc * alpha[:, None] + tl.dot(p.to(e.dtype), e)
        m_i = m_new
    out = pid_s * M + offs_m
    tl.store(MAX + out, m_i, mask=offs_m < M)
    tl.store(SUM + out, l_i, mask=offs_m < M)
    if RETRIEVE:
        tl.store(ACC + out[:, None] * D + offs_d[None, :], acc, mask=offs_m[:, None] < M)


@triton.autotune(configs=_SPLIT_CONFIGS, key=["M", "D", "RETRIEVE", "ROWS"], reset_to_zero=[])
@triton.jit
def _grad_h_kernel(
    H, E, DO, LSE, DELTA, DH, M, N, ROWS, D: tl.constexpr, RETRIEVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
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
        p = tl.exp2(tl.dot(q, tl.trans(e)) * _LOG2E - lse[:, None])
        if RETRIEVE:
            ds = p * (tl.dot(do, tl.trans(e)) - delta[:, None])
        else:
            ds = p * (-delta[:, None])
        dq += tl.dot(ds.to(e.dtype), e)
    out = pid_s * M + offs_m
    tl.store(DH + out[:, None] * D + offs_d[None, :], dq, mask=row_ok[:, None])


_ROW_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 2), (64, 64, 8, 2), (32, 128, 8, 2), (64, 128, 8, 2), (32, 64, 4, 3)]
]


@triton.autotune(configs=_ROW_CONFIGS, key=["M", "D", "RETRIEVE"], reset_to_zero=[])
@triton.jit
def _grad_e_kernel(
    H, E, DO, LSE, DELTA, DE, M, N, D: tl.constexpr, RETRIEVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Program (block of BLOCK_N rows of E): dE rows = sum over all queries of dS^T H + P^T dO,
    computed transposed (rows of E x queries) so each program owns its output rows."""
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
        pt = tl.exp2(tl.dot(e, tl.trans(q)) * _LOG2E - lse[None, :])  # [BLOCK_N, BLOCK_M]
        if RETRIEVE:
            do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :], mask=q_ok[:, None], other=0.0)
            dst = pt * (tl.dot(e, tl.trans(do)) - delta[None, :])
            de += tl.dot(pt.to(e.dtype), do)
        else:
            dst = pt * (-delta[None, :])
        de += tl.dot(dst.to(e.dtype), q)
    tl.store(DE + offs_n[:, None] * D + offs_d[None, :], de.to(DE.dtype.element_ty), mask=row_ok[:, None])


def _check(H: torch.Tensor, E: torch.Tensor) -> None:
    if not (H.is_cuda and E.is_cuda):
        raise ValueError("the Triton memory kernels need CUDA tensors")
    d = H.shape[1]
    if E.shape[1] != d or d & (d - 1) or d < 16:
        raise ValueError(f"entity dim must be a power of two >= 16 for the Triton kernels, got {d}")


def _splits(M: int, N: int, block_m: int = 64) -> tuple[int, int]:
    """(number of slices of E, rows per slice): about 4 programs per SM in all."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    blocks = max(1, math.ceil(M / block_m))
    splits = max(1, min(math.ceil(4 * sms / blocks), math.ceil(N / 128)))
    rows = math.ceil(N / splits / 128) * 128  # a multiple of every BLOCK_N
    return math.ceil(N / rows), rows


def memory_forward(H: torch.Tensor, E: torch.Tensor, retrieve: bool):
    """block_forward on the GPU: H [M, d], E [N, d] (bf16/fp16/fp32) -> (R [M, d] fp32 | None, lse [M] fp32)."""
    _check(H, E)
    M, D = H.shape
    N = E.shape[0]
    splits, rows = _splits(M, N)
    mx = torch.empty(splits, M, device=H.device, dtype=torch.float32)
    sm = torch.empty_like(mx)
    acc = torch.empty(splits, M, D, device=H.device, dtype=torch.float32) if retrieve else mx
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
    _forward_kernel[grid](H, E, acc, mx, sm, M, N, rows, D=D, RETRIEVE=retrieve)
    # Merge the slices (base-2 maxima).
    m = mx.amax(0)
    w = torch.exp2(mx - m)
    z = (w * sm).sum(0)
    lse = (m + torch.log2(z)) / _LOG2E
    R = torch.einsum("sm,smd->md", w, acc) / z[:, None] if retrieve else None
    return R, lse


def memory_backward(H, E, dO, lse, delta):
    """block_backward on the GPU -> (dH [M, d] fp32, dE [N, d] fp32)."""
    _check(H, E)
    M, D = H.shape
    N = E.shape[0]
    retrieve = dO is not None
    dO = dO.to(H.dtype).contiguous() if retrieve else H
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    splits, rows = _splits(M, N)
    dh = torch.empty(splits, M, D, device=H.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
    _grad_h_kernel[grid](H, E, dO, lse, delta, dh, M, N, rows, D=D, RETRIEVE=retrieve)
    de = torch.empty(N, D, device=H.device, dtype=torch.float32)
    grid_e = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    _grad_e_kernel[grid_e](H, E, dO, lse, delta, de, M, N, D=D, RETRIEVE=retrieve)
    return dh.sum(0), de


# ----------------------------------------------------------------------------- exact top-k


_TOPK_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (64, 128, 4, 3), (128, 256, 8, 3)]
]


@triton.autotune(configs=_TOPK_CONFIGS, key=["D", "CAP", "ROWS"], reset_to_zero=["COUNT"])
@triton.jit
def _candidates_kernel(
    H, E, TAU, COUNT, OUT_S, OUT_I, M, N, ROWS, CAP, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Program (query block, slice of ROWS rows): every score S_ij >= TAU_i is appended to
    query i's list (OUT_S, OUT_I [M, CAP]) at a slot reserved with an atomic counter; COUNT
    ends as the true number of candidates (slots past CAP are not written)."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_ok = offs_m < M
    q = tl.load(H + offs_m[:, None] * D + offs_d[None, :], mask=q_ok[:, None], other=0.0)
    tau = tl.load(TAU + offs_m, mask=q_ok, other=float("inf"))
    start = pid_s * ROWS
    end = tl.minimum(start + ROWS, N)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        e = tl.load(E + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < end, other=0.0)
        s = tl.dot(q, tl.trans(e))
        keep = (s >= tau[:, None]) & (offs_n[None, :] < end)
        if tl.max(keep.to(tl.int32)) > 0:
            slot = tl.atomic_add(COUNT + offs_m[:, None] + 0 * offs_n[None, :], 1, mask=keep)
            ok = keep & (slot < CAP)
            where = offs_m[:, None] * CAP + slot
            tl.store(OUT_S + where, s, mask=ok)
            tl.store(OUT_I + where, offs_n[None, :] + 0 * offs_m[:, None], mask=ok)


def candidates(H: torch.Tensor, E: torch.Tensor, tau: torch.Tensor, cap: int):
    """All (score, row) with H_i . E_j >= tau_i: (scores [M, cap] fp32, -inf padded; ids [M, cap]
    int32; counts [M] int32, the true number, which may exceed cap)."""
    _check(H, E)
    M, D = H.shape
    N = E.shape[0]
    sms = torch.cuda.get_device_properties(H.device).multi_processor_count
    blocks = math.ceil(M / 128)
    splits = max(1, min(math.ceil(2 * sms / blocks), math.ceil(N / 256)))
    rows = math.ceil(N / splits / 256) * 256
    splits = math.ceil(N / rows)
    scores = torch.full((M, cap), -math.inf, device=H.device, dtype=torch.float32)
    ids = torch.full((M, cap), -1, device=H.device, dtype=torch.int32)
    count = torch.zeros(M, device=H.device, dtype=torch.int32)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
    _candidates_kernel[grid](H, E, tau.float().contiguous(), count, scores, ids, M, N, rows, cap, D=D)
    return scores, ids, count
