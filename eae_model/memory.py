"""The entity memory layer (paper section "Entity Memory Layer").

For each mention m with start s_m and end t_m in X1:
    h_m   = W_f [x_s || x_t]                                  pseudo entity embedding
    top_k = the k rows of E with the highest dot product E_j . h_m
    a_j   = exp(E_j . h_m) / sum_{e in top_k} exp(E_e . h_m)   softmax over those k only
    E_m   = sum_{j in top_k} a_j E_j
    X2[s_m] = W_b E_m, and X2 is zero at every other position.
With k = all entities (None) the top-k step is skipped, which is exactly the full softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eae_model.mentions import Mentions


def span_representation(x: torch.Tensor, mentions: Mentions) -> torch.Tensor:
    """x [B, L, H] -> [x_s || x_t] of every mention, [M, 2H]."""
    return torch.cat([x[mentions.batch_ids, mentions.starts], x[mentions.batch_ids, mentions.ends]], dim=-1)


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    # In at least float32: bf16 logits would lose the small weights.
    return torch.softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32))


def entity_attention(h: torch.Tensor, entities: torch.Tensor, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft retrieval of entity embeddings.

    h: [M, d] pseudo entity embeddings; entities: E, [N, d]; k: top-k size, None = all N.
    Returns (E_m [M, d], logits [M, N] = h E^T). The logits over *all* entities are returned
    because the entity-linking loss is a softmax over all of E even when retrieval uses top-k.
    """
    logits = h @ entities.T
    if k is None or k >= entities.shape[0]:
        weights = _softmax(logits).to(entities.dtype)
        return weights @ entities, logits
    top_logits, top_ids = logits.topk(k, dim=-1)  # [M, k]
    weights = _softmax(top_logits).to(entities.dtype)
    return torch.einsum("mk,mkd->md", weights, entities[top_ids]), logits


@dataclass
class MemoryOutput:
    x2: torch.Tensor  # [B, L, H], W_b E_m at each mention start, zeros elsewhere
    pseudo_embeddings: torch.Tensor  # h, [M, d]
    logits: torch.Tensor  # h E^T, [M, N]
    retrieved: torch.Tensor  # E_m, [M, d]


class EntityMemory(nn.Module):
    """X2 = EntityMemory(X1, mentions) with the entity table E passed in (the model owns E,
    which the EntityPred head shares)."""

    def __init__(self, hidden_size: int, entity_dim: int):
        super().__init__()
        self.project_query = nn.Linear(2 * hidden_size, entity_dim, bias=False)  # W_f
        self.project_value = nn.Linear(entity_dim, hidden_size, bias=False)  # W_b

    def forward(
        self, x1: torch.Tensor, mentions: Mentions, entities: torch.Tensor, k: int | None
    ) -> MemoryOutput:
        """x1 [B, L, H]; mentions with M entries (validated: non-overlapping); E [N, d]."""
        h = self.project_query(span_representation(x1, mentions))
        retrieved, logits = entity_attention(h, entities, k)
        values = self.project_value(retrieved).to(x1.dtype)
        # Out-of-place index_put: differentiable in `values`; start positions never repeat
        # within a context because overlapping mentions are rejected.
        x2 = x1.new_zeros(x1.shape).index_put((mentions.batch_ids, mentions.starts), values)
        return MemoryOutput(x2=x2, pseudo_embeddings=h, logits=logits, retrieved=retrieved)
