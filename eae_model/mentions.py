"""Mentions of a batch, flattened: mention i lies in context `batch_ids[i]` from token
`starts[i]` to token `ends[i]` (inclusive, as s_m and t_m in the paper) and is linked to
`entity_ids[i]`, or to the null entity e_0 (NULL_ENTITY) when unlinked.

A flat list rather than a [B, max_mentions] grid: contexts hold very different numbers of
mentions (the paper's data: ~4.4 per context on average), and every computation on mentions
(span gathers, the memory, the EL losses) works on the list directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from eae_data.constants import NULL_ENTITY


class MentionError(ValueError):
    """A mention that cannot be placed in its batch (out of range, overlapping, ...)."""


@dataclass
class Mentions:
    batch_ids: torch.Tensor  # [M] long, which context
    starts: torch.Tensor  # [M] long, first wordpiece s_m
    ends: torch.Tensor  # [M] long, last wordpiece t_m (inclusive)
    entity_ids: torch.Tensor | None = None  # [M] long, NULL_ENTITY (-1) when unlinked

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> "Mentions":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return cls(z, z.clone(), z.clone(), z.clone())

    @classmethod
    def from_lists(
        cls, spans: list[list[tuple[int, int]]], entities: list[list[int]] | None = None
    ) -> "Mentions":
        """spans[b] = [(start, end), ...] per context; entities[b] = [entity_id, ...]."""
        batch_ids, starts, ends, ids = [], [], [], []
        for b, context_spans in enumerate(spans):
            for j, (s, t) in enumerate(context_spans):
                batch_ids.append(b)
                starts.append(s)
                ends.append(t)
                ids.append(entities[b][j] if entities is not None else NULL_ENTITY)
        as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        return cls(as_long(batch_ids), as_long(starts), as_long(ends), as_long(ids))

    def to(self, device: torch.device | str) -> "Mentions":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Mentions(move(self.batch_ids), move(self.starts), move(self.ends), move(self.entity_ids))

    def spans(self) -> "Mentions":
        """The same spans without their entity ids: a forward given them computes no
        entity-linking loss (evaluation, where those losses' softmax over all N entities is
        wasted work)."""
        return Mentions(self.batch_ids, self.starts, self.ends)

    def linked(self) -> torch.Tensor:
        """[M] bool: mentions with a real entity (the only ones that get an EL loss)."""
        if self.entity_ids is None:
            return torch.zeros_like(self.starts, dtype=torch.bool)
        return self.entity_ids != NULL_ENTITY

    def validate(self, attention_mask: torch.Tensor, num_entities: int | None = None) -> None:
        """Raise MentionError with a clear message unless every mention is well placed.

        attention_mask: [B, L], nonzero on real tokens. A mention must lie inside its context's
        real tokens, have start <= end, and not overlap another mention of the same context
        (two mentions sharing a start position would be written to the same slot).
        """
        m = len(self)
        shapes = {t.shape for t in (self.batch_ids, self.starts, self.ends)}
        if self.entity_ids is not None:
            shapes.add(self.entity_ids.shape)
        if len(shapes) != 1 or next(iter(shapes)) != (m,):
            raise MentionError(f"mention tensors must all have shape [M]; got {sorted(map(tuple, shapes))}")
        if m == 0:
            return
        batch, length = attention_mask.shape
        # Every check on the device first, then one host sync for all of them (a step's
        # forward waits for the GPU at each sync); the messages only when something is wrong.
        in_batch = (self.batch_ids >= 0) & (self.batch_ids < batch)
        in_span = (self.starts >= 0) & (self.ends < length) & (self.starts <= self.ends)
        lengths = attention_mask.long().sum(1)
        in_text = self.ends < lengths[self.batch_ids.clamp(0, batch - 1)]
        # Overlap: sort by (context, start); a mention may not start before the previous ends.
        order = torch.argsort(self.batch_ids * length + self.starts)
        b, s, t = self.batch_ids[order], self.starts[order], self.ends[order]
        clash = (b[1:] == b[:-1]) & (s[1:] <= t[:-1])
        ok = in_batch.all() & in_span.all() & in_text.all() & ~clash.any()
        if self.entity_ids is not None and num_entities is not None:
            ok &= ((self.entity_ids >= NULL_ENTITY) & (self.entity_ids < num_entities)).all()
        if bool(ok):
            return
        _raise_first(~in_batch, lambda i: (
            f"mention {i}: batch id {int(self.batch_ids[i])} outside the batch of {batch}"
        ))
        _raise_first(~in_span, lambda i: (
            f"mention {i}: span [{int(self.starts[i])}, {int(self.ends[i])}] is not inside "
            f"a sequence of {length} tokens with start <= end"
        ))
        _raise_first(~in_text, lambda i: (
            f"mention {i}: span ends at token {int(self.ends[i])}, past the "
            f"{int(lengths[self.batch_ids[i]])} real tokens of context {int(self.batch_ids[i])}"
        ))
        _raise_first(clash, lambda j: (
            f"overlapping mentions in context {int(b[j])}: [{int(s[j])}, {int(t[j])}] and "
            f"[{int(s[j + 1])}, {int(t[j + 1])}]"
        ))
        if self.entity_ids is not None and num_entities is not None:
            _raise_first((self.entity_ids < NULL_ENTITY) | (self.entity_ids >= num_entities), lambda i: (
                f"mention {i}: entity id {int(self.entity_ids[i])} is neither {NULL_ENTITY} "
                f"(unlinked) nor in [0, {num_entities})"
            ))


def _raise_first(bad: torch.Tensor, message: Callable[[int], str]) -> None:
    """Raise MentionError(message(i)) for the first i where bad[i] is true, if any."""
    if bad.any():
        raise MentionError(message(int(bad.nonzero()[0])))
