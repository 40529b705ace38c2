"""Where an EaE training step spends GPU time: torch.profiler over a few steps of the paper
preset (batch 256 x 128, memory_impl=triton, embeddings and transformer stacks compiled as in
`eae bench step --compile`), kernels grouped by name, the largest first.

    python benchmarks/profile_step.py [--no-compile] [--rows 30] [--gaps 25] [--trace FILE.json.gz]

It also prints the step's wall time (CUDA events, outside the profiler) against its GPU busy
time (the union of kernel intervals): the difference is time the GPU waits for the host
(syncs, launches). The longest of those idle gaps are listed with the kernels around them.
"""

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from eae_model.config import load_config
from eae_platform.bench import eae_step, make_batch
from eae_platform.pretrain.profiling import gpu_busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--gaps", type=int, default=25)
    parser.add_argument("--trace", help="write the profiled steps' Chrome trace here")
    args = parser.parse_args()
    if not torch.cuda.is_available():  # torch's own "Torch not compiled with CUDA enabled" came as a traceback
        print("profile_step.py needs a CUDA GPU: it profiles the CUDA kernels of a training step "
              "(memory_impl=triton)", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda")
    config = load_config("paper", overrides=["memory_impl=triton"])
    ids, labels, mentions = make_batch(256, config.max_length, config.num_entities, config.vocab_size, device)
    step, _ = eae_step(config, ids, labels, mentions, device, sharded=False, compile=not args.no_compile)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        step()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / 10
    steps = 3
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = sorted((e for e in events if e.device_time_total > 0 and e.device_type.name == "CUDA"),
                     key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in kernels) / steps / 1e3
    print(f"GPU kernel time per step: {total:.1f} ms (compile={not args.no_compile})")
    for e in kernels[: args.rows]:
        print(f"{e.device_time_total / steps / 1e3:8.2f} ms  {e.count // steps:5d}x  {e.key[:110]}")
    _idle(prof, wall, steps, args.gaps)
    if args.trace:
        prof.export_chrome_trace(args.trace)


def _idle(prof, wall_ms: float, steps: int, top: int) -> None:
    """GPU busy time per step against the wall time, and the longest gaps between kernels."""
    busy, gaps = gpu_busy(prof)
    busy_ms = busy / steps / 1e3
    print(f"\nwall {wall_ms:.1f} ms/step (10 steps, no profiler), GPU busy {busy_ms:.1f} ms/step "
          f"(union of kernels), so the GPU waits ~{wall_ms - busy_ms:.1f} ms/step")
    total = sum(g[0] for g in gaps) / steps / 1e3
    print(f"gaps between kernels (profiled steps, {len(gaps) // steps} per step, {total:.1f} ms/step); the longest:")
    for length, a, b in gaps[:top]:
        print(f"  {length / 1e3:7.3f} ms  after {a[:60]}  before {b[:60]}")

if __name__ == "__main__":
    main()
