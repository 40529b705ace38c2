"""What padding every batch to model.max_length costs the training step, against padding each
batch to its longest context rounded up to a multiple (train.pad_multiple).

On GPUs the job pads every batch to model.max_length (train.pad_to_max_length: one shape for all
steps). The synthetic worlds' contexts are 22 wordpieces on average and 80-88 at most, against
128, so most of a step's transformer work is on padding. This prints, in one run on the given
data: the tokens a step holds with each padding, and the ms of a training step (forward,
backward, AdamW; bf16 autocast on CUDA) with each, in interleaved rounds (medians), and the
ratio to max_length's. The losses are the same either way (tests/eae_platform/test_pretrain_data.py).

    python benchmarks/bench_padding.py DATA_DIR [--preset minilm] [--batch 128] [--steps 20] [--rounds 3]
        [--multiple 16] [--entities 5000] [--compile]

DATA_DIR: a built dataset (`eae data build`); its train split's first batches, in a shuffled order.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eae_data.shards import shard_files
from eae_model.config import load_config
from eae_model.model import EaEModel
from eae_platform.pretrain import data
from eae_platform.pretrain.loop import compile_modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--preset", default="minilm")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="batches a round, each padding")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--multiple", type=int, default=16)
    parser.add_argument("--entities", type=int, default=5000, help="the table's rows (ids past it: unlinked)")
    parser.add_argument("--compile", action="store_true", help="compile the stacks, as the job does on GPUs")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load_config(args.preset, overrides=[f"num_entities={args.entities}"])
    rows = list(data.cached_batches(shard_files(args.data, "train"), args.steps * args.batch, args.batch, {}, [0, 0, 0]))
    paddings = {"max_length": 0, f"multiple of {args.multiple}": args.multiple}
    batches = {name: [data.collate(r, 0, 0, 0.2, args.entities, config.max_length, m).to(device) for r in rows]
               for name, m in paddings.items()}
    model = EaEModel(config).to(device).train()
    if args.compile:
        compile_modules(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def run(name: str) -> float:
        """ms a step over the padding's batches, the GPU's work finished."""
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for b in batches[name]:
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                out = model(b.input_ids, b.attention_mask, mentions=b.mentions, mlm_labels=b.mlm_labels,
                            validate=False, indices=b.indices)
            out.loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / len(batches[name]) * 1e3

    for name in paddings:  # warm-up: every shape once (compilation, attention plans)
        run(name)
    times = {name: [] for name in paddings}
    for _ in range(args.rounds):
        for name in paddings:
            times[name].append(run(name))
    real = statistics.fmean(int(b.attention_mask.sum()) for b in batches["max_length"])
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"preset {args.preset}, batch {args.batch}, {args.steps} batches x {args.rounds} rounds, compile {args.compile}, "
          f"{real:,.0f} real tokens a step")
    base = statistics.median(times["max_length"])
    print(f"{'padding':>16} {'tokens/step':>12} {'lengths':>12} {'ms/step':>9} {'vs max_length':>14}")
    for name in paddings:
        lengths = sorted({b.input_ids.shape[1] for b in batches[name]})
        tokens = statistics.fmean(b.input_ids.numel() for b in batches[name])
        ms = statistics.median(times[name])
        print(f"{name:>16} {tokens:12,.0f} {','.join(map(str, lengths)):>12} {ms:9.1f} {ms / base:13.2f}x")


if __name__ == "__main__":
    main()
