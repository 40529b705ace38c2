"""At which steps of an `eae pretrain` run the memory's Triton kernels autotune again.

The kernels are tuned once per power-of-two bucket of their query count (`kernels.common.m_key`):
the mentions of every worker's batch for the memory call (the sharded table scores them all),
the linked ones for EntityPred's. The first batch that falls in a new bucket times every config
again, seconds in the middle of a run (a 15 s stall at step 38 of a 300-step H100 run,
docs/performance.md section 4). This replays epoch 0's batches from the Parquet shards, in the
order `data.iter_epoch` reads them, and prints the steps that open a bucket.

    python benchmarks/autotune_buckets.py DATA [--workers 2] [--batch 256] [--steps 300] [--seed 0]
"""

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eae_model.kernels.common import m_key
from eae_data.shards import files_for_rank, shard_files
from eae_platform.pretrain.data import COLUMNS, collate


def batch_counts(files, seed, rank, workers, batch, steps, num_entities):
    """Per step of epoch 0 on `rank`: (mentions, linked mentions) of its batch, as the loop's
    `collate` makes it (the memory's and EntityPred's table calls, `EaEModel.table_call_sizes`)."""
    tables, rows = [], 0
    for f in files_for_rank(files, seed, 0, rank, workers):
        tables.append(pq.read_table(f, columns=COLUMNS))
        rows += tables[-1].num_rows
        if rows >= steps * batch:
            break
    table = pa.concat_tables(tables)
    mentions, linked = [], []
    for step in range(min(steps, table.num_rows // batch)):
        part = table.slice(step * batch, batch)
        b = collate({c: part.column(c).to_numpy() for c in COLUMNS}, seed, 0, 0.0, num_entities)
        mentions.append(len(b.mentions))
        linked.append(len(b.indices.linked))
    return np.array(mentions), np.array(linked)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=256, help="contexts per worker and step")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-entities", type=int, default=1_000_000)
    args = p.parse_args()
    files = shard_files(args.data, "train")
    if not files:
        raise SystemExit(f"no training shards under {args.data}/shards/train")
    per_rank = [batch_counts(files, args.seed, r, args.workers, args.batch, args.steps, args.num_entities)
                for r in range(args.workers)]
    steps = min(len(m) for m, _ in per_rank)
    memory = sum(m[:steps] for m, _ in per_rank)
    pred = sum(l[:steps] for _, l in per_rank)
    print(f"{args.workers} worker(s), {steps} steps: memory call {memory.min()}-{memory.max()} mentions, "
          f"EntityPred call {pred.min()}-{pred.max()} linked")
    seen = set()
    for step, (m, l) in enumerate(zip(memory, pred), 1):
        new = sorted({("memory", m_key(int(m))), ("entity_pred", m_key(int(l)))} - seen)
        if new:
            print(f"  step {step}: {m} mentions, {l} linked -> new bucket(s) {new}")
            seen.update(new)


if __name__ == "__main__":
    main()
