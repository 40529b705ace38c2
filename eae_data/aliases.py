"""Unlinked mentions by alias-table matching.

The paper adds unlinked mention spans from a commercial NER service. Offline, we mark the
later occurrences of names that are linked elsewhere: an anchor text seen as a link (in any
article) is an alias, and every other occurrence of it in the text becomes an unlinked mention
(entity e_0), which trains mention detection and gives the memory more (unsupervised) reads.

Matching is on whole words, case-sensitive, greedy longest-first, and never overlaps an
existing mention. Only proper-name-looking aliases are used: they start with an uppercase
letter or digit and are not a lone capitalised function word ("The", "In", ...).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from eae_data.contexts import SOURCE_ALIAS, Span
from eae_data.constants import NULL_ENTITY

_WORD = re.compile(r"(\w+(?:['’.-]\w+)*)")  # a capture group: re.split keeps the words
_FUNCTION_WORDS = frozenset(
    "A An And As At But By For From He Her His However I If In It Its Of On Or She So That The Their "
    "There These They This Those To We What When Where Which While Who With You".split()
)


def alias_words(text: str) -> tuple[str, ...]:
    """The words an alias or a matched span is compared by (separators ignored):
    `alias_words(text[s.start:s.end])` names the alias a span of `AliasMatcher.find` matched."""
    return tuple(_WORD.findall(text))


class AliasMatcher:
    """Find occurrences of known aliases in plain text."""

    def __init__(self, aliases: Iterable[str], max_words: int = 6):
        self.max_words = max_words
        self._aliases: set[tuple[str, ...]] = set()
        for alias in aliases:
            words = alias_words(alias)
            if self.usable(words):
                self._aliases.add(words)
        # first word -> the word counts of the aliases it starts, longest first: most words
        # start no alias, and are skipped with one dict lookup.
        starts: dict[str, set[int]] = {}
        for words in self._aliases:
            starts.setdefault(words[0], set()).add(len(words))
        self._lengths = {w: sorted(n, reverse=True) for w, n in starts.items()}

    def usable(self, words: tuple[str, ...]) -> bool:
        """Whether an alias of these words (`alias_words`) is matched at all: 1 to max_words
        words, the first starting with an uppercase letter or digit, and not a lone function
        word or single character."""
        if not words or len(words) > self.max_words:
            return False
        if not (words[0][0].isupper() or words[0][0].isdigit()):
            return False
        return not (len(words) == 1 and (words[0] in _FUNCTION_WORDS or len(words[0]) < 2))

    def __len__(self) -> int:
        return len(self._aliases)

    def find(self, text: str, taken: list[Span]) -> list[Span]:
        """Unlinked mention spans for alias occurrences in `text` that overlap none of `taken`."""
        if not self._aliases:
            return []
        # [separator, word, separator, word, ..., separator]: words and their offsets
        # without a match object per word.
        parts = _WORD.split(text)
        words = parts[1::2]
        edges = list(itertools.accumulate(map(len, parts)))  # word i spans edges[2i]..edges[2i+1]
        blocked = sorted((s.start, s.end) for s in taken)
        found: list[Span] = []
        b, next_free = 0, 0
        # Only words that start some alias can start a match: find them in one pass.
        for i in [i for i, w in enumerate(words) if w in self._lengths]:
            if i < next_free:  # inside the previous match
                continue
            start = edges[2 * i]
            while b < len(blocked) and blocked[b][1] <= start:
                b += 1
            for n in self._lengths[words[i]]:
                if i + n > len(words):
                    continue
                end = edges[2 * (i + n - 1) + 1]
                free = b >= len(blocked) or blocked[b][0] >= end
                if free and tuple(words[i : i + n]) in self._aliases:
                    found.append(Span(start, end, NULL_ENTITY, SOURCE_ALIAS))
                    next_free = i + n
                    break
        return found
