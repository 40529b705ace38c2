"""Files of a synthetic world: the MediaWiki dump, entities, facts, questions and a summary.

Files are streamed (one page or record at a time), so a 100k-entity world never holds its
text in memory. Bytes depend only on (num_entities, seed): no clock, no set order, a fixed
revision timestamp, '\\n' line ends.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO
from xml.sax.saxutils import escape, quoteattr

from eae_data.synth.articles import fact_sentence, render_article, render_redirect
from eae_data.synth.questions import make_question
from eae_data.synth.world import RELATIONS, SPLITS, TYPE_SHARES, World, build_world

FORMAT_VERSION = 1  # bump whenever the same (num_entities, seed) would give other bytes
TIMESTAMP = "2020-01-01T00:00:00Z"  # every revision's: fixed, for reproducible bytes

_NAMESPACES = ((-2, "Media"), (-1, "Special"), (0, ""), (1, "Talk"), (2, "User"), (3, "User talk"),
               (4, "Wikipedia"), (5, "Wikipedia talk"), (6, "File"), (7, "File talk"),
               (8, "MediaWiki"), (9, "MediaWiki talk"), (10, "Template"), (11, "Template talk"),
               (12, "Help"), (13, "Help talk"), (14, "Category"), (15, "Category talk"))
# The siteinfo's generator: the mark by which `eae data build` knows a synthetic world
# (eae_platform.preprocess.build.is_synthetic_dump). A format mark, not a module path: it keeps
# the package name the format was made under, so that worlds written before the data code moved
# to eae_data still read as synthetic, and a world's dump is byte-identical to theirs.
GENERATOR = "eae_model.synth"
_HEADER = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="http://www.mediawiki.org/xml/export-0.10/ '
    'http://www.mediawiki.org/xml/export-0.10.xsd" version="0.10" xml:lang="en">\n'
    "  <siteinfo>\n"
    "    <sitename>Synthetic Wikipedia</sitename>\n"
    "    <dbname>synthwiki</dbname>\n"
    "    <base>https://synth.invalid/wiki/Main_Page</base>\n"
    f"    <generator>{GENERATOR} {{version}}</generator>\n"
    "    <case>first-letter</case>\n"
    "    <namespaces>\n"
    + "".join(f'      <namespace key="{k}" case="first-letter">{n}</namespace>\n' if n
              else f'      <namespace key="{k}" case="first-letter" />\n' for k, n in _NAMESPACES)
    + "    </namespaces>\n"
    "  </siteinfo>\n"
)


@dataclass(frozen=True)
class WorldSummary:
    seed: int
    num_entities: int
    format_version: int
    entities_per_type: dict[str, int]
    entities_per_kind: dict[str, int]
    facts_per_relation: dict[str, int]
    questions_per_split: dict[str, int]
    num_pages: int  # articles + redirects
    num_redirects: int
    renderings: int = 1  # times each article states its facts (articles.restatement)


def summarize(world: World, renderings: int = 1) -> WorldSummary:
    types = Counter(e.type for e in world.entities)
    kinds = Counter(e.kind for e in world.entities)
    relations = Counter(f.relation for f in world.facts)
    splits = Counter(f.split for f in world.facts)
    redirects = len(world.redirects())
    return WorldSummary(
        seed=world.seed,
        num_entities=len(world.entities),
        format_version=FORMAT_VERSION,
        entities_per_type={t: types[t] for t, _ in TYPE_SHARES},
        entities_per_kind=dict(sorted(kinds.items())),
        facts_per_relation={r: relations[r] for r in RELATIONS},
        questions_per_split={s: splits[s] for s, _ in SPLITS},
        num_pages=len(world.entities) + redirects,
        num_redirects=redirects,
        renderings=renderings,
    )


def write_world(out_dir: Path, num_entities: int, seed: int, renderings: int = 1) -> WorldSummary:
    """Build the world for (num_entities, seed) and write into `out_dir` (created if needed),
    each article stating its facts `renderings` times (1: once, in the article's own layout):

    world.xml         MediaWiki export-0.10 dump: one article per entity (page id = entity
                      id + 1), then one redirect page per alias
    entities.jsonl    id, title, type, kind, name, aliases
    facts.jsonl       id, subject(_id), relation, object(_id), split, evidence (the wikitext
                      sentence of the subject's article that states it)
    questions.jsonl   one closed-book question per fact (see questions.make_question)
    summary.json      the returned WorldSummary

    Prints nothing. Raises ValueError for bad arguments before touching `out_dir`.
    """
    if isinstance(renderings, bool) or not isinstance(renderings, int) or renderings < 1:
        raise ValueError(f"renderings must be an int >= 1, got {renderings!r}")
    world = build_world(num_entities, seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _open(out_dir / "world.xml") as fh:
        write_dump(world, fh, renderings)
    with _open(out_dir / "entities.jsonl") as fh:
        for e in world.entities:
            _line(fh, {"id": e.id, "title": e.title, "type": e.type, "kind": e.kind, "name": e.name,
                       "aliases": e.aliases})
    with _open(out_dir / "facts.jsonl") as fh:
        for f in world.facts:
            s, o = world.entities[f.subject], world.entities[f.object]
            _line(fh, {"id": f.id, "subject": s.title, "subject_id": s.id, "relation": f.relation,
                       "object": o.title, "object_id": o.id, "split": f.split,
                       "evidence": fact_sentence(world, f)})
    with _open(out_dir / "questions.jsonl") as fh:
        for f in world.facts:
            _line(fh, make_question(world, f))
    summary = summarize(world, renderings)
    with _open(out_dir / "summary.json") as fh:
        fh.write(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def write_dump(world: World, fh: TextIO, renderings: int = 1) -> None:
    """The world as a MediaWiki XML dump: articles in entity order, then redirects."""
    fh.write(_HEADER.format(version=FORMAT_VERSION))
    for e in world.entities:
        _page(fh, e.id + 1, e.title, render_article(world, e, renderings))
    for i, (alias, target) in enumerate(world.redirects()):
        _page(fh, len(world.entities) + 1 + i, alias, render_redirect(target), redirect=target.title)
    fh.write("</mediawiki>\n")


def _page(fh: TextIO, page_id: int, title: str, text: str, redirect: str | None = None) -> None:
    data = text.encode()
    fh.write(
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n"
        + (f"    <redirect title={quoteattr(redirect)} />\n" if redirect is not None else "")
        + f"    <revision>\n      <id>{page_id}</id>\n      <timestamp>{TIMESTAMP}</timestamp>\n"
        "      <contributor>\n        <username>SynthBot</username>\n        <id>1</id>\n"
        "      </contributor>\n      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(data)}" xml:space="preserve">{escape(text)}</text>\n'
        f"      <sha1>{_sha1_base36(data)}</sha1>\n    </revision>\n  </page>\n"
    )


def _sha1_base36(data: bytes) -> str:
    """SHA-1 in base 36, 31 digits, as MediaWiki dumps write it."""
    n, digits = int.from_bytes(hashlib.sha1(data).digest(), "big"), []
    while n:
        n, r = divmod(n, 36)
        digits.append("0123456789abcdefghijklmnopqrstuvwxyz"[r])
    return "".join(reversed(digits)).rjust(31, "0")


def _open(path: Path) -> TextIO:
    return open(path, "w", encoding="utf-8", newline="\n")


def _line(fh: TextIO, record: dict) -> None:
    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
