"""Entities as Experts in pure PyTorch: config, model, memory layer, heads, losses, BIO
decoding, checkpoints, metrics and the kernels. Imports no Ray; the data formats, the tokenizer
and the ids they share with the model are `eae_data`'s (docs/architecture.md). Import from the
modules: `eae_model.model.EaEModel`, `eae_model.config.load_config`, `eae_model.mentions.Mentions`.
"""
