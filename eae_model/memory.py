"""The entity memory layer (paper section "Entity Memory Layer").

For each mention m with start s_m and end t_m in X1:
    h_m   = W_f [x_s || x_t]                                  pseudo entity embedding
    top_k = the k rows of E with the highest dot product E_j . h_m
    a_j   = exp(E_j . h_m) / sum_{e in top_k} exp(E_e . h_m)   softmax over those k only
    E_m   = sum_{j in top_k} a_j E_j
    X2[s_m] = W_b E_m, and X2 is zero at every other position.
With k = all entities (None) the top-k step is skipped, which is exactly the full softmax.
The retrieval itself is the entity table's (eae_model.entity_table), so a sharded table
plugs in unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eae_model.entity_table import EntityTable
from eae_model.mentions import Mentions


def span_representation(x: torch.Tensor, mentions: Mentions) -> torch.Tensor:
    """x [B, L, H] -> [x_s || x_t] of every mention, [M, 2H]."""
    return torch.cat([x[mentions.batch_ids, mentions.starts], x[mentions.batch_ids, mentions.ends]], dim=-1)


@dataclass
class MemoryOutput:
    x2: torch.Tensor  # [B, L, H], W_b E_m at each mention start, zeros elsewhere
    pseudo_embeddings: torch.Tensor  # h, [M, d]
    retrieved: torch.Tensor  # E_m, [M, d]
    loss: torch.Tensor  # EL loss of h over all entities (0 without targets)
    logits: torch.Tensor | None = None  # h E^T, [M, N], when the table is in one piece


class EntityMemory(nn.Module):
    """X2 = EntityMemory(X1, mentions), reading the entity table passed in (the model owns it,
    and the EntityPred head shares it)."""

    def __init__(self, hidden_size: int, entity_dim: int):
        super().__init__()
        self.project_query = nn.Linear(2 * hidden_size, entity_dim, bias=False)  # W_f
        self.project_value = nn.Linear(entity_dim, hidden_size, bias=False)  # W_b

    def forward(
        self,
        x1: torch.Tensor,
        mentions: Mentions,
        table: EntityTable,
        k: int | None,
        targets: torch.Tensor | None = None,
    ) -> MemoryOutput:
        """x1 [B, L, H]; mentions with M entries (validated: non-overlapping); k: top-k (None =
        all); targets [M]: entity ids for the EL loss (None: unsupervised)."""
        h = self.project_query(span_representation(x1, mentions))
        out = table.attend(h, k, targets)
        values = self.project_value(out.retrieved).to(x1.dtype)
        # Out-of-place index_put: differentiable in `values`; start positions never repeat
        # within a context because overlapping mentions are rejected.
        x2 = x1.new_zeros(x1.shape).index_put((mentions.batch_ids, mentions.starts), values)
        return MemoryOutput(x2=x2, pseudo_embeddings=h, retrieved=out.retrieved, loss=out.loss, logits=out.logits)
