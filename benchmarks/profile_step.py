"""Where an EaE training step spends GPU time: torch.profiler over a few steps of the paper
preset (batch 256 x 128, memory_impl=triton, embeddings and transformer stacks compiled as in
`eae bench step --compile`), kernels grouped by name, the largest first.

    python benchmarks/profile_step.py [--no-compile] [--rows 30]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from eae_model.config import load_config
from eae_platform.bench import _eae_step, make_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda")
    config = load_config("paper", overrides=["memory_impl=triton"])
    ids, labels, mentions = make_batch(256, config.max_length, config.num_entities, config.vocab_size, device)
    step, _ = _eae_step(config, ids, labels, mentions, device, sharded=False, compile=not args.no_compile)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
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


if __name__ == "__main__":
    main()
