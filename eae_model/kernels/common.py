"""What the Triton and Gluon kernels of eae_model.kernels share: the tile of the exact top-k
pass (TILE_ROWS), whether Triton's interpreter runs them (INTERPRET), the checks on their
inputs, the GPU's SM count that sizes their grids, and the autotuner's configs and key.

Importing this module imports triton: the kernel modules (triton_memory, triton_topk,
hopper_topk) import it, the PyTorch-side modules (fused_memory, exact_topk) only inside the
functions that launch kernels. Triton's interpreter (TRITON_INTERPRET=1 before triton is
imported) runs the Triton kernels on CPU tensors with numpy: how the CPU tests check them.
"""

from __future__ import annotations

import torch
import triton

TILE_ROWS = 128  # rows of E per tile: the top-k pass keeps each query's best row and second-best score per tile

# Triton's interpreter (fixed when triton is imported, as the @triton.jit kernels read it): the
# kernels run on CPU tensors, one program after another.
INTERPRET = bool(triton.knobs.runtime.interpret)


def _interpreter_numpy_fix() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int (a loop bound, as in
    `range(start, end, BLOCK_N)`) with int() of a 1-element array, which NumPy 2.4 refuses
    (triton-lang/triton#9171, fixed after 3.6 by #9172): the fix, on the interpreter's
    per-launch patch of tl.tensor."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_eae_fixed", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched._eae_fixed = True
    interpreter._patch_lang_tensor = patched


if INTERPRET:
    _interpreter_numpy_fix()


def tuned(configs: list, interpreted: triton.Config) -> list:
    """The autotuner's configs; under the interpreter only `interpreted` (one of them): with
    more than one config the autotuner would run every config to time it, in numpy."""
    return [interpreted] if INTERPRET else configs


def check(H: torch.Tensor, E: torch.Tensor) -> None:
    """Raises ValueError unless the Triton kernels take queries H [M, d] and table E [N, d]:
    CUDA tensors (any under the interpreter), d a power of two >= 16."""
    if not INTERPRET and not (H.is_cuda and E.is_cuda):
        raise ValueError("the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    d = H.shape[1]
    if E.shape[1] != d or d & (d - 1) or d < 16:
        raise ValueError(f"entity dim must be a power of two >= 16 for the Triton kernels, got {d}")


def multiprocessors(device: torch.device) -> int:
    """The GPU's SM count; for CPU tensors (the interpreter) an H100's 132, so that the split
    of E is the one an H100 runs."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def m_key(M: int) -> int:
    """The autotuning key of a query count: the next power of two. Mention counts change at
    every training step (batch sizes at every request); keyed on M itself Triton would time
    every config again for each new count, seconds per step (seen in the first GPU runs of
    `eae pretrain`)."""
    return 1 << max(4, (M - 1).bit_length())
