"""Triton kernels of exact top-k search (eae_model.kernels.exact_topk.tile_top_k): the fused
pass that keeps, per query and tile of TILE_ROWS rows of E, the best score, its row and the
second-best score (tile_top2; on Hopper GPUs eae_model.kernels.hopper_topk's version of it),
the selection of the tiles to read from those (select_tiles), and the float32 rescoring of the
candidates with their top k (rescore_top_k).

The pass reduces keys, not scores: a score's float32 bits with the low log2(TILE_ROWS) = 7
cleared and its column in the tile put there. A key is within 127 units in the last place of
the score, under 2^-16 of it (KEY_ERROR, counted by exact_topk.error_bound), the keys of a tile
are distinct, and the best key carries its own row: its reduction is a maximum and the
second-best a maximum and a minimum more, where tracking the column took a compare and two
selects a score and made ties a special case (measured on an H100: docs/performance.md §3).

Compiled on CUDA, or run by Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 before
triton is imported): how the CPU tests check them (tests/eae_model/test_exact_topk.py).
"""

import math

import torch
import triton
import triton.language as tl

from eae_model.kernels.common import INTERPRET, TILE_ROWS, check, m_key, multiprocessors, tuned

KEY_ERROR = 2.0**-16  # |key - score| < KEY_ERROR |score| (7 low bits of 23 replaced)


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """The pass's keys with their column bits cleared: the scores truncated to 16 bits of
    mantissa (for comparing keys with scores)."""
    return (keys.view(torch.int32) & -TILE_ROWS).view(torch.float32)

# FLAT: one loop over (tile, K chunk) that Triton software-pipelines, the epilogue on each
# tile's last chunk (the persistent-matmul pattern). RESIDENT: the query block is loaded once
# and each tile is one whole-K dot. Small tiles with few warps let two programs share an SM,
# so one program's epilogue overlaps the other's tensor-core work.
_TILE_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_K": bk, "RESIDENT": res}, num_warps=w, num_stages=st)
    for bm, bk, res, w, st in [
        (128, 64, False, 8, 3), (128, 64, False, 8, 4), (128, 64, False, 4, 3), (128, 128, False, 8, 3),
        (256, 64, False, 8, 3), (64, 64, False, 4, 4),
        (128, 256, True, 8, 2), (128, 256, True, 8, 3), (64, 256, True, 4, 3),
    ]
]


_TILE_CONFIGS = tuned(_TILE_CONFIGS, _TILE_CONFIGS[-1])  # the interpreter's: RESIDENT, any d <= 256


def _prune_tile_configs(configs, named_args, **kwargs):
    """Configs that fit d: FLAT needs BLOCK_K dividing d; RESIDENT keeps [BLOCK_M, d] in
    registers, so d <= 256."""
    d = kwargs.get("D", named_args.get("D"))
    return [c for c in configs if (d <= 256 if c.kwargs["RESIDENT"] else d % c.kwargs["BLOCK_K"] == 0)]


@triton.jit
def _tile_epilogue(s, offs_m, offs_t, n0, q_ok, end, TMAX, TARG, TSEC, NT, T: tl.constexpr, MODE: tl.constexpr):
    """Scores s [BLOCK_M, T] of one tile starting at row n0 -> its best key, best row and
    second-best key per query (keys: the module docstring). MODE 2 all three; 1 without the
    second; 0 the best key only (the last two: `eae bench topk`'s measure of what the epilogue
    costs)."""
    out = offs_m * NT + n0 // T
    ok = q_ok & (n0 < end)
    keys = ((s.to(tl.int32, bitcast=True) & -T) | offs_t[None, :]).to(tl.float32, bitcast=True)
    if n0 + T > end:  # the table's last, partial tile only
        keys = tl.where((n0 + offs_t)[None, :] < end, keys, -float("inf"))
    best = tl.max(keys, axis=1)
    tl.store(TMAX + out, best, mask=ok)
    if MODE > 0:
        tl.store(TARG + out, n0 + (best.to(tl.int32, bitcast=True) & (T - 1)), mask=ok)
    if MODE == 2:  # keys are distinct: every other one is below the best
        tl.store(TSEC + out, tl.max(tl.where(keys == best[:, None], -float("inf"), keys), axis=1), mask=ok)


@triton.autotune(configs=_TILE_CONFIGS, key=["M_KEY", "D", "ROWS", "MODE", "PRECISION"],
                 prune_configs_by={"early_config_prune": _prune_tile_configs})
@triton.jit
def _tile_top2_kernel(H, E, TMAX, TARG, TSEC, M, M_KEY, N, NT, ROWS, TILES: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
                      MODE: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RESIDENT: tl.constexpr):
    """Program (query block, slice of ROWS = TILES x T rows): for every query and every tile of
    T rows of E, the best key (TMAX), its row (TARG) and the second-best key (TSEC),
    [M, NT] each; the scores themselves never leave the chip. The loops run TILES times in
    every slice, the last slice's extra tiles masked."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_t = tl.arange(0, T)
    q_ok = offs_m < M
    start = pid_s * ROWS
    end = tl.minimum(start + ROWS, N)
    if RESIDENT:
        offs_d = tl.arange(0, D)
        q = tl.load(H + offs_m[:, None] * D + offs_d[None, :], mask=q_ok[:, None], other=0.0)
        for t in range(0, TILES):
            n0 = start + t * T
            offs_n = n0 + offs_t
            e = tl.load(E + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < end, other=0.0)
            s = tl.dot(q, tl.trans(e), input_precision=PRECISION)
            _tile_epilogue(s, offs_m, offs_t, n0, q_ok, end, TMAX, TARG, TSEC, NT, T, MODE)
    else:
        KT: tl.constexpr = D // BLOCK_K
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, T], tl.float32)
        for it in range(0, TILES * KT):
            kk = it % KT
            n0 = start + (it // KT) * T
            offs_n = n0 + offs_t
            a = tl.load(H + offs_m[:, None] * D + kk * BLOCK_K + offs_k[None, :], mask=q_ok[:, None], other=0.0)
            b = tl.load(E + offs_n[:, None] * D + kk * BLOCK_K + offs_k[None, :], mask=offs_n[:, None] < end, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
            if kk == KT - 1:
                _tile_epilogue(acc, offs_m, offs_t, n0, q_ok, end, TMAX, TARG, TSEC, NT, T, MODE)
                acc = tl.zeros([BLOCK_M, T], tl.float32)


def tile_top2(H: torch.Tensor, E: torch.Tensor, mode: int = 2, kernel: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """H [M, d], E [N, d] -> per query and tile of TILE_ROWS rows: (best key [M, NT] fp32,
    its row id [M, NT] int32, second-best key [M, NT] fp32), NT = ceil(N / TILE_ROWS); keys:
    the module docstring (key_scores clears their column bits).
    mode < 2: see _tile_epilogue (benchmarks only; the missing outputs are left unwritten).
    kernel: "auto" (eae_model.kernels.hopper_topk's pass on a Hopper GPU where it applies, else this
    module's), "hopper" (that one, or an error) or "triton".
    (Measured on an H100: storing [NT, M], each tile's store contiguous, made the pass 2%
    faster but the top-k over tiles 50% slower.)"""
    if kernel not in ("auto", "hopper", "triton"):
        raise ValueError(f"kernel must be auto, hopper or triton, got {kernel!r}")
    hopper = None
    if kernel != "triton" and not INTERPRET:
        from eae_model.kernels import hopper_topk

        hopper = hopper_topk if hopper_topk.supported(H, E) else None
    if kernel == "hopper" and hopper is None:
        raise ValueError("the Hopper pass needs a Hopper GPU, bf16 or fp16 tensors and d <= 256, a multiple of 16")
    if hopper is None:
        check(H, E)
    M, N = H.shape[0], E.shape[0]
    NT = triton.cdiv(N, TILE_ROWS)
    tmax = torch.empty(M, NT, device=H.device, dtype=torch.float32)
    targ = torch.empty(M, NT, device=H.device, dtype=torch.int32)
    tsec = torch.empty(M, NT, device=H.device, dtype=torch.float32)
    if not M:
        return tmax, targ, tsec
    H, E = H.contiguous(), E.contiguous()
    if hopper is not None:  # about three programs per SM (one fits at a time)
        splits, rows = _slices(N, NT, triton.cdiv(M, hopper.BLOCK_M), 3, H.device)
        hopper.tile_top2_into(H, E, tmax, targ, tsec, splits, rows, mode)
    else:  # about two programs per SM
        splits, rows = _slices(N, NT, math.ceil(m_key(M) / 128), 2, H.device)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), splits)  # noqa: E731
        _tile_top2_kernel[grid](H, E, tmax, targ, tsec, M, m_key(M), N, NT, rows, rows // TILE_ROWS,
                                D=H.shape[1], T=TILE_ROWS, MODE=mode,
                                # float32 tables: exact float32 products (the error bound's premise), not TF32
                                PRECISION="ieee" if E.dtype == torch.float32 else "tf32")
    return tmax, targ, tsec


def _slices(N: int, NT: int, blocks: int, per_sm: int, device: torch.device) -> tuple[int, int]:
    """(slices of E side by side, rows per slice: a multiple of 256, so of TILE_ROWS) for about
    per_sm programs per SM over `blocks` query blocks."""
    splits = max(1, min(math.ceil(per_sm * multiprocessors(device) / blocks), NT))
    rows = math.ceil(N / splits / 256) * 256
    return math.ceil(N / rows), rows


_NO_KEY = tl.constexpr(-(2**63))  # rescore_top_k's key for "no candidate": below every other


@triton.jit
def _flip_negative(bits):
    """float32 bits as int32 <-> an int32 ordered as the floats are (negative floats' magnitude
    bits flipped; its own inverse)."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _scored_keys(H, E, row, ids, ok, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """int64 keys of candidate rows ids [C] (ok: which are candidates) for query `row`: the
    float32 score H_row . E_id (exact for bf16, a sum of d products) made an order-preserving
    int32 in the high half, the id in the low (so keys are distinct); _NO_KEY for none."""
    s = tl.zeros(ids.shape, tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        q = tl.load(H + row * D + offs_d).to(tl.float32)
        e = tl.load(E + ids[:, None].to(tl.int64) * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        s += tl.sum(e.to(tl.float32) * q[None, :], axis=1)
    ordered = _flip_negative(s.to(tl.int32, bitcast=True))
    return tl.where(ok, (ordered.to(tl.int64) << 32) | ids.to(tl.int64), _NO_KEY)


@triton.jit
def _rescore_top_k_kernel(H, E, BEST, FLAGGED, NFLAG, KEYS, VALS, IDS, N, KT, FMAX, K,
                          D: tl.constexpr, T: tl.constexpr, BLOCK_D: tl.constexpr, PAIRS: tl.constexpr):
    """Program (one query): its candidates, the best rows BEST[row, :KT] (N: none) and every row
    of its flagged tiles FLAGGED[row, :NFLAG], rescored in float32 as keys (_scored_keys) into
    KEYS[row], T at a time; then each key's rank among them all (how many keys are larger:
    all pairs, T x PAIRS at a time) places the K largest into VALS and IDS, in descending order."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, T)
    best_slots = tl.cdiv(KT, T) * T  # KEYS[row]: the best rows' keys, then T a flagged tile
    C = best_slots + tl.minimum(tl.load(NFLAG + row), FMAX) * T
    CMAX = best_slots + FMAX * T
    for c0 in range(0, KT, T):
        ids = tl.load(BEST + row * KT + c0 + offs, mask=c0 + offs < KT, other=N)
        tl.store(KEYS + row * CMAX + c0 + offs, _scored_keys(H, E, row, ids, ids < N, D, BLOCK_D))
    for c0 in range(best_slots, C, T):
        ids = tl.load(FLAGGED + row * FMAX + (c0 - best_slots) // T) * T + offs
        tl.store(KEYS + row * CMAX + c0 + offs, _scored_keys(H, E, row, ids, ids < N, D, BLOCK_D))
    tl.debug_barrier()  # KEYS written by all of this program's threads before they read it
    for a in range(0, C, T):
        key = tl.load(KEYS + row * CMAX + a + offs)
        rank = tl.zeros([T], tl.int32)
        for b in range(0, C, PAIRS):  # [T, PAIRS] comparisons at a time: [T, T] int64 spilled
            other = tl.load(KEYS + row * CMAX + b + tl.arange(0, PAIRS))
            rank += tl.sum((other[None, :] > key[:, None]).to(tl.int32), axis=1)
        score = _flip_negative((key >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
        keep = (rank < K) & (key != _NO_KEY)
        tl.store(VALS + row * K + rank, score, mask=keep)
        tl.store(IDS + row * K + rank, key & 0x7FFFFFFF, mask=keep)  # ids < 2^31


def rescore_top_k(H: torch.Tensor, E: torch.Tensor, best: torch.Tensor, flagged: torch.Tensor, nflag: torch.Tensor,
                  k: int, block_d: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """select_tiles' candidates for H [M, d] -> (scores [M, k] float32, ids [M, k] int64), the
    top k of them by float32 score, sorted descending (k <= the candidates: select_tiles
    keeps at least k tiles, each with a row). One program a query, none padded to the
    block's largest count of flagged tiles; ranks by all pairs, not a sort (Triton's bitonic
    sort, tl.topk, runs its swaps as reductions with a Python combine under the interpreter:
    ~1 s a merge there)."""
    M, D = H.shape
    KT, FMAX = best.shape[1], flagged.shape[1]
    vals = torch.empty(M, k, device=H.device, dtype=torch.float32)
    ids = torch.empty(M, k, device=H.device, dtype=torch.int64)
    if M:
        keys = torch.empty(M, (triton.cdiv(KT, TILE_ROWS) + FMAX) * TILE_ROWS, device=H.device, dtype=torch.int64)
        _rescore_top_k_kernel[(M,)](H.contiguous(), E, best, flagged, nflag, keys, vals, ids, E.shape[0], KT, FMAX, k,
                                    D=D, T=TILE_ROWS, BLOCK_D=min(block_d, D), PAIRS=32, num_warps=4)
    return vals, ids


@triton.jit
def _group_max(T, row, NT, g0, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """[BLOCK]: the maxima of the row's groups g0 .. g0 + BLOCK of GROUP tile maxima each
    (-inf past the row). (One load a member of the groups: a [BLOCK, GROUP] load held a
    pointer per element and took every register, two programs an SM.)"""
    offs = (g0 + tl.arange(0, BLOCK)) * GROUP
    x = tl.load(T + row * NT + offs, mask=offs < NT, other=-float("inf"))
    for j in tl.static_range(1, GROUP):
        x = tl.maximum(x, tl.load(T + row * NT + offs + j, mask=offs + j < NT, other=-float("inf")))
    return x


@triton.jit
def _count_at_least(T, row, NT, NG, thr, x, BLOCK: tl.constexpr, GROUP: tl.constexpr, SINGLE: tl.constexpr):
    """How many of the row's NG group maxima are >= thr (x: all of them, when they fit one block)."""
    if SINGLE:
        return tl.sum((x >= thr).to(tl.int32), axis=0)
    n = 0
    for g0 in range(0, NG, BLOCK):
        n += tl.sum((_group_max(T, row, NT, g0, BLOCK, GROUP) >= thr).to(tl.int32), axis=0)
    return n


@triton.jit
def _select_kernel(TMAX, TARG, TSEC, EPS, GROUPS, BEST, FLAGGED, COUNT, NFLAG, NT, N, K, KT, FMAX,
                   ITERS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, SINGLE: tl.constexpr,
                   GMAX: tl.constexpr):
    """Program (one query): v, a lower bound within (max - min) / 2^ITERS of the K-th largest
    of the row's group maxima (each the maximum of GROUP tiles: K groups >= v hold K distinct
    tiles >= v, so v is <= the K-th largest tile maximum too), by bisection on counts;
    tau = v - 2 EPS; then the groups whose maximum is >= tau (GMAX of them at most, >= KT)
    into GROUPS, and of their tiles every one whose maximum is >= tau: its best row into BEST
    (N if the tile is flagged, i.e. its second-best is >= tau too), flagged tiles into
    FLAGGED. COUNT: how many tiles were above tau (or groups, if more than GMAX: then over KT
    either way); NFLAG: how many were flagged (slots past KT / FMAX are not written)."""
    row = tl.program_id(0).to(tl.int64)
    NG = tl.cdiv(NT, GROUP)
    x = _group_max(TMAX, row, NT, 0, BLOCK, GROUP)
    lo = tl.min(tl.where(tl.arange(0, BLOCK) < NG, x, float("inf")), axis=0)
    hi = tl.max(x, axis=0)
    for g0 in range(BLOCK, NG, BLOCK):  # rows of more than one block of groups
        y = _group_max(TMAX, row, NT, g0, BLOCK, GROUP)
        lo = tl.minimum(lo, tl.min(tl.where(g0 + tl.arange(0, BLOCK) < NG, y, float("inf")), axis=0))
        hi = tl.maximum(hi, tl.max(y, axis=0))
    # count(>= lo) >= K always; if count(>= hi) >= K too (ties at the top) v is hi itself.
    lo = tl.where(_count_at_least(TMAX, row, NT, NG, hi, x, BLOCK, GROUP, SINGLE) >= K, hi, lo)
    for _ in range(ITERS):
        mid = lo + (hi - lo) * 0.5
        enough = _count_at_least(TMAX, row, NT, NG, mid, x, BLOCK, GROUP, SINGLE) >= K
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    tau = lo - 2 * tl.load(EPS + row)
    # The groups above tau, compacted (one scan over the group maxima, not over every tile).
    ngroups = 0
    for g0 in range(0, NG, BLOCK):
        if SINGLE:
            y = x
        else:
            y = _group_max(TMAX, row, NT, g0, BLOCK, GROUP)
        up = y >= tau  # (-inf past the row)
        pos = ngroups + tl.cumsum(up.to(tl.int32), axis=0) - 1
        tl.store(GROUPS + row * GMAX + pos, g0 + tl.arange(0, BLOCK), mask=up & (pos < GMAX))
        ngroups += tl.sum(up.to(tl.int32), axis=0)
    tl.debug_barrier()  # GROUPS written by all of this program's threads before they read it
    offs = tl.arange(0, GMAX * GROUP)
    g_ok = offs // GROUP < tl.minimum(ngroups, GMAX)
    tile = tl.load(GROUPS + row * GMAX + offs // GROUP, mask=g_ok, other=0) * GROUP + offs % GROUP
    ok = g_ok & (tile < NT)
    y = tl.load(TMAX + row * NT + tile, mask=ok, other=-float("inf"))
    above = y >= tau
    sec = tl.load(TSEC + row * NT + tile, mask=above, other=-float("inf"))
    flag = above & ~(sec < tau)  # a NaN second-best (an infinite score) flags its tile
    arg = tl.load(TARG + row * NT + tile, mask=above & ~flag, other=N)
    pos = tl.cumsum(above.to(tl.int32), axis=0) - 1
    tl.store(BEST + row * KT + pos, tl.where(flag, N, arg), mask=above & (pos < KT))
    fpos = tl.cumsum(flag.to(tl.int32), axis=0) - 1
    tl.store(FLAGGED + row * FMAX + fpos, tile, mask=flag & (fpos < FMAX))
    count = tl.sum(above.to(tl.int32), axis=0)
    tl.store(COUNT + row, tl.where(ngroups > GMAX, ngroups, count))
    tl.store(NFLAG + row, tl.sum(flag.to(tl.int32), axis=0))


def select_tiles(tmax: torch.Tensor, targ: torch.Tensor, tsec: torch.Tensor, eps: torch.Tensor, k: int, kt: int,
                 max_flagged: int, N: int, group: int = 4, block: int = 2048, iters: int = 20):
    """tile_top2's outputs [M, NT] and eps [M] (error_bound) -> (best rows [M, kt] int32 (N: none),
    flagged tiles [M, max_flagged] int32 (-1: none), tiles above tau [M], flagged tiles [M]),
    as _select_kernel says, its bisection over the maxima of `group` tiles (1, 2 or 4) at a
    time, `block` of them in registers (all of them for 1M rows). Measured on an H100,
    16,384 queries x 7,813 tiles: one program of 8 or 16 warps a query over the tile maxima
    themselves took 2.3-2.9 ms, its block-wide reductions' barriers the cost; group maxima
    of 4 taken by PyTorch cost 1.06 ms; 4 warps, the maxima taken here, 2.35 ms with every
    tile scanned for the compaction (and 255 registers a thread: two programs an SM); 0.53-0.62
    ms with only the groups above tau compacted and the group maxima loaded a member at a time
    (128 registers)."""
    M, NT = tmax.shape
    best = torch.full((M, kt), N, device=tmax.device, dtype=torch.int32)
    flagged = torch.full((M, max_flagged), -1, device=tmax.device, dtype=torch.int32)
    count = torch.empty(M, device=tmax.device, dtype=torch.int32)
    nflag = torch.empty(M, device=tmax.device, dtype=torch.int32)
    if NT < 8 * group * k:  # too few groups per top-k tile: their k-th maximum would cut too low
        group = 1
    if M:
        NG = triton.cdiv(NT, group)
        block = min(block, triton.next_power_of_2(NG))
        gmax = triton.next_power_of_2(kt)
        groups = torch.empty(M, gmax, device=tmax.device, dtype=torch.int32)
        _select_kernel[(M,)](tmax, targ, tsec, eps.float().contiguous(), groups, best, flagged, count, nflag, NT, N,
                             k, kt, max_flagged, ITERS=iters, BLOCK=block, GROUP=group, SINGLE=NG <= block,
                             GMAX=gmax, num_warps=4)
    return best, flagged, count, nflag
