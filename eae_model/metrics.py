"""The paper's Table 2 metrics of masked hyperlink prediction, as sums over batches.

    sums = defaultdict(float)
    for batch in batches:
        out = model(ids, mask, mentions=mentions, mlm_labels=labels)
        add_masked_prediction(sums, model, out, ids, mentions, labels)
    masked_prediction_metrics(sums)   # entity_accuracy, token_accuracy, perplexity

Sums rather than means so that distributed evaluation can add them over workers first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from eae_data.constants import NULL_ENTITY
from eae_model.mentions import Mentions

SUM_KEYS = ("token_nll", "token_correct", "tokens", "entity_correct", "entities")


def add_masked_prediction(sums: dict[str, float], model, out, input_ids: torch.Tensor, mentions: Mentions,
                          mlm_labels: torch.Tensor) -> None:
    """Add one batch: TokenPred's cross-entropy and hits over masked tokens, EntityPred's top-1
    hits over masked linked mentions (a mention is masked when its first token is [MASK]).
    With a sharded table, every worker must call this (top_k is collective)."""
    if out.mlm_logits is not None and out.mlm_logits.numel():
        targets = mlm_labels[out.mlm_positions]
        logits = out.mlm_logits.float()
        sums["token_nll"] += float(F.cross_entropy(logits, targets, reduction="sum"))
        sums["token_correct"] += float((logits.argmax(-1) == targets).sum())
        sums["tokens"] += targets.numel()
    if out.entity_queries is not None:
        masked = input_ids[mentions.batch_ids, mentions.starts] == model.config.mask_token_id
        linked = masked & (mentions.entity_ids != NULL_ENTITY)
        _, top = model.entity_table.top_k(out.entity_queries.float(), 1)
        sums["entity_correct"] += float(((top[:, 0] == mentions.entity_ids) & linked).sum())
        sums["entities"] += float(linked.sum())


def masked_prediction_metrics(sums: dict[str, float]) -> dict[str, float]:
    """token_accuracy and perplexity when there were masked tokens, entity_accuracy when there
    were masked linked mentions."""
    metrics = {}
    if sums.get("tokens"):
        metrics["token_accuracy"] = sums["token_correct"] / sums["tokens"]
        metrics["perplexity"] = math.exp(min(sums["token_nll"] / sums["tokens"], 50.0))
    if sums.get("entities"):
        metrics["entity_accuracy"] = sums["entity_correct"] / sums["entities"]
    return metrics
