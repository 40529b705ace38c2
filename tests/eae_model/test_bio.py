"""BIO labels and constrained decoding."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eae_model import bio
from eae_model.mentions import Mentions


def _well_formed(tags: list[int], allowed: list[bool]) -> bool:
    prev = bio.O
    for tag, ok in zip(tags, allowed):
        if not ok and tag != bio.O:
            return False
        if tag == bio.I and prev == bio.O:
            return False
        prev = tag
    return True


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda b: st.integers(1, 12).flatmap(
            lambda n: st.tuples(
                st.lists(st.floats(-20, 20, allow_nan=False), min_size=b * n * 3, max_size=b * n * 3),
                st.lists(st.booleans(), min_size=b * n, max_size=b * n),
                st.just((b, n)),
            )
        )
    )
)
def test_decoded_tags_are_always_well_formed(data):
    values, allowed, (b, n) = data
    logits = torch.tensor(values).view(b, n, 3)
    allowed_t = torch.tensor(allowed).view(b, n)
    tags = bio.decode_bio(logits, allowed_t)
    for row, ok in zip(tags.tolist(), allowed_t.tolist()):
        assert _well_formed(row, ok), (row, ok)
    mentions = bio.tags_to_mentions(tags)  # never raises on decoded tags
    assert bool((mentions.starts <= mentions.ends).all())
    if len(mentions):
        assert bool(allowed_t[mentions.batch_ids, mentions.starts].all())
        assert bool(allowed_t[mentions.batch_ids, mentions.ends].all())
        mentions.validate(torch.ones(b, n))  # non-overlapping, inside the sequence


def test_decoding_finds_the_best_valid_sequence():
    # Greedy would give O I I (malformed). Best valid: B I I (0.7 penalty on first token is
    # less than the gain of keeping both I's) versus O O O.
    logp = torch.log(torch.tensor([[[0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.1, 0.1, 0.8]]]))
    tags = bio.decode_bio(logp, torch.ones(1, 3, dtype=torch.bool))
    assert tags.tolist() == [[bio.B, bio.I, bio.I]]
    # When I is only slightly preferred, dropping the span is better.
    logp = torch.log(torch.tensor([[[0.98, 0.01, 0.01], [0.45, 0.1, 0.45]]]))
    assert bio.decode_bio(logp, torch.ones(1, 2, dtype=torch.bool)).tolist() == [[bio.O, bio.O]]


def test_clear_argmax_is_kept_and_disallowed_positions_forced_o():
    tags = [bio.O, bio.B, bio.I, bio.O, bio.B, bio.B, bio.I]
    logits = torch.nn.functional.one_hot(torch.tensor([tags]), 3).float() * 10
    allowed = torch.ones(1, 7, dtype=torch.bool)
    assert bio.decode_bio(logits, allowed).tolist() == [tags]
    allowed[0, 5] = False
    decoded = bio.decode_bio(logits, allowed).tolist()[0]
    assert decoded[5] == bio.O and _well_formed(decoded, allowed[0].tolist())


def test_labels_from_mentions_and_round_trip():
    mentions = Mentions.from_lists([[(1, 3), (5, 5)], [(0, 1)]])
    mask = torch.tensor([[1] * 7, [1, 1, 1, 0, 0, 0, 0]])
    labels = bio.bio_labels(mentions, mask)
    assert labels.tolist() == [
        [0, 1, 2, 2, 0, 1, 0],
        [1, 2, 0, bio.IGNORE, bio.IGNORE, bio.IGNORE, bio.IGNORE],
    ]
    back = bio.tags_to_mentions(labels.clamp(min=0))
    assert back.batch_ids.tolist() == [0, 0, 1]
    assert back.starts.tolist() == [1, 5, 0] and back.ends.tolist() == [3, 5, 1]


def test_malformed_tags_are_rejected():
    import pytest

    with pytest.raises(ValueError, match="without a preceding B"):
        bio.tags_to_mentions(torch.tensor([[0, 2, 2]]))
