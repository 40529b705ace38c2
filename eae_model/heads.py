"""Task-specific heads: BIO mention detection (on X1), TokenPred and EntityPred (on X4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eae_data.constants import NULL_ENTITY
from eae_model.entity_table import EntityTable, TableOutput
from eae_model.memory import span_representation
from eae_model.mentions import Mentions


class MentionDetectionHead(nn.Module):
    """Per-token B/I/O logits from the first transformer block's output X1."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, 3)

    def forward(self, x1: torch.Tensor) -> torch.Tensor:
        """x1 [B, L, H] -> BIO logits [B, L, 3] (columns in eae_model.bio order: O, B, I)."""
        return self.classifier(x1)


class TokenPredHead(nn.Module):
    """BERT's masked-LM head: dense + GELU + LayerNorm, then a decoder tied to the word
    embeddings, passed in at call time (only the decoder's bias is a new parameter)."""

    def __init__(self, hidden_size: int, vocab_size: int, eps: float):
        super().__init__()
        self.transform = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x4: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """x4 [..., H], word embeddings [V, H] -> vocabulary logits [..., V]."""
        return F.linear(self.norm(F.gelu(self.transform(x4))), word_embeddings, self.bias)


class EntityPredHead(nn.Module):
    """h'_m = W'_f [x4_s || x4_t], scored against every row of E by dot product."""

    def __init__(self, hidden_size: int, entity_dim: int):
        super().__init__()
        self.project_query = nn.Linear(2 * hidden_size, entity_dim, bias=False)

    def forward(
        self, x4: torch.Tensor, mentions: Mentions, table: EntityTable, targets: torch.Tensor | None = None,
        linked: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TableOutput]:
        """x4 [B, L, H], M mentions -> (h' [M, d], the table's output). Without targets the
        table scores all M mentions; with targets [M] it scores only the linked ones
        (target != NULL_ENTITY), the only mentions the EL loss reads: in pretraining about
        half, and each costs a pass over all N rows forward and backward. linked: their
        indices, if the caller has them (the model computes them before the first layer)."""
        h = self.project_query(span_representation(x4, mentions))
        if targets is None:
            return h, table.attend(h, None, None, retrieve=False)
        if linked is None:
            linked = (targets != NULL_ENTITY).nonzero(as_tuple=True)[0]
        return h, table.attend(h[linked], None, targets[linked], retrieve=False)
