"""Entities as Experts in pure PyTorch: config, model, memory layer, heads, losses, BIO
decoding, tokenizer, checkpoints, and the data formats. Imports no Ray.

The model's names are loaded on first use, so the data modules (wikidump, wikitext, synth, ...)
can be imported without importing torch.
"""

import importlib

_EXPORTS = {
    "PRESETS": "eae_model.config",
    "EaEConfig": "eae_model.config",
    "load_config": "eae_model.config",
    "NULL_ENTITY": "eae_model.mentions",
    "MentionError": "eae_model.mentions",
    "Mentions": "eae_model.mentions",
    "EaEModel": "eae_model.model",
    "EaEOutput": "eae_model.model",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'eae_model' has no attribute {name!r}")
