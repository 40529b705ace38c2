"""What padding every batch to model.max_length costs the training step, against padding each
batch to its longest context rounded up to a multiple (train.pad_multiple).

On GPUs the job pads every batch to model.max_length (train.pad_to_max_length: one shape for all
steps). The synthetic worlds' contexts are 22 wordpieces on average and 80-88 at most, against
128, so most of a step's transformer work is on padding. This prints, in one run on the given
data: the tokens a step holds with each padding, and the ms of a training step (forward,
backward, AdamW; bf16 autocast on CUDA) with each, in interleaved rounds (medians), and the
ratio to max_length's. The losses are the same either way (tests/eae_platform/test_pretrain_data.py).

    python benchmarks/bench_padding.py DATA_DIR [--preset minilm] [--batch 128] [--steps 20] [--rounds 3]
        [--multiple 16] [--entities 5000] [--compile] [--processes 1]

DATA_DIR: a built dataset (`eae data build`); its train split's first batches, in a shuffled order.
--processes N runs N copies side by side, as the regime study's cells share one GPU, and prints
each one's figures and their medians: one process alone can leave the GPU idle between launches
(on an H100 `minilm` at batch 128 took 43.6 ms a step either way), where N of them keep it busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from eae_data.shards import shard_files
from eae_model.config import load_config
from eae_model.model import EaEModel
from eae_platform.bench import device_name
from eae_platform.pretrain import data
from eae_platform.pretrain.loop import compile_modules


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--preset", default="minilm")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="batches a round, each padding")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--multiple", type=int, default=16)
    parser.add_argument("--entities", type=int, default=5000, help="the table's rows (ids past it: unlinked)")
    parser.add_argument("--compile", action="store_true", help="compile the stacks, as the job does on GPUs")
    parser.add_argument("--processes", type=int, default=1, help="copies side by side, each its own process")
    # a side-by-side copy's: where it leaves its figures, and DIR:N, the folder where N copies meet
    # after their warm-up, so that no copy's compilation overlaps another's timed rounds
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    return args


def measure(args: argparse.Namespace) -> dict:
    """Times the training step with each padding, prints its table, returns the figures."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = load_config(args.preset, overrides=[f"num_entities={args.entities}"])
    files = shard_files(args.data, "train")
    if not files:
        sys.exit(f"no train shards under {args.data}: a built dataset is needed (eae data build, experiments/regime/data.sh)")
    rows = list(data.cached_batches(files, args.steps * args.batch, args.batch, {}, [0, 0, 0]))
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
    if args.barrier:
        meet(*args.barrier.rsplit(":", 1))
    times = {name: [] for name in paddings}
    for _ in range(args.rounds):
        for name in paddings:
            times[name].append(run(name))
    real = statistics.fmean(int(b.attention_mask.sum()) for b in batches["max_length"])
    print(f"device {device_name(device)}, torch {torch.__version__}, "
          f"preset {args.preset}, batch {args.batch}, {args.steps} batches x {args.rounds} rounds, compile {args.compile}, "
          f"{torch.get_num_threads()} CPU thread(s), "
          f"{real:,.0f} real tokens a step")
    base = statistics.median(times["max_length"])
    print(f"{'padding':>16} {'tokens/step':>12} {'lengths':>12} {'ms/step':>9} {'vs max_length':>14}")
    for name in paddings:
        lengths = sorted({b.input_ids.shape[1] for b in batches[name]})
        tokens = statistics.fmean(b.input_ids.numel() for b in batches[name])
        ms = statistics.median(times[name])
        print(f"{name:>16} {tokens:12,.0f} {','.join(map(str, lengths)):>12} {ms:9.1f} {ms / base:13.2f}x")
    return {"max_length_ms": base, "multiple_ms": statistics.median(times[f"multiple of {args.multiple}"])}


def meet(folder: str, n: str) -> None:
    """Waits until n copies have reached this point (each leaves a file in folder)."""
    Path(folder, f"ready-{os.getpid()}").touch()
    while len(list(Path(folder).glob("ready-*"))) < int(n):
        time.sleep(0.05)


def side_by_side(args: argparse.Namespace, argv: list[str]) -> None:
    """Runs args.processes copies at once, prints each one's table and the medians over them.
    A copy that fails stops the others (they would wait for it at the barrier)."""
    n = args.processes
    # each copy its share of the host's cores (torch's CPU threads), unless set: N copies each
    # taking every core contend for them, and on a CPU their step times measure the contention
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n)), **os.environ}
    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for i in range(n):
            cmd = [sys.executable, __file__, *argv, "--processes", "1", "--json", f"{tmp}/{i}.json",
                   "--barrier", f"{tmp}:{n}"]
            with open(f"{tmp}/{i}.out", "w") as out:
                copies.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        while any(c.poll() is None for c in copies):
            if any(c.returncode for c in copies):
                for c in copies:
                    c.terminate()
            time.sleep(0.2)
        for i, c in enumerate(copies):
            print(f"## process {i + 1} of {n}\n{Path(tmp, f'{i}.out').read_text().rstrip()}")
        failed = [i + 1 for i, c in enumerate(copies) if c.returncode]
        if failed:
            sys.exit(f"process(es) {', '.join(map(str, failed))} of {n} failed or were stopped, their output above")
        figures = [json.loads(Path(tmp, f"{i}.json").read_text()) for i in range(n)]
    base = [f["max_length_ms"] for f in figures]
    padded = [f["multiple_ms"] for f in figures]
    ratios = [p / b for p, b in zip(padded, base)]
    print(f"{n} processes side by side, medians (range): max_length {statistics.median(base):.1f} ms "
          f"({min(base):.1f}-{max(base):.1f}), multiple of {args.multiple} {statistics.median(padded):.1f} ms "
          f"({min(padded):.1f}-{max(padded):.1f}), {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)")


def without_processes(argv: list[str]) -> list[str]:
    """argv less its --processes N (or --processes=N): the copies' own arguments."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            kept.append(a)
    return kept


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.processes > 1:
        side_by_side(args, without_processes(argv))
        return
    figures = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
