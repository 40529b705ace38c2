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

import re
from collections.abc import Iterable

from eae_model.contexts import SOURCE_ALIAS, Span
from eae_model.mentions import NULL_ENTITY

_WORD = re.compile(r"\w+(?:['’.-]\w+)*", re.UNICODE)
_FUNCTION_WORDS = frozenset(
    "A An And As At But By For From He Her His However I If In It Its Of On Or She So That The Their "
    "There These They This Those To We What When Where Which While Who With You".split()
)


class AliasMatcher:
    """Find occurrences of known aliases in plain text."""

    def __init__(self, aliases: Iterable[str], max_words: int = 6):
        self.max_words = max_words
        self._aliases: set[tuple[str, ...]] = set()
        for alias in aliases:
            words = tuple(m.group() for m in _WORD.finditer(alias))
            if not words or len(words) > max_words:
                continue
            if not (words[0][0].isupper() or words[0][0].isdigit()):
                continue
            if len(words) == 1 and (words[0] in _FUNCTION_WORDS or len(words[0]) < 2):
                continue
            self._aliases.add(words)
        self._longest = max((len(a) for a in self._aliases), default=0)

    def __len__(self) -> int:
        return len(self._aliases)

    def find(self, text: str, taken: list[Span]) -> list[Span]:
        """Unlinked mention spans for alias occurrences in `text` that overlap none of `taken`."""
        if not self._aliases:
            return []
        words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
        blocked = sorted((s.start, s.end) for s in taken)
        found: list[Span] = []
        i, b = 0, 0
        while i < len(words):
            start = words[i][0]
            while b < len(blocked) and blocked[b][1] <= start:
                b += 1
            hit = 0
            if words[i][2][0].isupper() or words[i][2][0].isdigit():
                for n in range(min(self._longest, len(words) - i), 0, -1):
                    end = words[i + n - 1][1]
                    free = b >= len(blocked) or blocked[b][0] >= end
                    if free and tuple(w for _, _, w in words[i : i + n]) in self._aliases:
                        hit = n
                        break
            if hit:
                found.append(Span(start, words[i + hit - 1][1], NULL_ENTITY, SOURCE_ALIAS))
                i += hit
            else:
                i += 1
        return found
