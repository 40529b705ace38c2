"""The entity memory's kernels: the full-softmax memory over blocks of the entity table (the
fused memory) and the exact top-k search over it, in PyTorch and, on GPUs, in Triton and Gluon.

    common         the constants and helpers the Triton and Gluon kernels share: TILE_ROWS,
                   INTERPRET (Triton's interpreter), check, multiprocessors, tuned, m_key
    fused_memory   the fused memory: block_forward/block_backward, dense, chunked or triton
                   (resolve_impl), and its autograd function (block_attention)
    triton_memory  the fused memory's Triton kernels (memory_forward, memory_backward, pretune)
    exact_topk     exact top-k: chunked_top_k (any device, the reference), tile_top_k (Triton)
    triton_topk    tile_top_k's Triton kernels: the fused pass tile_top2, select_tiles, rescore_top_k
    hopper_topk    the fused pass in Gluon for Hopper GPUs (tile_top2's contract)

Imports go one way (tests/test_architecture.py checks it): common <- triton_memory <- fused_memory,
common <- hopper_topk <- triton_topk <- exact_topk. fused_memory and exact_topk import triton
only inside the functions that launch kernels, so the model imports them without triton; this
package's own import imports nothing.
"""
