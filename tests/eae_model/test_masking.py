import math

import pytest
import torch

from eae_model.masking import MaskedBatch, mask_mentions
from eae_model.mentions import Mentions
from eae_model.model import IGNORE

MASK = 103


def _batch() -> tuple[torch.Tensor, Mentions]:
    # Two contexts: [CLS] 7 8 9 10 11 [SEP] pad / [CLS] 20 21 22 23 24 25 [SEP].
    input_ids = torch.tensor(
        [
            [101, 7, 8, 9, 10, 11, 102, 0],
            [101, 20, 21, 22, 23, 24, 25, 102],
        ]
    )
    # Mentions: (0, 1-2), (0, 4-4), (1, 2-5), a one-token mention and two multi-token ones.
    mentions = Mentions.from_lists([[(1, 2), (4, 4)], [(2, 5)]], [[3, -1], [5]])
    return input_ids, mentions


def test_rate_one_masks_every_mention_token_exactly():
    input_ids, mentions = _batch()
    out = mask_mentions(input_ids, mentions, rate=1.0)
    assert isinstance(out, MaskedBatch)
    assert out.masked.tolist() == [True, True, True]  # the unlinked mention too
    assert out.input_ids.tolist() == [
        [101, MASK, MASK, 9, MASK, 11, 102, 0],
        [101, 20, MASK, MASK, MASK, MASK, 25, 102],
    ]
    assert out.mlm_labels.tolist() == [
        [IGNORE, 7, 8, IGNORE, 10, IGNORE, IGNORE, IGNORE],
        [IGNORE, IGNORE, 21, 22, 23, 24, IGNORE, IGNORE],
    ]


def test_rate_zero_masks_nothing():
    input_ids, mentions = _batch()
    out = mask_mentions(input_ids, mentions, rate=0.0)
    assert out.masked.tolist() == [False, False, False]
    assert torch.equal(out.input_ids, input_ids)
    assert (out.mlm_labels == IGNORE).all()


def test_partial_mask_matches_chosen_mentions():
    # Whatever the draw, masked tokens are exactly the chosen mentions' tokens, labels hold
    # the originals there, and everything else is untouched.
    input_ids, mentions = _batch()
    seen = set()
    for seed in range(40):
        out = mask_mentions(input_ids, mentions, rate=0.5, generator=torch.Generator().manual_seed(seed))
        expected = torch.zeros(input_ids.shape, dtype=torch.bool)
        for i in out.masked.nonzero().flatten().tolist():
            expected[mentions.batch_ids[i], mentions.starts[i] : mentions.ends[i] + 1] = True
        assert torch.equal(out.input_ids == MASK, expected)
        assert torch.equal(out.mlm_labels[expected], input_ids[expected])
        assert (out.mlm_labels[~expected] == IGNORE).all()
        assert torch.equal(out.input_ids[~expected], input_ids[~expected])
        seen.add(tuple(out.masked.tolist()))
    assert len(seen) > 4  # the draws really differ between mentions and seeds


def test_custom_mask_token():
    input_ids, mentions = _batch()
    out = mask_mentions(input_ids, mentions, rate=1.0, mask_token_id=4)
    assert out.input_ids[0, 1:3].tolist() == [4, 4]
    assert not (out.input_ids == MASK).any()


def test_same_seed_same_mask_and_different_seed_differs():
    input_ids = torch.full((8, 40), 5)
    mentions = Mentions.from_lists([[(1 + 3 * j, 2 + 3 * j) for j in range(12)] for _ in range(8)])
    run = lambda seed: mask_mentions(input_ids, mentions, 0.3, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a.masked, b.masked) and torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.mlm_labels, b.mlm_labels)
    assert not torch.equal(a.masked, c.masked)


def test_about_twenty_percent_of_mentions_masked():
    n = 20_000
    input_ids = torch.full((n, 4), 5)
    mentions = Mentions.from_lists([[(1, 2)]] * n)
    out = mask_mentions(input_ids, mentions, generator=torch.Generator().manual_seed(0))
    # Binomial(n, 0.2): 5 standard deviations is ~0.014, so 0.19 / 0.21 would only fail
    # with a wrong rate (or not independent draws), not by chance.
    sd = math.sqrt(0.2 * 0.8 / n)
    fraction = out.masked.float().mean().item()
    assert abs(fraction - 0.2) < 5 * sd
    # Masked tokens follow whole mentions: two per masked mention.
    assert int((out.input_ids == MASK).sum()) == 2 * int(out.masked.sum())


def test_input_not_mutated():
    input_ids, mentions = _batch()
    before = input_ids.clone()
    out = mask_mentions(input_ids, mentions, rate=1.0)
    assert torch.equal(input_ids, before)
    assert out.input_ids.data_ptr() != input_ids.data_ptr()


def test_no_mentions():
    input_ids, _ = _batch()
    out = mask_mentions(input_ids, Mentions.empty(), rate=1.0)
    assert out.masked.shape == (0,)
    assert torch.equal(out.input_ids, input_ids)
    assert (out.mlm_labels == IGNORE).all()


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_bad_rate_rejected(rate):
    input_ids, mentions = _batch()
    with pytest.raises(ValueError, match="mask rate"):
        mask_mentions(input_ids, mentions, rate=rate)
