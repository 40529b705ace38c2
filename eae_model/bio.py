"""BIO tags for mention detection: labels from spans, and constrained decoding.

Decoding is Viterbi over the per-token log-probabilities with the one BIO constraint
(an I must follow a B or an I), so the decoded tag sequence is always well formed and every
decoded span is a B followed by zero or more I's. Positions outside `allowed` (padding,
[CLS], [SEP]) are forced to O.
"""

from __future__ import annotations

import torch

from eae_model.mentions import Mentions

O, B, I = 0, 1, 2  # noqa: E741  (the tag names of the encoding)
IGNORE = -100  # label for positions without BIO supervision (padding)

_NEG = -1e9


def bio_labels(mentions: Mentions, attention_mask: torch.Tensor) -> torch.Tensor:
    """Tags [B, L]: B at each mention start, I inside, O elsewhere, IGNORE on padding.

    The paper applies this supervision to all tokens, assuming mention boundaries are
    complete (hyperlinks plus a mention detector's unlinked spans).
    """
    batch, length = attention_mask.shape
    labels = torch.full(attention_mask.shape, O, dtype=torch.long, device=attention_mask.device)
    if len(mentions):
        # inside[b, l] = number of spans covering l: +1 at each start, -1 after each end, then a
        # running sum. No host sync (the span lengths never leave the device).
        edges = torch.zeros(batch, length + 1, dtype=torch.long, device=attention_mask.device)
        ones = torch.ones_like(mentions.starts)
        edges.index_put_((mentions.batch_ids, mentions.starts), ones, accumulate=True)
        edges.index_put_((mentions.batch_ids, mentions.ends + 1), -ones, accumulate=True)
        labels.masked_fill_(edges.cumsum(1)[:, :length] > 0, I)  # (a boolean index would sync)
        # A tensor of B rather than `= B`: a Python scalar becomes a CPU tensor that is copied to
        # the GPU from pageable memory, and that copy makes the host wait for the GPU.
        labels.index_put_((mentions.batch_ids, mentions.starts), torch.full_like(mentions.starts, B))
    return labels.masked_fill(attention_mask == 0, IGNORE)


def decode_bio(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Constrained Viterbi decoding.

    logits: [B, L, 3] BIO scores; allowed: [B, L] bool, positions that may be in a mention.
    Returns tags [B, L] (long), always well formed: no I after an O or at a sequence start.
    """
    scores = torch.log_softmax(logits.float(), dim=-1)
    forced_o = torch.tensor([0.0, _NEG, _NEG], device=logits.device)
    scores = torch.where(allowed[..., None], scores, forced_o)
    batch, length, _ = scores.shape
    # transition[prev, next]: O -> I is the only forbidden move.
    transition = torch.zeros(3, 3, device=logits.device)
    transition[O, I] = _NEG
    best = scores[:, 0].clone()
    best[:, I] = _NEG  # a sequence cannot start inside a mention
    back = torch.zeros(batch, length, 3, dtype=torch.long, device=logits.device)
    for t in range(1, length):
        candidates = best[:, :, None] + transition[None]  # [B, prev, next]
        best, back[:, t] = candidates.max(dim=1)
        best = best + scores[:, t]
    tags = torch.empty(batch, length, dtype=torch.long, device=logits.device)
    tags[:, -1] = best.argmax(-1)
    for t in range(length - 1, 0, -1):
        tags[:, t - 1] = back[:, t].gather(1, tags[:, t : t + 1]).squeeze(1)
    return tags


def tags_to_mentions(tags: torch.Tensor) -> Mentions:
    """Well-formed tags [B, L] -> the spans they encode (entity ids all null)."""
    spans: list[list[tuple[int, int]]] = []
    for row in tags.tolist():
        context, start = [], None
        for i, tag in enumerate(row + [O]):
            if start is not None and tag != I:
                context.append((start, i - 1))
                start = None
            if tag == B:
                start = i
            elif tag == I and start is None:
                raise ValueError(f"malformed BIO tags: I at position {i} without a preceding B or I")
        spans.append(context)
    return Mentions.from_lists(spans).to(tags.device)
