"""How long does a training step wait for its batch where one epoch ends and the next begins?

Each worker's epoch is its own Ray Data pipeline (eae_platform.pretrain.data.iter_epoch), and a
new pipeline takes seconds to deliver its first batch. `iter_epochs` opens the next epoch's
pipeline `lead` steps before the current one ends. This streams a built dataset for a bit more
than one epoch, with each "training step" a sleep, through the real pipeline (Ray Data, collate,
the prefetch thread), once with lead 0 (the next pipeline opens when the last batch is taken:
what the loop did before) and once with the default lead, and prints the wait for data at the
first step of the second epoch and over all steps:

    .venv/bin/eae data synth --out runs/world --entities 20000
    .venv/bin/eae data build --dump runs/world/world.xml --out runs/world-data --shard-rows 1000
    .venv/bin/python benchmarks/bench_epoch_boundary.py runs/world-data [--batch 256] [--step-s 0.05]
"""

from __future__ import annotations

import argparse
import os
import threading
import time


def run(data_dir: str, batch: int, step_s: float, lead: int, extra_steps: int) -> dict:
    from eae_data.shards import shard_files
    from eae_platform.pretrain import data

    files = shard_files(data_dir, "train")

    def open_epoch(epoch: int, skip: int):
        return data.prefetch(data.iter_epoch(files, 0, epoch, 0, 1, batch, 0.2, None, skip, 128), depth=2)

    def steps_in(epoch: int) -> int:
        return data.steps_per_epoch(files, 0, epoch, 1, batch)

    first = steps_in(0)
    waits, epochs = [], []
    stream = data.iter_epochs(open_epoch, steps_in, 0, lead=lead)
    for _ in range(first + extra_steps):
        t = time.perf_counter()
        epoch, _, _ = next(stream)
        waits.append(time.perf_counter() - t)
        epochs.append(epoch)
        time.sleep(step_s)
    stream.close()
    while any(t.name == "eae-prefetch" for t in threading.enumerate()):  # the pipelines' teardown
        time.sleep(0.1)
    boundary = epochs.index(1)
    return {"lead": lead, "steps_per_epoch": first, "wait_first_step_s": waits[0],
            "wait_at_new_epoch_s": waits[boundary], "wait_other_steps_s": sum(waits[1:]) - waits[boundary]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="an `eae data build` output directory")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--step-s", type=float, default=0.05, help="simulated training step (s)")
    parser.add_argument("--extra-steps", type=int, default=20, help="steps run into the second epoch")
    args = parser.parse_args()
    import ray

    from eae_platform.pretrain.data import NEXT_EPOCH_LEAD

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results = [run(args.data, args.batch, args.step_s, lead, args.extra_steps) for lead in (0, NEXT_EPOCH_LEAD)]
    print(f"{results[0]['steps_per_epoch']} steps per epoch of {args.batch}, simulated step {args.step_s} s")
    for r in results:
        print(f"  lead {r['lead']:>4} steps: wait at the first step {r['wait_first_step_s']:.2f} s, at the new "
              f"epoch's first step {r['wait_at_new_epoch_s']:.3f} s, at all other steps {r['wait_other_steps_s']:.3f} s")
    before, after = results[0]["wait_at_new_epoch_s"], results[1]["wait_at_new_epoch_s"]
    print(f"  the new epoch's wait: {before:.3f} -> {after:.3f} s ({before / max(after, 1e-6):.0f}x less)")


if __name__ == "__main__":
    main()
