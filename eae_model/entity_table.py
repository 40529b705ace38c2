"""The entity table E and the two things done with it: soft top-k retrieval (the memory) and
the entity-linking loss over all entities (the memory's supervision and EntityPred).

`EntityTable` holds all N rows in one process. `eae_platform.sharded_table.ShardedEntityTable`
has the same interface with the rows partitioned over training workers; the model works with
either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eae_model.constants import NULL_ENTITY


@dataclass
class TableOutput:
    retrieved: torch.Tensor | None  # E_m, [M, d] (None when not asked for)
    loss: torch.Tensor  # mean EL cross-entropy over linked mentions; 0 (in the graph) if none
    logits: torch.Tensor | None = None  # h E^T, [M, N]: only where the table is in one piece
    lse: torch.Tensor | None = None  # [M] log-sum-exp of h.E_j over all entities (sharded table)
    gold: torch.Tensor | None = None  # [M] h.E_target, 0 when unlinked (sharded table)


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    # In at least float32: bf16 logits would lose the small weights.
    return torch.softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32))


def entity_attention(h: torch.Tensor, entities: torch.Tensor, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft retrieval of entity embeddings, the paper's top-k equations.

    h: [M, d] pseudo entity embeddings; entities: E, [N, d]; k: top-k size, None = all N.
    Returns (E_m [M, d], logits [M, N] = h E^T). The logits over *all* entities are returned
    because the entity-linking loss is a softmax over all of E even when retrieval uses top-k.
    """
    logits = h @ entities.T
    if k is None or k >= entities.shape[0]:
        return _softmax(logits).to(entities.dtype) @ entities, logits
    top_logits, top_ids = logits.topk(k, dim=-1)  # [M, k]
    weights = _softmax(top_logits).to(entities.dtype)
    return torch.einsum("mk,mkd->md", weights, entities[top_ids]), logits


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Cross-entropy (in at least float32) averaged over targets != ignore_index; 0, still in
    the graph, when there are none."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
    return total / (targets != ignore_index).sum().clamp(min=1)


def linking_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy over all entities, averaged over linked mentions (target != NULL_ENTITY)."""
    if targets is None:
        return logits.new_zeros((), dtype=torch.float32)
    return mean_cross_entropy(logits, targets, NULL_ENTITY)


class EntityTable(nn.Module):
    """All N x d entity embeddings in one process."""

    def __init__(self, num_entities: int, dim: int, trainable: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_entities, dim), requires_grad=trainable)

    @property
    def num_entities(self) -> int:
        return self.weight.shape[0]

    def attend(
        self, h: torch.Tensor, k: int | None, targets: torch.Tensor | None = None, retrieve: bool = True
    ) -> TableOutput:
        """h [M, d]; k: retrieval top-k (None = all); targets [M] entity ids (NULL_ENTITY = no
        loss); retrieve=False skips E_m (EntityPred needs only the loss)."""
        if retrieve:
            retrieved, logits = entity_attention(h, self.weight, k)
        else:
            retrieved, logits = None, h @ self.weight.T
        return TableOutput(retrieved=retrieved, loss=linking_loss(logits, targets), logits=logits)

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best entities by dot product: (scores [M, k], ids [M, k])."""
        return (h @ self.weight.T).topk(min(k, self.num_entities), dim=-1)
