"""Cut an article into ~500-byte contexts, tokenize them, and place mentions on wordpieces.

The paper (appendix "Wikipedia Pre-training"): each article is divided into chunks of 500
bytes, tokenized with BERT's uncased vocabulary and limited to 128 wordpieces. Mentions are
the article's hyperlinks (linked to an entity when the target is in the vocabulary, else
unlinked) plus unlinked spans from a mention detector; they never overlap.
"""

from __future__ import annotations

import bisect
import itertools
import re

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from eae_data.constants import NULL_ENTITY
from eae_data.tokenizer import WordPieceTokenizer

# Where a mention came from (column `mention_sources`).
SOURCE_LINK, SOURCE_ALIAS, SOURCE_NER = 0, 1, 2
# Code points for which str.isspace() is true: the allowed cut positions.
_SPACE_POINTS = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass
class Span:
    """A character span [start, end) of an article's plain text that is a mention."""

    start: int
    end: int
    entity_id: int = NULL_ENTITY
    source: int = SOURCE_LINK


@dataclass
class Context:
    char_offset: int  # where `text` starts in the article
    text: str
    token_ids: list[int]
    token_offsets: list[tuple[int, int]]  # character span of each wordpiece in `text`
    mention_starts: list[int] = field(default_factory=list)  # first wordpiece
    mention_ends: list[int] = field(default_factory=list)  # last wordpiece (inclusive)
    mention_entity_ids: list[int] = field(default_factory=list)  # NULL_ENTITY when unlinked
    mention_sources: list[int] = field(default_factory=list)


def paragraph_ranges(text: str, spans: list[Span]) -> list[tuple[int, int]]:
    """Character ranges of `text` cut at its blank lines (a section's heading line stays with
    the paragraph under it), never inside a mention."""
    inside = [(s.start, s.end) for s in spans]
    cuts = [m.end() for m in _BLANK_LINE.finditer(text)
            if not any(a < m.start() < b or a < m.end() < b for a, b in inside)]
    return [(a, b) for a, b in zip([0, *cuts], [*cuts, len(text)]) if text[a:b].strip()]


def chunk_boundaries(text: str, spans: list[Span], chunk_bytes: int = 500,
                     paragraphs: bool = False) -> list[tuple[int, int]]:
    """Character ranges of ~chunk_bytes UTF-8 bytes each, cut at whitespace and never inside a
    mention (a chunk grows past chunk_bytes rather than split one; a text without any allowed
    cut stays whole). paragraphs: every paragraph (`paragraph_ranges`) starts a chunk of its
    own, so no context holds the end of one section and the start of the next."""
    if paragraphs:
        ranges = []
        for a, b in paragraph_ranges(text, spans):
            inner = [Span(s.start - a, s.end - a, s.entity_id, s.source) for s in spans if a <= s.start and s.end <= b]
            ranges += [(a + x, a + y) for x, y in chunk_boundaries(text[a:b], inner, chunk_bytes)]
        return ranges
    n = len(text)
    if n == 0:
        return []
    # byte_at[i]: UTF-8 offset of character i (vectorised: 1-4 bytes per code point).
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    byte_at = np.concatenate([[0], np.cumsum(sizes)])
    cuts = np.flatnonzero(np.isin(points, _SPACE_POINTS))
    if spans and len(cuts):
        inside = np.zeros(n + 1, dtype=np.int32)  # +1 / -1 at span edges, cumsum > 0 inside
        for span in spans:
            inside[span.start + 1] += 1
            inside[span.end] -= 1
        cuts = cuts[np.cumsum(inside)[cuts] <= 0]
    cut_bytes = byte_at[cuts]
    ranges, start = [], 0
    while start < n:
        while start < n and text[start].isspace():
            start += 1
        if start >= n:
            break
        target = byte_at[start] + chunk_bytes
        if byte_at[n] <= target:
            end = n
        else:
            # the last allowed cut within budget, else the first one after it
            i = int(np.searchsorted(cut_bytes, target, side="right")) - 1
            if i >= 0 and cuts[i] > start:
                end = int(cuts[i])
            else:
                j = int(np.searchsorted(cuts, start, side="right"))
                end = int(cuts[j]) if j < len(cuts) else n
        ranges.append((start, end))
        start = end
    return ranges


def token_span(
    offsets: list[tuple[int, int]], reach: list[int], start: int, end: int
) -> tuple[int, int] | None:
    """Wordpieces exactly covering the characters [start, end), or None when a wordpiece
    crosses a boundary or the span lies past the (truncated) tokens. Specials ([CLS], [SEP])
    have offsets (0, 0); reach[i] = max end offset of wordpieces 0..i (non-decreasing)."""
    first = bisect.bisect_right(reach, start)  # the first wordpiece ending after `start`
    while first < len(offsets) and offsets[first][0] == offsets[first][1]:
        first += 1
    if first >= len(offsets) or offsets[first][0] < start or offsets[first][0] >= end:
        return None
    last = first
    while last + 1 < len(offsets) and offsets[last + 1][0] != offsets[last + 1][1] and offsets[last + 1][0] < end:
        last += 1
    if offsets[last][1] != end:  # the tokens stop short of the end, or straddle it
        return None
    return first, last


class ContextBuilder:
    """Article text + mention spans -> tokenized contexts with wordpiece-aligned mentions.

    `skipped` counts mentions that could not be placed, by reason: `truncated` (past the
    max_length wordpieces), `misaligned` (a wordpiece crosses the span boundary) and
    `no_tokens` (the span tokenizes to nothing, e.g. only control characters).
    """

    def __init__(self, tokenizer: WordPieceTokenizer, chunk_bytes: int = 500, max_length: int = 128,
                 paragraphs: bool = False):
        self.tokenizer = tokenizer
        self.chunk_bytes = chunk_bytes
        self.paragraphs = paragraphs  # chunk_boundaries(paragraphs=...)
        self.max_length = max_length
        self.skipped: Counter[str] = Counter()
        self.truncated_contexts = 0

    def build(self, text: str, spans: list[Span]) -> list[Context]:
        spans = sorted(spans, key=lambda s: s.start)
        for prev, span in zip([None, *spans], spans):
            if not 0 <= span.start < span.end <= len(text) or (prev is not None and span.start < prev.end):
                raise ValueError(f"mention span [{span.start}, {span.end}) is empty, outside the text "
                                 f"of {len(text)} characters, or overlaps the previous one")
        ranges = chunk_boundaries(text, spans, self.chunk_bytes, self.paragraphs)
        chunks = [text[a:b] for a, b in ranges]
        encodings = self.tokenizer.encode_batch(chunks)
        contexts, j = [], 0
        for (a, b), chunk, enc in zip(ranges, chunks, encodings):
            ids, offsets = enc.ids, enc.offsets
            if len(ids) > self.max_length:  # keep [CLS] ... then [SEP] at the limit
                ids = ids[: self.max_length - 1] + [ids[-1]]
                offsets = offsets[: self.max_length - 1] + [(0, 0)]
                self.truncated_contexts += 1
            ctx = Context(char_offset=a, text=chunk, token_ids=ids, token_offsets=[tuple(o) for o in offsets])
            covered = offsets[-2][1] if len(offsets) > 2 else 0
            reach = list(itertools.accumulate((e for _, e in ctx.token_offsets), max))
            while j < len(spans) and spans[j].start < b:
                span = spans[j]
                j += 1
                if span.start < a:  # cannot happen: cuts never fall inside a mention
                    raise AssertionError("mention crosses a chunk boundary")
                s, e = span.start - a, span.end - a
                placed = token_span(ctx.token_offsets, reach, s, e)
                if placed is None:
                    reason = "truncated" if e > covered else "no_tokens" if not chunk[s:e].strip() else "misaligned"
                    self.skipped[reason] += 1
                    continue
                ctx.mention_starts.append(placed[0])
                ctx.mention_ends.append(placed[1])
                ctx.mention_entity_ids.append(span.entity_id)
                ctx.mention_sources.append(span.source)
            contexts.append(ctx)
        return contexts
