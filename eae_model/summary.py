"""Parameter counts per component, from a model built on the meta device (no weights
allocated: the paper preset's 1M x 256 table costs nothing to count)."""

from __future__ import annotations

import torch

from eae_model.config import EaEConfig
from eae_model.model import EaEModel

# Component -> the attribute prefixes of its parameters.
COMPONENTS = {
    "token_embed": ("token_embed.",),
    "transformer_l0": ("transformer_l0.",),
    "entity_memory": ("entity_memory.", "memory_norm."),
    "transformer_l1": ("transformer_l1.",),
    "mention_head": ("mention_head.",),
    "token_pred": ("token_pred.",),
    "entity_pred": ("entity_pred.",),
    "entity_table": ("entity_table.",),
}


def parameter_counts(config: EaEConfig) -> dict[str, int]:
    """{component: parameters, ..., "total": all}. Tied weights (the MLM decoder reuses the
    word embeddings) are counted once, under token_embed."""
    with torch.device("meta"):
        model = EaEModel(config)
    counts = dict.fromkeys(COMPONENTS, 0)
    for name, param in model.named_parameters():  # named_parameters() yields each tensor once
        component = next((c for c, prefixes in COMPONENTS.items() if name.startswith(prefixes)), None)
        if component is None:
            raise AssertionError(f"parameter {name} belongs to no summary component")
        counts[component] += param.numel()
    counts["total"] = sum(counts.values())
    return counts


def format_summary(config: EaEConfig, counts: dict[str, int]) -> str:
    lines = [
        f"EaE model summary — preset {config.preset!r}",
        f"  transformer: {config.l0} + {config.l1} layers, hidden {config.hidden_size}, "
        f"{config.num_heads} heads, FFN {config.ffn_size}, vocab {config.vocab_size}, max length {config.max_length}",
    ]
    if config.has_entity_table:
        k = lambda v: "all" if v is None else str(v)  # noqa: E731
        lines.append(
            f"  entities: {config.num_entities:,} x {config.entity_dim}"
            + (f", memory after layer {config.l0}, k = {k(config.k_train)} (train) / {k(config.k_inference)} (inference)"
               if config.use_entity_memory else ", EntityPred head only")
        )
    lines.append(f"  {'component':<16}{'parameters':>16}")
    for name, value in counts.items():
        if name != "total":
            lines.append(f"  {name:<16}{value:>16,}")
    lines.append(f"  {'total':<16}{counts['total']:>16,}  (~{counts['total'] / 1e6:.1f}M)")
    return "\n".join(lines)
