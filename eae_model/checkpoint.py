"""Save and load a model as `model.safetensors` + `config.json`. Loading never unpickles.

A model saved by distributed pretraining keeps the entity table out of model.safetensors, in
`entities-RRRRR.safetensors` (the rows of worker R); loading concatenates them in rank order.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eae_model.config import EaEConfig
from eae_model.model import EaEModel

WEIGHTS, CONFIG = "model.safetensors", "config.json"
ENTITY_SHARDS = "entities-*.safetensors"  # E split by rows, one file per training worker
TABLE_KEY = "entity_table.weight"


def save_model(model: EaEModel, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt", "preset": model.config.preset})
    (directory / CONFIG).write_text(model.config.to_json() + "\n")
    return directory


def load_model(directory: str | Path, device: str | torch.device = "cpu", config: EaEConfig | None = None) -> EaEModel:
    """Rebuild the model from config.json (or `config`, for a pretraining checkpoint, whose
    config is in its state.json) and fill it from model.safetensors (strict: every weight must
    be present and have the expected shape)."""
    directory = Path(directory)
    for name in (WEIGHTS,) if config is not None else (WEIGHTS, CONFIG):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} not found: not a saved EaE model directory")
    if config is None:
        config = EaEConfig.from_dict(json.loads((directory / CONFIG).read_text()))
    with torch.device("meta"):
        model = EaEModel(config)
    # Clone: safetensors hands out views at unaligned offsets of one buffer, and unaligned
    # weights take other SIMD paths in the CPU kernels (outputs would differ in the last bits).
    state = {name: t.clone() for name, t in load_file(str(directory / WEIGHTS), device=str(device)).items()}
    shards = sorted(directory.glob(ENTITY_SHARDS))
    if shards and TABLE_KEY not in state:
        # Written by distributed pretraining: each worker's rows of E, in rank order.
        state[TABLE_KEY] = torch.cat([load_file(str(p), device=str(device))[TABLE_KEY] for p in shards])
    model.load_state_dict(state, strict=True, assign=True)
    if model.entity_embeddings is not None:
        model.entity_embeddings.requires_grad_(config.entity_trainable)
    return model
