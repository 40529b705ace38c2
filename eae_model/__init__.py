"""Entities as Experts in pure PyTorch: config, model, memory layer, heads, losses, BIO
decoding, tokenizer, checkpoints. Imports no Ray."""

from eae_model.config import PRESETS, EaEConfig, load_config
from eae_model.mentions import NULL_ENTITY, MentionError, Mentions
from eae_model.model import EaEModel, EaEOutput

__all__ = ["PRESETS", "EaEConfig", "load_config", "NULL_ENTITY", "MentionError", "Mentions", "EaEModel", "EaEOutput"]
