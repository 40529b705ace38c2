"""The entity table E and the two things done with it: soft top-k retrieval (the memory) and
the entity-linking loss over all entities (the memory's supervision and EntityPred).

`EntityTable` holds all N rows in one process. `eae_model.sharded_table.ShardedEntityTable`
has the same interface with the rows partitioned over training workers; the model works with
either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eae_data.constants import NULL_ENTITY
from eae_model.kernels.fused_memory import IMPLS, block_attention, linking_loss_from_lse, resolve_impl


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
    """All N x d entity embeddings in one process.

    impl: how attend computes the softmax over all N entities. "dense" materialises the
    [M, N] logits (returned, for inspection); "chunked" (PyTorch, any device) and "triton"
    (fused GPU kernels) work over blocks of chunk_rows rows and never hold the [M, N] matrix
    (eae_model.kernels.fused_memory); the results are equal up to float rounding. "auto":
    triton on CUDA tensors, dense elsewhere (fused_memory.resolve_impl), decided at each call.
    """

    def __init__(self, num_entities: int, dim: int, trainable: bool = True, impl: str = "dense", chunk_rows: int = 65536):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"memory impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.impl, self.chunk_rows = impl, chunk_rows
        self.weight = nn.Parameter(torch.empty(num_entities, dim), requires_grad=trainable)

    @property
    def num_entities(self) -> int:
        return self.weight.shape[0]

    def attend(
        self, h: torch.Tensor, k: int | None, targets: torch.Tensor | None = None, retrieve: bool = True
    ) -> TableOutput:
        """h [M, d]; k: retrieval top-k (None = all); targets [M] entity ids (NULL_ENTITY = no
        loss); retrieve=False skips E_m (EntityPred needs only the loss)."""
        impl = resolve_impl(self.impl, h)
        if impl != "dense":
            return self._attend_blocks(h, k, targets, retrieve, impl)
        if retrieve:
            retrieved, logits = entity_attention(h, self.weight, k)
        else:
            retrieved, logits = None, h @ self.weight.T
        return TableOutput(retrieved=retrieved, loss=linking_loss(logits, targets), logits=logits)

    def _attend_blocks(self, h, k, targets, retrieve, impl) -> TableOutput:
        """attend without the [M, N] logits. k < N: the exact top-k ids (no gradient, as
        topk's selection has none), then the softmax over those k scores, differentiable."""
        top = retrieve and k is not None and k < self.num_entities
        retrieved = lse = gold = None
        if (retrieve and not top) or targets is not None:
            full, lse, gold = block_attention(h, self.weight, retrieve and not top, impl, self.chunk_rows, targets)
            retrieved = full
        if top:
            _, ids = self.top_k(h, k)
            rows = self.weight[ids]  # [M, k, d]
            top_logits = torch.einsum("md,mkd->mk", h, rows.to(h.dtype))
            retrieved = torch.einsum("mk,mkd->md", _softmax(top_logits).to(rows.dtype), rows)
        if targets is None:
            return TableOutput(retrieved=retrieved, loss=h.new_zeros((), dtype=torch.float32), lse=lse)
        return TableOutput(retrieved=retrieved, loss=linking_loss_from_lse(lse, gold, targets), lse=lse, gold=gold)

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best entities by dot product: (scores [M, k], ids [M, k])."""
        k = min(k, self.num_entities)
        if resolve_impl(self.impl, h) == "dense":
            return (h @ self.weight.T).topk(k, dim=-1)
        from eae_model.kernels.exact_topk import chunked_top_k

        return chunked_top_k(h, self.weight, k, self.chunk_rows)
