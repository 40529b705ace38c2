"""Mention masking, EaE's input function (paper section "Data and Preprocessing"):

    "We remove 20% of randomly chosen entity mentions (all tokens in the mention boundaries
    are replaced with [MASK]) to support a masked language modeling objective."

Whole mentions are masked, never single wordpieces, so the TokenPred head must recover a
name from its context (and the entity memory) rather than from the rest of the name. Every
mention is a candidate, linked or not (the paper's footnote: "In pre-training, we also mask
non-hyperlinked mentions").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eae_model.mentions import Mentions
from eae_model.model import IGNORE


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # [B, L], a copy with every token of each masked mention set to [MASK]
    mlm_labels: torch.Tensor  # [B, L], the original token where masked, IGNORE elsewhere
    masked: torch.Tensor  # [M] bool, which mentions were masked


def mask_mentions(
    input_ids: torch.Tensor,
    mentions: Mentions,
    rate: float = 0.2,
    mask_token_id: int = 103,
    generator: torch.Generator | None = None,
) -> MaskedBatch:
    """Mask each mention independently with probability `rate`.

    input_ids: [B, L] token ids (not modified); mentions: M non-overlapping spans of the batch,
    start to end inclusive; mask_token_id: [MASK] (103 in bert-base-uncased); generator: the
    random source, for reproducible masks. Returns MaskedBatch (input_ids and mlm_labels
    [B, L], masked [M]).
    """
    if not 0.0 <= rate <= 1.0:  # also rejects NaN
        raise ValueError(f"mask rate must be in [0, 1], got {rate}")
    # Draw on the generator's device (torch.rand requires it), then move to the batch's.
    draw_device = generator.device if generator is not None else input_ids.device
    masked = (torch.rand(len(mentions), generator=generator, device=draw_device) < rate).to(input_ids.device)

    # [M', L] coverage of the chosen spans, folded onto their contexts as [B, L].
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    starts, ends = mentions.starts[masked], mentions.ends[masked]
    covered = (positions >= starts[:, None]) & (positions <= ends[:, None])
    hit = torch.zeros(input_ids.shape, dtype=torch.long, device=input_ids.device)
    hit = hit.index_add(0, mentions.batch_ids[masked], covered.long()) > 0

    return MaskedBatch(
        input_ids=input_ids.masked_fill(hit, mask_token_id),
        mlm_labels=torch.where(hit, input_ids, IGNORE),
        masked=masked,
    )
