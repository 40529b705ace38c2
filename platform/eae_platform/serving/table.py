"""The entity table at inference: E in memory plus an index over it (faiss, or on a GPU the
exact top-k kernel), with the interface of eae_model.entity_table.EntityTable, so EaEModel's
memory retrieves its top-k through the index.

Rows can be appended (new entities, `add_rows`): E and the index grow together, and the new
ids are N, N+1, ... No loss is computed (nothing here trains); EntityPred's call
(retrieve=False) returns no dense [M, N] logits either: the engine searches the index with
EntityPred's queries itself.
"""

from __future__ import annotations

import torch
from torch import nn

from eae_model.entity_table import TableOutput
from eae_platform.serving.index import EntityIndex, IndexConfig


class FaissEntityTable(nn.Module):
    def __init__(self, weight: torch.Tensor, index_config: IndexConfig | None = None, device=None):
        """weight: E [N, d]; device: where the model runs (None: where `weight` is). On a GPU,
        a flat index is the exact top-k kernel over the rows on the GPU, and E is those rows
        (one copy of a 1M x 256 table, not two)."""
        super().__init__()
        device = torch.device(device) if device is not None else weight.device
        weight = weight.detach().float()
        self.index = EntityIndex(weight.cpu().numpy(), index_config, device)
        # E, [N, d], a buffer that can grow; for the triton index, its rows (the property below)
        self._weight = None if self.index.backend == "triton" else weight.to(device).contiguous()

    @property
    def weight(self) -> torch.Tensor:
        return self.index.rows if self._weight is None else self._weight

    @property
    def num_entities(self) -> int:
        return self.weight.shape[0]

    def add_rows(self, rows: torch.Tensor) -> list[int]:
        """Append rows [n, d]; returns their ids."""
        rows = rows.detach().float().reshape(-1, self.weight.shape[1])
        first = self.num_entities
        self.index.add(rows.cpu().numpy())
        if self._weight is not None:
            self._weight = torch.cat([self._weight, rows.to(self._weight.device)])
        return list(range(first, self.num_entities))

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores [M, k], ids [M, k]) on h's device; ids -1 where an approximate index found fewer."""
        return self.index.search_tensor(h.detach().float(), k)

    @torch.no_grad()
    def attend(self, h: torch.Tensor, k: int | None, targets: torch.Tensor | None = None,
               retrieve: bool = True) -> TableOutput:
        """h [M, d] -> E_m [M, d]: softmax over the top-k scores (k None = all rows)."""
        zero = h.new_zeros((), dtype=torch.float32)
        if not retrieve:
            return TableOutput(retrieved=None, loss=zero)
        if k is None or k >= self.num_entities:  # all entities: the full softmax, no search needed
            weights = torch.softmax(h.float() @ self.weight.T, -1)
            return TableOutput(retrieved=(weights @ self.weight).to(h.dtype), loss=zero)
        scores, ids = self.top_k(h, k)
        found = ids >= 0
        weights = torch.softmax(scores.masked_fill(~found, float("-inf")), -1).nan_to_num(0.0)  # none found: 0
        rows = self.weight[ids.clamp(min=0)]  # [M, k, d]
        retrieved = torch.einsum("mk,mkd->md", weights, rows) if len(h) else h.new_zeros(0, self.weight.shape[1])
        return TableOutput(retrieved=retrieved.to(h.dtype), loss=zero)
