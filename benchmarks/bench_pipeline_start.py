"""What does opening an epoch's Ray Data pipeline cost, and where is that cost paid?

On two H100s the training steps slowed 3-5x for ~30 steps while the next epoch's pipeline
started (docs/performance.md, section 4, machines E and F) although no step waited for data.
This opens one epoch of the ranks' pipelines (`data.iter_epoch` through `data.prefetch`, as
the loop does, after one warm-up pipeline) for each dataset and Parquet datasource given, and
prints the time until every pipeline has given its first batch, the CPU seconds this process
(the trainer's) spent meanwhile and over the next seconds, and the whole machine's CPU seconds
meanwhile: the executor and iterator threads run here, under the trainer's GIL; the read tasks
(and datasource V2's footer-reading actors) run in Ray's worker processes. Give the same rows
cut into files of two sizes to compare, e.g. a build with `--shard-rows 1000` and one with the
default 10,000; the first datasource listed is the baseline of the datasource ratios:

    .venv/bin/python benchmarks/bench_pipeline_start.py DATA [DATA2] [--workers 2] [--all-ranks] \
        [--datasources v2,v1]

--all-ranks opens every rank's pipeline at once, as the W trainers of a job do at an epoch.
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


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine, all processes (/proc/stat: all but idle and iowait)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def open_epoch(data_dir: str, workers: int, batch: int, watch_s: float, all_ranks: bool, v2: bool) -> dict:
    import pyarrow.parquet as pq

    from eae_data.shards import files_for_rank, shard_files
    from eae_platform.pretrain import data

    data.USE_DATASOURCE_V2 = v2
    files = shard_files(data_dir, "train")
    ranks = range(workers) if all_ranks else [0]
    warm = data.prefetch(data.iter_epoch(files, 0, 0, 0, workers, batch, 0.2, None, 0, 128), depth=2)
    next(iter(warm))  # Ray Data's first-use imports and actors, which a running job has already paid
    warm.close()
    time.sleep(2)
    cpu0, all0, t0 = process_cpu_s(), machine_cpu_s(), time.perf_counter()
    streams = [data.prefetch(data.iter_epoch(files, 0, 1, r, workers, batch, 0.2, None, 0, 128), depth=2)
               for r in ranks]
    for stream in streams:
        next(iter(stream))
    first_s, first_cpu, first_all = time.perf_counter() - t0, process_cpu_s() - cpu0, machine_cpu_s() - all0
    time.sleep(watch_s)  # the pipelines read the rest of the epoch meanwhile
    after_cpu = process_cpu_s() - cpu0 - first_cpu
    for stream in streams:
        stream.close()
    while any(t.name == "eae-prefetch" for t in threading.enumerate()):  # the pipelines' teardown
        time.sleep(0.1)
    mine = files_for_rank(files, 0, 1, 0, workers)
    return {"files": len(mine), "rows": sum(pq.read_metadata(f).num_rows for f in mine), "ranks": len(streams),
            "first_batch_s": first_s, "cpu_to_first_s": first_cpu, "cpu_after_s": after_cpu,
            "machine_cpu_to_first_s": first_all}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="+", help="`eae data build` output directories")
    parser.add_argument("--workers", type=int, default=2, help="ranks the files are dealt to (rank 0 is read)")
    parser.add_argument("--all-ranks", action="store_true", help="open every rank's pipeline at once")
    parser.add_argument("--datasources", default="v1", help="Parquet datasources to compare: v1, v2 or both, e.g. v2,v1")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--watch-s", type=float, default=10.0, help="seconds watched after the first batch")
    args = parser.parse_args()
    sources = args.datasources.split(",")
    if not sources or any(v not in ("v1", "v2") for v in sources):
        parser.error(f"--datasources: a comma-separated list of v1 and v2, got {args.datasources!r}")
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results = {(d, v): open_epoch(d, args.workers, args.batch, args.watch_s, args.all_ranks, v == "v2")
               for d in args.data for v in sources}
    for (d, v), r in results.items():
        print(f"{d}, datasource {v}: {r['files']} files, {r['rows']:,} rows for rank 0 of {args.workers}; "
              f"{r['ranks']} pipeline(s) gave their first batch after {r['first_batch_s']:.2f} s; this process's "
              f"CPU {r['cpu_to_first_s']:.2f} s until then (the machine's: {r['machine_cpu_to_first_s']:.2f} s), "
              f"{r['cpu_after_s']:.2f} s in the next {args.watch_s:.0f} s")
    for d in args.data:
        base = results[d, sources[0]]["first_batch_s"]
        for v in sources[1:]:
            print(f"{d}: first batch {base / results[d, v]['first_batch_s']:.1f}x faster with datasource {v} "
                  f"than with {sources[0]}")
    for v in sources:
        base = results[args.data[0], v]["first_batch_s"]
        for d in args.data[1:]:
            print(f"datasource {v}: first batch {base / results[d, v]['first_batch_s']:.1f}x faster with {d} "
                  f"than with {args.data[0]}")
    ray.shutdown()


if __name__ == "__main__":
    main()
