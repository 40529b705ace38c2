"""Real worker processes in a gloo process group, for tests of code that runs collectives."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, init: str, fn, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        out.put((rank, fn(rank, world)))
    finally:
        dist.destroy_process_group()
    # Once the result is out, leave without the interpreter's finalization: gloo's threads can
    # still hold async work whose teardown then aborts the process ("terminate called without
    # an active exception", a non-zero exit: one CI run of many, after the worker had returned its
    # figures; pytorch/pytorch#179291). A failing fn still raises above, with a non-zero exit.
    out.close()
    out.join_thread()  # the result written to the pipe first
    os._exit(0)


def run_workers(fn, world: int, tmp_path: Path, timeout: float = 120) -> list:
    """fn(rank, world) in `world` spawned processes, each in an initialised gloo group (file
    rendezvous under tmp_path); what each returned, by rank. fn must be a module-level function
    and return no torch tensors (they would travel as shared memory that the ended worker frees:
    send numpy arrays or numbers)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_entry, args=(r, world, init, fn, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [results[r] for r in range(world)]
