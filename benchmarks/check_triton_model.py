"""On a GPU: EaE with memory_impl=triton (and the one-worker sharded table with the kernels)
against memory_impl=dense, same weights and batch: losses and every gradient, as whole-tensor
relative errors. float32 parameters; the kernels run their dots in bf16 under autocast and in
tf32 without, so agreement is to ~1e-2 / ~1e-3, not bit for bit.

    python benchmarks/check_triton_model.py
"""

import sys

import torch

from eae_model.config import load_config
from eae_model.model import EaEModel
from eae_platform.bench import make_batch
from eae_model.sharded_table import ShardedEntityTable


def run(impl: str, sharded: bool, autocast: bool, batch):
    config = load_config("paper", overrides=["l0=1", "l1=1", "num_entities=300000", "dropout=0.0", f"memory_impl={impl}"])
    torch.manual_seed(0)
    table = ShardedEntityTable(config.num_entities, config.entity_dim, memory_impl=impl) if sharded else None
    model = EaEModel(config, entity_table=table).cuda().train()
    torch.manual_seed(1)  # the same E for the local and the sharded table
    with torch.no_grad():
        model.entity_table.weight.copy_(torch.randn(config.num_entities, config.entity_dim) * 0.02)
    ids, labels, mentions = batch
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(ids, mentions=mentions, mlm_labels=labels)
    out.loss.backward()
    return {k: v.item() for k, v in out.losses.items()}, {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def main():
    if not torch.cuda.is_available():  # torch's own "Torch not compiled with CUDA enabled" came as a traceback
        print("check_triton_model.py needs a CUDA GPU: it checks the Triton kernels, which run on one only, "
              "against the dense memory", file=sys.stderr)
        sys.exit(2)
    batch = make_batch(64, 128, 300000, 30522, torch.device("cuda"), seed=5)
    for autocast in (False, True):
        ref_losses, ref_grads = run("dense", False, autocast, batch)
        for impl, sharded in (("triton", False), ("triton", True), ("chunked", False)):
            losses, grads = run(impl, sharded, autocast, batch)
            worst = max(((grads[n] - g).norm() / g.norm().clamp(min=1e-12)).item() for n, g in ref_grads.items()
                        if g.norm() > 1e-8)
            loss_err = max(abs(losses[k] - v) / abs(v) for k, v in ref_losses.items())
            print(f"autocast bf16={autocast} {impl}{' sharded' if sharded else ''} vs dense: "
                  f"max loss rel err {loss_err:.1e}, max grad rel err {worst:.1e} over {len(ref_grads)} tensors "
                  f"(entity table: {((grads['entity_table.weight'] - ref_grads['entity_table.weight']).norm() / ref_grads['entity_table.weight'].norm()).item():.1e})")


if __name__ == "__main__":
    main()
