"""The exact top-k pass (eae_model.kernels.triton_topk.tile_top2's contract) for Hopper GPUs,
in Gluon, Triton's lower-level dialect: warpgroup MMAs (wgmma), TMA copies and warp
specialisation written out.

Why not plain Triton: the pass is a matmul whose every 128 x 128 tile of scores is reduced on
the CUDA cores (best score, its row, second-best score). Triton's pipeliner keeps a wgmma in
flight across loop iterations only when nothing but the next wgmma reads its result, so one
tile's reduction and the next tile's MMA run one after the other (docs/performance.md §3).

Here a program owns 128 queries and one slice of the table, in three partitions (CUTLASS's
"ping-pong" schedule): a loader streams tiles of 128 rows of E through a ring of STAGES
shared-memory buffers by TMA (rows past the table arrive as zeros and are masked), and two
warpgroups of 64 queries each take turns on the tensor cores: while one reduces its tile, the
other's wgmma runs. The reduction is over keys (triton_topk's docstring), four operations a
score. (Measured on H100s, top-100 over 1M x 256, 16,384 queries: 12.2-13.4 ms for the pass
against 25.1-26.3 ms for the Triton kernel in the same runs; 13.9-15.1 ms with a top-2 that
tracked the column, seven operations a score; one warpgroup pair overlapping its own next
wgmma with its reduction instead took 16.8 ms: ptxas spreads the wgmma issue through the
reduction.)

Gluon has no interpreter: the CPU tests compile the kernel for sm_90 and check the schedule in
its machine code; tests/gpu/test_hopper_topk.py checks its results against the Triton pass on a
Hopper GPU.
"""

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

from eae_model.kernels.common import TILE_ROWS

# (No `from __future__ import annotations`: the aggregate below reads its field types.)

BLOCK_M = 128  # queries per program: two warpgroups of 64
# key = (score bits & -TILE_ROWS) | column, in one instruction (tiles are TILE_ROWS rows: tile_top2_into)
_KEY_ASM = gl.constexpr(f"lop3.b32 $0, $1, {-TILE_ROWS}, $2, 0xea;")  # 0xea: (a & b) | c
STAGES = 2  # tiles in flight: 64 KB each (128 x 256 bf16); with the queries' 64 KB, 192 KB of shared memory


@gluon.jit
def _top2_combine(b1, s1, b2, s2):
    """(best, second-best) of two sets of keys -> of their union. Keys are distinct (the column
    is in their low bits), so there are no ties to break. The second-best's maxima propagate
    NaN: then max(s, -inf), the leaf case of the in-thread reduction, folds away (3 ops a
    score, not 4); a NaN second-best (an infinite score) reads as flagged (select_tiles)."""
    nan: gl.constexpr = tl.PropagateNan.ALL
    return gl.maximum(b1, b2), gl.maximum(gl.maximum(s1, s2, propagate_nan=nan), gl.minimum(b1, b2), propagate_nan=nan)


@aggregate
class _Static:
    """Compile-time settings for the partitions (a plain constexpr argument would reach a
    warp-specialised partition as a runtime value in Triton 3.6)."""
    MODE: gl.constexpr
    STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, MODE, STAGES):
        self.MODE = gl.constexpr(MODE)
        self.STAGES = gl.constexpr(STAGES)


@gluon.jit
def _loader(h_desc, e_desc, q0, q1, bufs, full, empty, q_bar, row0, start, n_tiles, st):
    """The two query halves once, then every tile of the slice into the ring, each buffer as
    soon as both consumers are done with it (TMA copies: one thread issues them)."""
    T: gl.constexpr = e_desc.block_type.shape[0]
    STAGES: gl.constexpr = st.STAGES
    mbarrier.expect(q_bar, 2 * h_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(h_desc, [row0, 0], q_bar, q0)
    tma.async_copy_global_to_shared(h_desc, [row0 + h_desc.block_type.shape[0], 0], q_bar, q1)
    for t in range(n_tiles):
        b = t % STAGES
        if t >= STAGES:
            mbarrier.wait(empty.index(b), (t // STAGES - 1) & 1)
        mbarrier.expect(full.index(b), e_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(e_desc, [start + t * T, 0], full.index(b), bufs.index(b))


@gluon.jit
def _consumer(C: gl.constexpr, q_half, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end,
              n_tiles, st):
    """One warpgroup, 64 queries: per tile, wait for its turn on the tensor cores, the wgmma,
    hand the turn to the other warpgroup, then reduce the tile while the other's wgmma runs."""
    HALF: gl.constexpr = q_half.type.shape[0]
    T: gl.constexpr = bufs.type.shape[1]
    MODE: gl.constexpr = st.MODE
    STAGES: gl.constexpr = st.STAGES
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, T, 16])
    offs_m = row0 + C * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, mma))
    offs_t = gl.arange(0, T, layout=gl.SliceLayout(0, mma))
    q_ok = offs_m < M
    zero = gl.zeros([HALF, T], gl.float32, layout=mma)
    cols = gl.zeros([HALF, T], gl.int32, layout=mma) + offs_t[None, :]
    mbarrier.wait(q_bar, 0)
    for t in range(n_tiles):
        b = t % STAGES
        mbarrier.wait(full.index(b), (t // STAGES) & 1)
        if C == 0:  # after warpgroup 1's wgmma of the previous tile
            if t > 0:
                mbarrier.wait(turn.index(0), (t - 1) & 1)
        else:  # after warpgroup 0's wgmma of this tile
            mbarrier.wait(turn.index(1), t & 1)
        acc = warpgroup_mma(q_half, bufs.index(b).permute((1, 0)), zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(turn.index(1 - C), count=1)
        mbarrier.arrive(empty.index(b), count=1)
        # The tile's reduction (inline: a call inside a warp-specialised partition fails to
        # compile in Triton 3.6), on keys (triton_topk's docstring): each score with its column
        # in its low bits, one LOP3 a score (written as PTX: from plain Triton ptxas
        # recomputes the columns in the loop, two LOP3s). Rows past the slice (in its last tile
        # only) score -inf.
        n0 = start + t * T
        out = offs_m * NT + n0 // T
        ok = q_ok & (n0 < end)
        keys = gl.inline_asm_elementwise(_KEY_ASM, "=r,r,r", [acc.to(gl.int32, bitcast=True), cols], gl.int32,
                                         is_pure=True, pack=1).to(gl.float32, bitcast=True)
        if n0 + T > end:
            keys = gl.where((n0 + offs_t)[None, :] < end, keys, -float("inf"))
        if MODE == 2:
            best, second = gl.reduce((keys, gl.full_like(keys, -float("inf"))), 1, _top2_combine)
            gl.store(TSEC + out, second, mask=ok)
        else:
            best = gl.max(keys, axis=1)
        gl.store(TMAX + out, best, mask=ok)
        if MODE > 0:
            gl.store(TARG + out, n0 + (best.to(gl.int32, bitcast=True) & (T - 1)), mask=ok)


@gluon.jit
def _consumer0(q0, q1, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end, n_tiles, st):
    _consumer(0, q0, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end, n_tiles, st)


@gluon.jit
def _consumer1(q0, q1, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end, n_tiles, st):
    _consumer(1, q1, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end, n_tiles, st)


@gluon.jit
def _tile_top2_kernel(h_desc, e_desc, TMAX, TARG, TSEC, M, N, NT, ROWS, MODE: gl.constexpr, STAGES: gl.constexpr,
                      num_warps: gl.constexpr):
    """Program (2 x 64 queries, slice of ROWS rows of E), three partitions: the loader and two
    warpgroups taking turns on the tensor cores (CUTLASS's "ping-pong" schedule)."""
    HALF: gl.constexpr = h_desc.block_type.shape[0]
    row0 = gl.program_id(0) * 2 * HALF
    start = gl.program_id(1) * ROWS
    end = gl.minimum(start + ROWS, N)
    n_tiles = gl.cdiv(end - start, e_desc.block_type.shape[0])
    q0 = gl.allocate_shared_memory(h_desc.dtype, h_desc.block_type.shape, h_desc.layout)
    q1 = gl.allocate_shared_memory(h_desc.dtype, h_desc.block_type.shape, h_desc.layout)
    bufs = gl.allocate_shared_memory(e_desc.dtype, [STAGES] + e_desc.block_type.shape, e_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    mbarrier.init(q_bar, count=1)
    st = _Static(MODE, STAGES)
    args = (q0, q1, bufs, full, empty, turn, q_bar, TMAX, TARG, TSEC, M, NT, row0, start, end, n_tiles, st)
    # The loader is the default partition (the kernel's 4 warps, one thread of which issues the
    # copies, at few registers); each consumer warpgroup gets 232 registers a thread.
    gl.warp_specialize([(_loader, (h_desc, e_desc, q0, q1, bufs, full, empty, q_bar, row0, start, n_tiles, st)),
                        (_consumer0, args), (_consumer1, args)], [4, 4], [232, 232])


def supported(H: torch.Tensor, E: torch.Tensor) -> bool:
    """Whether this pass can run H against E: a Hopper GPU (sm_90), bf16 or fp16, d a multiple
    of 16 up to 256 (the queries' and two tiles' shared memory), 16-byte aligned storage."""
    if not (H.is_cuda and E.is_cuda) or torch.cuda.get_device_capability(H.device)[0] != 9:
        return False
    d = H.shape[1]
    aligned = all(not x.is_contiguous() or x.data_ptr() % 16 == 0 for x in (H, E))  # TMA's (a copy is aligned)
    return (H.dtype == E.dtype and E.dtype in (torch.bfloat16, torch.float16) and E.shape[1] == d
            and d % 16 == 0 and d <= 256 and aligned)


def descriptor(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor over x [n, d] (contiguous) in blocks of rows x d."""
    dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([rows, x.shape[1]], dtype)
    return TensorDescriptor.from_tensor(x, [rows, x.shape[1]], layout)


def tile_top2_into(H: torch.Tensor, E: torch.Tensor, tmax: torch.Tensor, targ: torch.Tensor, tsec: torch.Tensor,
                   splits: int, rows: int, mode: int = 2) -> None:
    """triton_topk.tile_top2's pass on a Hopper GPU, into its outputs [M, NT] (H [M, d] and
    E [N, d] contiguous; E in `splits` slices of `rows` rows, a multiple of TILE_ROWS)."""
    M, N = H.shape[0], E.shape[0]
    _tile_top2_kernel[(triton.cdiv(M, BLOCK_M), splits)](descriptor(H, BLOCK_M // 2), descriptor(E, TILE_ROWS), tmax,
                                                         targ, tsec, M, N, tmax.shape[1], rows, MODE=mode,
                                                         STAGES=STAGES, num_warps=4)
