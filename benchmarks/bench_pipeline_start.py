"""What does opening an epoch's Ray Data pipeline cost, and where is that cost paid?

On two H100s the training steps slowed 3-5x for ~30 steps while the next epoch's pipeline
started (docs/performance.md, section 4, machine E) although no step waited for data. This
opens one epoch of one rank (`data.iter_epoch` through `data.prefetch`, as the loop does, after
one warm-up pipeline) for each dataset given, and prints the time to its first batch and the CPU
seconds this process (the trainer's) spent meanwhile and over the next seconds: the
executor and iterator threads run here, under the trainer's GIL; the read tasks run in Ray's
worker processes. Give the same rows cut into files of two sizes to compare, e.g. a build with
`--shard-rows 1000` and one with the default 10,000:

    .venv/bin/python benchmarks/bench_pipeline_start.py DATA_SMALL_FILES DATA_LARGE_FILES [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import threading
import time


def process_cpu_s() -> float:
    """User + system CPU seconds of this process, all of its threads (ended ones included)."""
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_epoch(data_dir: str, workers: int, batch: int, watch_s: float) -> dict:
    import pyarrow.parquet as pq

    from eae_platform.pretrain import data

    files = data.shard_files(data_dir, "train")
    warm = data.prefetch(data.iter_epoch(files, 0, 0, 0, workers, batch, 0.2, None, 0, 128), depth=2)
    next(iter(warm))  # Ray Data's first-use imports and actors, which a running job has already paid
    warm.close()
    time.sleep(2)
    cpu0, t0 = process_cpu_s(), time.perf_counter()
    stream = data.prefetch(data.iter_epoch(files, 0, 1, 0, workers, batch, 0.2, None, 0, 128), depth=2)
    next(iter(stream))
    first_s, first_cpu = time.perf_counter() - t0, process_cpu_s() - cpu0
    time.sleep(watch_s)  # the pipeline reads the rest of the epoch meanwhile
    after_cpu = process_cpu_s() - cpu0 - first_cpu
    stream.close()
    while any(t.name == "eae-prefetch" for t in threading.enumerate()):  # the pipelines' teardown
        time.sleep(0.1)
    mine = data.files_for_rank(files, 0, 1, 0, workers)
    return {"files": len(mine), "rows": sum(pq.read_metadata(f).num_rows for f in mine),
            "first_batch_s": first_s, "cpu_to_first_s": first_cpu, "cpu_after_s": after_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="+", help="`eae data build` output directories")
    parser.add_argument("--workers", type=int, default=2, help="ranks the files are dealt to (rank 0 is read)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--watch-s", type=float, default=10.0, help="seconds watched after the first batch")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results = [open_epoch(d, args.workers, args.batch, args.watch_s) for d in args.data]
    for d, r in zip(args.data, results):
        print(f"{d}: {r['files']} files, {r['rows']:,} rows for rank 0 of {args.workers}: first batch after "
              f"{r['first_batch_s']:.2f} s; this process's CPU {r['cpu_to_first_s']:.2f} s until then, "
              f"{r['cpu_after_s']:.2f} s in the next {args.watch_s:.0f} s")
    base = results[0]["first_batch_s"]
    for d, r in zip(args.data[1:], results[1:]):
        print(f"first batch: {base / r['first_batch_s']:.1f}x faster with {d} than with {args.data[0]}")
    ray.shutdown()


if __name__ == "__main__":
    main()
