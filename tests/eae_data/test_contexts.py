"""Chunking, tokenization and wordpiece alignment of mentions."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eae_data.contexts import SOURCE_ALIAS, ContextBuilder, Span, chunk_boundaries
from eae_data.tokenizer import WordPieceTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer()


def test_chunks_cut_at_whitespace_within_budget():
    text = " ".join(f"word{i}" for i in range(200))  # 1,289 bytes
    ranges = chunk_boundaries(text, [], 100)
    assert all(len(text[a:b].encode()) <= 100 for a, b in ranges)
    assert all(text[a] != " " and (b == len(text) or text[b] == " ") for a, b in ranges)
    assert " ".join(text[a:b] for a, b in ranges) == text


def test_chunks_count_utf8_bytes_not_characters():
    text = " ".join(["éééé"] * 50)  # 8 bytes per word
    ranges = chunk_boundaries(text, [], 40)
    assert all(len(text[a:b].encode()) <= 40 for a, b in ranges)
    assert max(len(text[a:b].encode()) for a, b in ranges) > 30


def test_chunks_never_split_a_mention():
    text = "aa bb cc dd ee ff gg hh"
    span = Span(3, 14)  # "bb cc dd ee"
    ranges = chunk_boundaries(text, [span], 6)
    assert not any(a < span.end and b > span.start and not (a <= span.start and span.end <= b) for a, b in ranges)
    assert (3, 14) in ranges  # grows past the budget rather than split it
    assert chunk_boundaries("x" * 30, [], 10) == [(0, 30)]  # no whitespace: one chunk
    assert chunk_boundaries("   ", [], 10) == [] and chunk_boundaries("", [], 10) == []


def test_paragraph_chunks_start_at_every_blank_line_never_inside_a_mention():
    text = "Lead sentence one. Lead two.\n\nHistory\nIt was founded.\n \nSee also\nA\nB\n\n"
    ranges = chunk_boundaries(text, [], 500, paragraphs=True)
    assert [text[a:b].strip() for a, b in ranges] == ["Lead sentence one. Lead two.", "History\nIt was founded.",
                                                      "See also\nA\nB"]
    assert chunk_boundaries(text, [], 500) == [(0, len(text))]  # without: one chunk across sections
    small = chunk_boundaries(text, [], 12, paragraphs=True)  # long paragraphs still cut by bytes, within them
    assert len(small) > 3 and not any(re.search(r"\n[ \t]*\n\s*\S", text[a:b]) for a, b in small)
    assert text.index("History") in [a for a, _ in small] and text.index("See also") in [a for a, _ in small]
    across = Span(text.index("two"), text.index("founded"))  # a mention over a blank line keeps it uncut
    assert len(chunk_boundaries(text, [across], 500, paragraphs=True)) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["Paris", "ville", "New York", "l'été", "x", "—", "3.5", "naïve", "日本"]), min_size=1, max_size=80),
       st.integers(10, 80))
def test_chunks_cover_all_words_in_order(words, budget):
    text = " ".join(words)
    ranges = chunk_boundaries(text, [], budget)
    assert "".join(text[a:b] for a, b in ranges).replace(" ", "") == text.replace(" ", "")
    assert all(a < b for a, b in ranges) and all(b1 <= a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:]))


def test_mentions_on_wordpieces(tokenizer):
    text = "Abraham Lincoln visited Kentucky's capital, Frankfort."
    spans = [Span(0, 15, 7), Span(24, 32, -1, SOURCE_ALIAS), Span(44, 53, 3)]
    builder = ContextBuilder(tokenizer)
    (ctx,) = builder.build(text, spans)
    pieces = [tokenizer.id_to_token(i) for i in ctx.token_ids]
    got = [" ".join(pieces[s : t + 1]) for s, t in zip(ctx.mention_starts, ctx.mention_ends)]
    assert got == ["abraham lincoln", "kentucky", "frank ##fort"]
    assert ctx.mention_entity_ids == [7, -1, 3] and ctx.mention_sources == [0, 1, 0]
    assert not builder.skipped


def test_misaligned_and_truncated_mentions_are_counted(tokenizer):
    builder = ContextBuilder(tokenizer, chunk_bytes=10_000, max_length=8)
    text = "unbelievable things happen in Springfield every single day of the year"
    # "believ" cuts a wordpiece in the middle; "year" lies past 8 wordpieces.
    year = text.index("year")
    (ctx,) = builder.build(text, [Span(2, 8, 1), Span(30, 41, 2), Span(year, year + 4, 3)])
    assert len(ctx.token_ids) == 8 and ctx.token_ids[-1] == tokenizer.sep_id
    assert builder.skipped == {"misaligned": 1, "truncated": 1}
    assert builder.truncated_contexts == 1
    assert ctx.mention_entity_ids == [2]


def test_mentions_follow_their_chunk(tokenizer):
    text = " ".join(f"Entity{i} is here." for i in range(40))
    spans = [Span(text.index(f"Entity{i} "), text.index(f"Entity{i} ") + len(f"Entity{i}"), i) for i in range(40)]
    contexts = ContextBuilder(tokenizer, chunk_bytes=60).build(text, spans)
    assert len(contexts) > 5
    assert sorted(e for c in contexts for e in c.mention_entity_ids) == list(range(40))
    for c in contexts:
        for s, e in zip(c.mention_starts, c.mention_entity_ids):
            a, _ = c.token_offsets[s]
            assert c.text[a:].startswith(f"Entity{e}")
            assert text[c.char_offset + a :].startswith(f"Entity{e}")


@pytest.mark.parametrize("spans", [[Span(0, 50)], [Span(3, 3)], [Span(0, 5), Span(4, 8)]])
def test_bad_spans_are_rejected(tokenizer, spans):
    with pytest.raises(ValueError, match="mention span"):
        ContextBuilder(tokenizer).build("Some short text here", spans)
