"""Redirect resolution, the entity vocabulary and the alias table.

The paper restricts entities to the one million most frequent link targets. Targets are
counted after resolving redirects (an alias page such as "AccessibleComputing" points to
"Computer accessibility"), so that every link to an entity counts towards it once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa


def resolve_redirects(redirects: dict[str, str], max_hops: int = 10) -> tuple[dict[str, str], list[str]]:
    """Follow redirect chains to their final title. Returns (title -> final title, the titles
    dropped because their chain loops or exceeds max_hops)."""
    resolved: dict[str, str] = {}
    broken: list[str] = []
    for source in redirects:
        seen, title = {source}, redirects[source]
        for _ in range(max_hops):
            if title not in redirects:
                break
            title = redirects[title]
            if title in seen:
                break
            seen.add(title)
        if title in redirects:  # still a redirect: a loop or too long a chain
            broken.append(source)
        else:
            resolved[source] = title
    return resolved, sorted(broken)


@dataclass
class EntityVocab:
    """Entity ids 0..N-1 in order of decreasing link count (ties by title)."""

    titles: list[str]
    counts: list[int]

    def __post_init__(self) -> None:
        self.ids = {t: i for i, t in enumerate(self.titles)}

    def __len__(self) -> int:
        return len(self.titles)

    @classmethod
    def most_frequent(cls, target_counts: Counter, size: int) -> "EntityVocab":
        ranked = sorted(target_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
        return cls([t for t, _ in ranked], [c for _, c in ranked])

    def to_table(self) -> pa.Table:
        return pa.table(
            {
                "entity_id": pa.array(range(len(self.titles)), pa.int32()),
                "title": pa.array(self.titles, pa.string()),
                "count": pa.array(self.counts, pa.int64()),
            }
        )

    @classmethod
    def from_table(cls, table: pa.Table) -> "EntityVocab":
        table = table.sort_by("entity_id")
        return cls(table.column("title").to_pylist(), table.column("count").to_pylist())


def alias_table(anchor_counts: Counter, redirects: dict[str, str], vocab: EntityVocab) -> pa.Table:
    """(alias, entity_id, count) for every anchor text linked to a vocabulary entity, most
    frequent pairing first. anchor_counts is keyed by (anchor text, raw link target)."""
    merged: Counter = Counter()
    for (anchor, target), n in anchor_counts.items():
        entity = vocab.ids.get(redirects.get(target, target))
        if entity is not None:
            merged[anchor, entity] += n
    rows = sorted(merged.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1]))
    return pa.table(
        {
            "alias": pa.array([a for (a, _), _ in rows], pa.string()),
            "entity_id": pa.array([e for (_, e), _ in rows], pa.int32()),
            "count": pa.array([n for _, n in rows], pa.int64()),
        }
    )
