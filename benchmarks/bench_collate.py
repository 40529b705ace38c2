"""What collating a batch costs the training step's host thread.

The loop's prefetch thread (eae_platform.pretrain.data.prefetch) collates the next batches
while the main thread launches the step's kernels. Both are Python threads of one process:
whatever Python the collation runs holds the interpreter lock that each of the main thread's
PyTorch calls must take back, so the launches slow down while it runs; on 2 GPUs a late launch
on one worker is a wait at the next collective on the other. This prints, in one run:

  1. collate's time per batch: the previous row-by-row version (a numpy generator per
     context, a loop over rows and masked mentions; `collate_rows` below, the baseline) and
     the current vectorised `data.collate`;
  2. a simulated step, the main thread making `--ops` small PyTorch calls (as the host
     launching a step's kernels) and then taking the next batch from a prefetch queue (depth
     2), alone and with each collate feeding the queue: ms per step and the ratio to alone
     (the three interleaved over `--rounds` rounds; medians).

    .venv/bin/python benchmarks/bench_collate.py [DATA_DIR] [--batch 256] [--ops 10000] [--steps 20] [--rounds 5]

DATA_DIR: a built dataset (`eae data build`), whose first train shard's first rows are the
batch; without it, synthetic contexts shaped like the GPU runs' world (~58 wordpieces and
~7 mentions a context).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time

import numpy as np
import torch

from eae_data.constants import MASK_TOKEN_ID, NULL_ENTITY
from eae_data.shards import shard_files
from eae_model.mentions import Mentions
from eae_model.model import IGNORE, TargetIndices
from eae_platform.pretrain import data


def collate_rows(rows, seed, epoch, mask_rate, num_entities, pad_to=None) -> data.Batch:
    """The baseline: collate as it was before vectorising (one generator per context)."""
    context_ids = rows["context_id"].astype(np.int64)
    tokens = rows["token_ids"]
    batch, length = len(tokens), pad_to or max(len(t) for t in tokens)
    input_ids = np.zeros((batch, length), dtype=np.int64)
    attention = np.zeros((batch, length), dtype=np.int64)
    labels = np.full((batch, length), IGNORE, dtype=np.int64)
    b_ids, starts, ends, entities = [], [], [], []
    for b in range(batch):
        ids = np.asarray(tokens[b], dtype=np.int64)
        input_ids[b, : len(ids)] = ids
        attention[b, : len(ids)] = 1
        s = np.asarray(rows["mention_starts"][b], dtype=np.int64)
        t = np.asarray(rows["mention_ends"][b], dtype=np.int64)
        e = np.asarray(rows["mention_entity_ids"][b], dtype=np.int64)
        masked = np.random.default_rng([seed, epoch, int(context_ids[b])]).random(len(s)) < mask_rate
        for start, end in zip(s[masked], t[masked]):
            labels[b, start : end + 1] = input_ids[b, start : end + 1]
            input_ids[b, start : end + 1] = MASK_TOKEN_ID
        b_ids.append(np.full(len(s), b))
        starts.append(s)
        ends.append(t)
        entities.append(e)
    entity_ids = np.concatenate(entities)
    if num_entities is not None:
        entity_ids = np.where(entity_ids < num_entities, entity_ids, NULL_ENTITY)
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    mentions = Mentions(as_t(np.concatenate(b_ids)), as_t(np.concatenate(starts)), as_t(np.concatenate(ends)),
                        as_t(entity_ids))
    labels_t = as_t(labels)
    out = data.Batch(as_t(context_ids), as_t(input_ids), as_t(attention), labels_t, mentions,
                     TargetIndices.of(labels_t, mentions))
    mentions.validate(out.attention_mask, num_entities)
    return out


def synthetic_rows(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens, starts, ends, entities = [], [], [], []
    for _ in range(n):
        length = int(rng.integers(20, 128))
        tokens.append(rng.integers(1000, 30000, length).astype(np.int32))
        s = np.sort(rng.choice(np.arange(1, length - 3, 3), size=min(int(rng.integers(3, 12)), (length - 4) // 3),
                               replace=False))
        starts.append(s.astype(np.int32))
        ends.append((s + rng.integers(0, 2, len(s))).astype(np.int32))
        entities.append(rng.integers(-1, 1_000_000, len(s)).astype(np.int32))
    obj = lambda xs: np.array(xs + [None], dtype=object)[:-1]  # noqa: E731
    return {"context_id": np.arange(n), "token_ids": obj(tokens), "mention_starts": obj(starts),
            "mention_ends": obj(ends), "mention_entity_ids": obj(entities)}


def shard_rows(data_dir: str, n: int) -> dict:
    import pyarrow.parquet as pq

    table = pq.read_table(shard_files(data_dir, "train")[0], columns=data.COLUMNS).slice(0, n)
    out = {}
    for name in data.COLUMNS:
        column = table.column(name)
        if str(column.type).startswith("list"):
            out[name] = np.array([np.asarray(x, dtype=np.int32) for x in column.to_pylist()] + [None], dtype=object)[:-1]
        else:
            out[name] = column.to_numpy()
    return out


def per_batch_ms(fn, rows, reps: int = 20) -> float:
    fn(rows, 0, 0, 0.2, 1_000_000, 128)
    start = time.perf_counter()
    for _ in range(reps):
        fn(rows, 0, 0, 0.2, 1_000_000, 128)
    return (time.perf_counter() - start) / reps * 1e3


def step_ms(fn, rows, ops: int, steps: int) -> float:
    """The main thread's ms per simulated step: `ops` small PyTorch calls, then the next batch
    from a depth-2 queue that a thread fills with fn's batches (fn None: no thread)."""
    ready: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce():
        while not stop.is_set():
            batch = fn(rows, 0, 0, 0.2, 1_000_000, 128)
            while not stop.is_set():
                try:
                    ready.put(batch, timeout=0.05)
                    break
                except queue.Full:
                    continue

    thread = threading.Thread(target=produce, daemon=True) if fn is not None else None
    if thread is not None:
        thread.start()
        ready.get()
    x = torch.zeros(16)
    start = time.perf_counter()
    for _ in range(steps):
        for _ in range(ops):
            x.add_(1.0)
        if thread is not None:
            ready.get()
    seconds = time.perf_counter() - start
    stop.set()
    if thread is not None:
        thread.join()
    return seconds / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", nargs="?")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ops", type=int, default=10000, help="PyTorch calls per simulated step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = shard_rows(args.data_dir, args.batch) if args.data_dir else synthetic_rows(args.batch)
    mentions = sum(len(s) for s in rows["mention_starts"])
    print(f"batch: {args.batch} contexts, {mentions} mentions ({'shard' if args.data_dir else 'synthetic'}); "
          f"torch threads {torch.get_num_threads()}")
    rows_ms, vector_ms = per_batch_ms(collate_rows, rows), per_batch_ms(data.collate, rows)
    print(f"collate per batch: row by row {rows_ms:.2f} ms, vectorised {vector_ms:.2f} ms "
          f"({rows_ms / vector_ms:.1f}x faster)")
    runs = {"no collating thread": None, "row-by-row collate": collate_rows, "vectorised collate": data.collate}
    times = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved: a slow spell of the machine hits all three
        for name, fn in runs.items():
            times[name].append(step_ms(fn, rows, args.ops, args.steps))
    median = {name: statistics.median(t) for name, t in times.items()}
    alone = median["no collating thread"]
    print(f"simulated step of {args.ops} PyTorch calls + taking the next batch (median of {args.rounds} rounds):")
    for name, ms in median.items():
        print(f"  {name:24s} {ms:7.2f} ms  {ms / alone:.2f}x  (+{ms - alone:.2f} ms)")


if __name__ == "__main__":
    main()
