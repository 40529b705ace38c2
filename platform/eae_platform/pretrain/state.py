"""Checkpoint files of a pretraining run, written by every worker into one Ray Train checkpoint.

| file                          | written by | holds                                                  |
|-------------------------------|------------|--------------------------------------------------------|
| model.safetensors             | rank 0     | replicated weights (everything but the entity table)   |
| optimizer.safetensors         | rank 0     | Adam moments and steps of the replicated weights       |
| entities-RRRRR.safetensors    | rank R     | the rank's rows of E and their Adam state              |
| rng-RRRRR.safetensors         | rank R     | the rank's torch RNG state (dropout)                   |
| state.json                    | rank 0     | step, epoch, step in epoch, scheduler, MLflow run id, config |

Replicated weights and their optimizer state are identical on every rank (gradients are
averaged before the step), so rank 0's copy is the copy. Ray Train merges the workers' files
into one checkpoint directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TABLE_PREFIX = "entity_table."


def _adam_tensors(optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in params.items():
        for key, value in optimizer.state.get(p, {}).items():
            out[f"{name}::{key}"] = (value if torch.is_tensor(value) else torch.tensor(value)).detach().cpu().contiguous()
    return out


def _load_adam(optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter], tensors: dict[str, torch.Tensor]) -> None:
    for key, value in tensors.items():
        name, field = key.split("::", 1)
        p = params[name]
        # clone: safetensors' tensors are views at unaligned offsets, and unaligned moments take
        # other SIMD paths in Adam's kernels (a resumed run would drift in the last bits).
        optimizer.state[p][field] = value.to(p.device).clone()


def split_params(model: torch.nn.Module) -> tuple[dict[str, torch.nn.Parameter], dict[str, torch.nn.Parameter]]:
    """(replicated, table) parameters by name."""
    replicated, table = {}, {}
    for name, p in model.named_parameters():
        (table if name.startswith(TABLE_PREFIX) else replicated)[name] = p
    return replicated, table


def save(directory: Path, rank: int, model, optimizer, state: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    replicated, table = split_params(model)
    as_cpu = lambda ps: {n: p.detach().cpu().contiguous() for n, p in ps.items()}  # noqa: E731
    save_file({**as_cpu(table), **_adam_tensors(optimizer, table)}, str(directory / f"entities-{rank:05d}.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(directory / f"rng-{rank:05d}.safetensors"))
    if rank == 0:
        save_file(as_cpu(replicated), str(directory / "model.safetensors"))
        save_file(_adam_tensors(optimizer, replicated), str(directory / "optimizer.safetensors"))
        (directory / "state.json").write_text(json.dumps(state, indent=2))


def load(directory: Path, rank: int, model, optimizer) -> dict:
    """Restore this rank's part; returns state.json."""
    replicated, table = split_params(model)
    weights = load_file(str(directory / "model.safetensors"))  # copied into the parameters below
    shard = load_file(str(directory / f"entities-{rank:05d}.safetensors"))
    with torch.no_grad():
        for name, p in {**replicated, **table}.items():
            source = shard if name in table else weights
            if name not in source or source[name].shape != p.shape:
                raise ValueError(f"checkpoint {directory} does not fit this model at {name} "
                                 "(resume with the same config and number of workers)")
            p.copy_(source[name])
    _load_adam(optimizer, replicated, load_file(str(directory / "optimizer.safetensors")))
    _load_adam(optimizer, table, {k: v for k, v in shard.items() if "::" in k})
    torch.set_rng_state(load_file(str(directory / f"rng-{rank:05d}.safetensors"))["torch"])
    return json.loads((directory / "state.json").read_text())
