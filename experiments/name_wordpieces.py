"""How much of a synthetic entity's name is its own: the WordPiece pieces of every name, and for
each entity type how many entities share the rarest piece of a name (docs/results.md, "Why").
If names were made of pieces of their own, those pieces' embeddings could hold an entity's
facts the way an entity-table row does; shared pieces mean the transformer must compose them.

    .venv/bin/python experiments/name_wordpieces.py 5000 [SEED]
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter, defaultdict

from eae_data.synth import build_world
from eae_data.tokenizer import WordPieceTokenizer


def main(num_entities: int, seed: int = 0) -> None:
    world, tokenizer = build_world(num_entities, seed), WordPieceTokenizer()
    pieces = {e.id: tokenizer.encode(e.name, add_special_tokens=False).ids for e in world.entities}
    sharing = Counter(p for ids in pieces.values() for p in set(ids))  # piece -> entities whose name has it
    by_type = defaultdict(list)
    for e in world.entities:
        by_type[e.type].append((len(pieces[e.id]), min(sharing[p] for p in pieces[e.id])))
    print(f"{num_entities:,} entities (world seed {seed}): {len(sharing):,} distinct WordPiece pieces in their names")
    print("| type | entities | pieces per name | entities sharing the name's rarest piece (median) | names with a piece of their own |")
    print("|---|---|---|---|---|")
    for kind, rows in by_type.items():
        own = sum(rarest == 1 for _, rarest in rows) / len(rows)
        print(f"| {kind} | {len(rows):,} | {statistics.mean(n for n, _ in rows):.1f} | "
              f"{statistics.median(r for _, r in rows):g} | {100 * own:.1f}% |")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
