"""Wikitext → plain text with entity-link spans (pure Python, no Ray).

`parse_wikitext(text)` returns the article's plain text and, for every `[[link]]` to an
article (namespace 0), the character span of its anchor in that plain text and its target
title, normalised as MediaWiki does (`normalize_title`) but not redirect-resolved.

How it works, and why: every step is one compiled regular expression applied to the whole
page (C speed), never a Python loop over characters. Links are turned into their anchor text
wrapped in two private-use marker characters early on; all later clean-up steps (quotes, HTML
tags, external links, headings, lists, entities, whitespace) are plain substitutions that never
delete a marker, so the spans are read off the markers' positions in the final text. Markup
that is dropped with its content (templates, tables, refs, files, ...) is first replaced by a
third marker, so that a link trail does not glue onto text behind a removed template
(`[[a]]<nowiki/>s`) and a `[[X|{{tmpl}}]]` does not turn into a pipe trick; that marker is
removed right after links are resolved.

Choices:
- Headings are kept, their text on its own line (`== History ==` → `History`).
- Templates `{{...}}` and tables `{|...|}` (both nested), `<ref>`, `<math>`, `<gallery>`, ...
  with their content, comments, `[[File:...]]`/`[[Image:...]]` with captions, category and
  interlanguage links are dropped. Links inside dropped markup are counted (by their `[[`) as
  `inside_dropped_markup`.
- Links to other namespaces (`[[Wikipedia:X|y]]`, `[[wikt:word]]`, `[[:Category:X|y]]`) and
  to an empty title (`[[#Section|text]]`) keep their visible text but are not links.
- `<nowiki>` tags are removed but their content is still parsed as markup (rare in articles).
- Plain text: paragraphs and list items on their own lines, runs of blank lines collapsed to
  one blank line, runs of spaces to one space; `&nbsp;` becomes a plain space.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import unquote

__all__ = ["Link", "ParsedText", "normalize_title", "parse_wikitext"]

# Private-use characters used as in-band markers; any in the input are deleted first.
_LINK_OPEN = "\ue000"
_LINK_CLOSE = "\ue001"
_REMOVED = "\ue002"
_MARKERS_RE = re.compile("[\ue000-\ue002]")


@dataclass(frozen=True, slots=True)
class Link:
    """A link in the plain text: `text[start:end] == anchor` (end exclusive)."""

    start: int
    end: int
    target: str
    anchor: str


@dataclass(slots=True)
class ParsedText:
    text: str
    links: list[Link]
    skipped: Counter = field(default_factory=Counter)  # dropped links by reason


# --------------------------------------------------------------------------- titles

# English Wikipedia's namespaces, their talk namespaces and aliases (lower case).
_NAMESPACES = frozenset(
    "media special talk user wikipedia wp wt project file image mediawiki template help "
    "category portal book draft timedtext module gadget topic".split()
    + [
        "user talk", "wikipedia talk", "project talk", "file talk", "image talk", "mediawiki talk",
        "template talk", "help talk", "category talk", "portal talk", "book talk", "draft talk",
        "timedtext talk", "module talk", "gadget talk", "gadget definition",
        "gadget definition talk", "education program", "education program talk",
    ]
)
# Interwiki prefixes to other Wikimedia projects and a few external wikis enwiki links to.
_INTERWIKI = frozenset(
    """w wikt wiktionary q wikiquote s wikisource oldwikisource b wikibooks n wikinews v
    wikiversity voy wikivoyage c commons m meta metawikimedia mw mediawikiwiki species wikispecies
    d wikidata wmf foundation wikimedia incubator outreach testwiki wikitech phab phabricator
    mediazilla bugzilla gerrit doi arxiv rfc google wikia fandom""".split()
)
# Wikipedia language editions: `[[fr:Paris]]` is an interlanguage link (shown in the sidebar).
_LANGUAGES = frozenset(
    """aa ab ace ady af ak als alt am ami an ang anp ar arc ary arz as ast atj av avk awa ay az azb
    ba ban bar bat-smg bbc bcl bdr be be-tarask be-x-old bew bg bh bi bjn blk bm bn bo bpy br bs
    bug bxr ca cbk-zam cdo ce ceb ch cho chr chy ckb co cr crh cs csb cu cv cy da dag de dga din
    diq dsb dtp dty dv dz ee el eml en eo es et eu ext fa fat ff fi fiu-vro fj fo fon fr frp frr
    fur fy ga gag gan gcr gd gl glk gn gom gor got gpe gsw gu guc gur guw gv ha hak haw he hi hif
    ho hr hsb ht hu hy hyw hz ia iba id ie ig igl ii ik ilo inh io is it iu ja jam jbo jv ka kaa
    kab kbd kbp kcg kg kge ki kj kk kl km kn knc ko koi kr krc ks ksh ku kus kv kw ky la lad lb
    lbe lez lfn lg li lij lld lmo ln lo lrc lt ltg lv lzh mad mai map-bms mdf mg mh mhr mi min mk
    ml mn mni mnw mo mos mr mrj ms mt mus mwl my myv mzn na nah nan nap nds nds-nl ne new ng nia
    nl nn no nov nqo nr nrm nso nup nv ny oc olo om or os pa pag pam pap pcd pcm pdc pfl pi pih
    pl pms pnb pnt ps pt pwn qu rm rmy rn ro roa-rup roa-tara rsk ru rue rup rw sa sah sat sc scn
    sco sd se sg sgs sh shi shn shy si simple sk skr sl sm smn sn so sq sr srn ss st stq su sv sw
    syl szl szy ta tay tcy tdd te tet tg th ti tig tk tl tly tn to tpi tr trv ts tt tum tw ty tyv
    udm ug uk ur uz ve vec vep vi vls vo vro wa war wo wuu xal xh xmf yi yo yue za zea zgh zh
    zh-classical zh-min-nan zh-yue zu""".split()
)
# Links in these namespaces render nothing inline unless written with a leading colon.
_INVISIBLE_NAMESPACES = frozenset({"category", "file", "image"})

_SPACES_RE = re.compile(r"[\s_]+")
# Characters MediaWiki forbids in titles (plus our markers).
_INVALID_TITLE_RE = re.compile("[<>\\[\\]{}|\x00-\x1f\x7f\ufffd\ue000-\ue002]")


def _classify(raw: str) -> tuple[str | None, str]:
    """(normalised title, "") for an article link, else (None, reason) with reason one of
    `empty_target`, `non_article_namespace`, `interlanguage`, `invalid_target`."""
    title = raw
    if "&" in title:
        title = html.unescape(title)
    if "%" in title:
        title = unquote(title)
    title = title.split("#", 1)[0]
    title = _SPACES_RE.sub(" ", title).strip()
    if title.startswith(":"):
        title = title[1:].lstrip()
    if ":" in title:
        prefix = title.split(":", 1)[0].rstrip().lower()
        if prefix in _LANGUAGES:
            return None, "interlanguage" if not raw.lstrip().startswith(":") else "non_article_namespace"
        if prefix in _NAMESPACES or prefix in _INTERWIKI:
            return None, "non_article_namespace"
    if not title:
        return None, "empty_target"
    if _INVALID_TITLE_RE.search(title):
        return None, "invalid_target"
    first = title[0].upper()
    if len(first) == 1:  # 'ß'.upper() == 'SS': MediaWiki keeps such a letter as it is
        title = first + title[1:]
    return title, ""


def normalize_title(title: str) -> str | None:
    """MediaWiki's normalisation of a namespace-0 link target, or None if it is no article.

    Entities and %-escapes decoded, `#fragment` dropped, underscores and whitespace runs → one
    space, stripped, a leading colon removed, first letter upper-cased. None for an empty title
    (`[[#Section]]`), a title with characters MediaWiki forbids, and any namespace, interwiki
    or language prefix (`File:`, `Category:`, `Wikipedia:`, `wikt:`, `fr:`, ...).
    """
    return _classify(title)[0]


# --------------------------------------------------------------------------- dropped markup

_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.S)  # an unclosed comment runs to the end
# Tags whose content is not running text. Self-closing form first: `<ref name="a"/>` must not
# open a pair that ends at the next `</ref>`.
_DROPPED_TAGS = (
    "ref|references|math|chem|ce|gallery|timeline|imagemap|score|hiero|graph|mapframe|maplink|"
    "templatedata|syntaxhighlight|source|pre|includeonly|inputbox|categorytree|templatestyles|"
    "indicator|charinsert|section"
)
_DROPPED_TAG_RE = re.compile(
    rf"<(?:{_DROPPED_TAGS})\b[^<>]*/>|<({_DROPPED_TAGS})\b[^<>]*>.*?</\1\s*>", re.S | re.I
)
_NOWIKI_RE = re.compile(r"</?nowiki\s*/?>", re.I)
# Braces: templates `{{`/`}}`; tables open `{|` and close `|}` at the start of a line.
# (a table token counts only at the start of a line; checked in _brace_spans).
_BRACE_RE = re.compile(r"\{[{|]|\}\}|\|\}")
_TABLE_OPEN_INDENT = " \t:"
_TABLE_CLOSE_INDENT = " \t"
_FILE_START_RE = re.compile(r"\[\[[ \t]*(?:file|image)[ \t]*:", re.I)
_LINK_BRACKET_RE = re.compile(r"\[\[|\]\]")


def _drop_spans(
    text: str, spans: list[tuple[int, int]], skipped: Counter, own_links: int = 0
) -> str:
    """Replace each (start, end) of sorted, disjoint spans by the removed-marker, counting the
    links (`[[`) they contained besides the `own_links` each span is itself."""
    if not spans:
        return text
    parts = []
    pos = 0
    inner_links = 0
    for start, end in spans:
        parts.append(text[pos:start])
        inner_links += text.count("[[", start, end) - own_links
        pos = end
    parts.append(text[pos:])
    if inner_links:
        skipped["inside_dropped_markup"] += inner_links
    return _REMOVED.join(parts)


def _brace_spans(text: str) -> list[tuple[int, int]]:
    """Outermost spans of balanced templates and tables. An unmatched opener or closer drops
    just itself (MediaWiki shows it as text; here it would only be noise)."""
    stack: list[tuple[str, int]] = []  # (kind "t" template | "b" table, start)
    closed: list[tuple[int, int]] = []
    pos = 0
    while m := _BRACE_RE.search(text, pos):
        tok = m.group()
        pos = m.end()
        if tok != "{{" and tok != "}}" and not _at_line_start(text, m.start(), tok):
            pos = m.start() + 1  # not a table token; `|}}` may still hold a `}}`
            continue
        if tok == "{{":
            stack.append(("t", m.start()))
            continue
        if tok == "{|":
            stack.append(("b", m.start()))
            continue
        kind = "t" if tok == "}}" else "b"
        if kind == "b" and stack and stack[-1][0] == "t" and text.startswith("}", pos):
            # `|}}` at a line start inside a template is the template's `}}`, not a table's end
            pos = m.start() + 1
            continue
        # close the nearest opener of this kind; openers above it are inside, dropped with it
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == kind:
                closed.append((stack[i][1], m.end()))
                del stack[i:]
                break
        else:
            closed.append((m.start(), m.end()))  # stray closer
    closed.extend((start, start + 2) for _, start in stack)  # unclosed openers: drop the token
    return _outermost(closed)


def _at_line_start(text: str, i: int, tok: str) -> bool:
    """Whether only indentation precedes text[i] on its line (tables need it). Walks back
    over the indentation only, so a long line costs nothing."""
    indent = _TABLE_OPEN_INDENT if tok == "{|" else _TABLE_CLOSE_INDENT
    while i > 0 and text[i - 1] in indent:
        i -= 1
    return i == 0 or text[i - 1] == "\n"


def _file_spans(text: str, skipped: Counter) -> list[tuple[int, int]]:
    """Spans of `[[File:...]]`/`[[Image:...]]`, captions with nested links included."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while m := _FILE_START_RE.search(text, pos):
        depth = 0
        end = None
        for b in _LINK_BRACKET_RE.finditer(text, m.start()):
            depth += 1 if b.group() == "[[" else -1
            if depth == 0:
                end = b.end()
                break
        if end is None:  # unclosed: not a link in MediaWiki either; leave the text
            pos = m.end()
            continue
        skipped["non_article_namespace"] += 1
        spans.append((m.start(), end))
        pos = end
    return spans


def _outermost(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with those inside another removed (spans are nested or disjoint)."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if out and start < out[-1][1]:
            continue
        out.append((start, end))
    return out


# --------------------------------------------------------------------------- links

# [[target]] / [[target|anchor]] + trail. The anchor may hold single brackets, never `[[`/`]]`.
_LINK_RE = re.compile(
    r"\[\[([^\[\]|\n]*)(?:\|((?:[^\[\]]|\[(?!\[)|\](?!\]))*))?\]\]([a-z]*)"
)
_PIPE_TRICK_PAREN_RE = re.compile(r"\s*\([^()]*\)\s*$")


def _pipe_trick(target: str) -> str:
    """`[[Target (film)|]]` → "Target", `[[Paris, Texas|]]` → "Paris", `[[w:Foo|]]` → "Foo"."""
    shown = target.lstrip(":").split(":", 1)[-1].strip()
    trimmed = _PIPE_TRICK_PAREN_RE.sub("", shown)
    if trimmed == shown:
        trimmed = shown.split(",", 1)[0]
    return trimmed.strip()


def _link_replacer(targets: list[str], skipped: Counter):
    def replace(m: re.Match) -> str:
        raw, anchor, trail = m.group(1), m.group(2), m.group(3)
        title, reason = _classify(raw)
        if anchor is None:
            shown = raw.lstrip().removeprefix(":")
        elif anchor == "":
            shown = _pipe_trick(raw)
        else:
            shown = anchor
        shown += trail
        if title is None:
            skipped[reason] += 1
            if reason == "interlanguage":
                return _REMOVED
            if reason == "non_article_namespace" and not raw.lstrip().startswith(":"):
                prefix = raw.split(":", 1)[0].strip().lower()
                if prefix in _INVISIBLE_NAMESPACES:
                    return _REMOVED
            return shown
        shown = shown.replace(_REMOVED, "").strip()
        if not shown:
            skipped["empty_anchor"] += 1
            return _REMOVED
        targets.append(title)
        return _LINK_OPEN + shown + _LINK_CLOSE

    return replace


# --------------------------------------------------------------------------- formatting

_EXTERNAL_LINK_RE = re.compile(
    r"\[(?:https?:|ftp:|mailto:|news:|irc:|//)[^\s\[\]\ue000-\ue002]*(?:[ \t]+([^\]\n]*))?\]", re.I
)
_HTML_TAGS = (
    "b|i|u|s|strike|del|ins|big|small|sup|sub|tt|code|kbd|var|samp|span|font|center|cite|abbr|"
    "dfn|q|em|strong|mark|ruby|rb|rt|rp|bdi|bdo|wbr|time|data|noinclude|onlyinclude|poem|"
    "references|ref|nowiki"
)
_BLOCK_TAGS = "br|p|div|blockquote|hr|li|ul|ol|dl|dt|dd|h[1-6]|table|tr|td|th|caption"
_MARK = "\ue000-\ue002"
_INLINE_TAG_RE = re.compile(rf"</?(?:{_HTML_TAGS})\b[^<>{_MARK}]*>", re.I)
_BLOCK_TAG_RE = re.compile(rf"</?(?:{_BLOCK_TAGS})\b[^<>{_MARK}]*>", re.I)
_QUOTES_RE = re.compile(r"'''''|'''|''")
# Line-start patterns begin with a literal "\n" (the text is framed by newlines): a literal
# prefix lets the regex engine skip ahead, several times faster than `^` with re.M.
_HEADING_RE = re.compile(r"\n[ \t]*(={1,6})[ \t]*([^\n]*?)[ \t]*\1[ \t]*(?=\n)")
_LINE_MARKER_RE = re.compile(r"\n[ \t]*(?:[*#:;]+|-{4,})")  # list items, horizontal rules
_MAGIC_WORD_RE = re.compile(r"__[A-Z]+__")
# Whitespace to normalise: runs, and any single whitespace character other than a space.
_WHITESPACE_RE = re.compile(r"\s{2,}|[^\S ]")


def _whitespace(m: re.Match) -> str:
    """A run without newline → one space; with one → a line break; with more → a blank line."""
    newlines = m.group().count("\n")
    return " " if newlines == 0 else "\n" if newlines == 1 else "\n\n"


def parse_wikitext(text: str) -> ParsedText:
    """Plain text of a wikitext page and its links to articles (see the module docstring)."""
    skipped: Counter = Counter()
    if _LINK_OPEN in text or _LINK_CLOSE in text or _REMOVED in text:
        text = _MARKERS_RE.sub("", text)
    text = _COMMENT_RE.sub("", text)

    def drop_tag(m: re.Match) -> str:
        if "[[" in m.group():
            skipped["inside_dropped_markup"] += m.group().count("[[")
        return _REMOVED

    text = _DROPPED_TAG_RE.sub(drop_tag, text)
    text = _NOWIKI_RE.sub(_REMOVED, text)
    text = _drop_spans(text, _brace_spans(text), skipped)
    text = _drop_spans(text, _file_spans(text, skipped), skipped, own_links=1)

    targets: list[str] = []
    text = _LINK_RE.sub(_link_replacer(targets, skipped), text)
    text = text.replace(_REMOVED, "")

    text = _EXTERNAL_LINK_RE.sub(lambda m: m.group(1) or "", text)
    text = _BLOCK_TAG_RE.sub("\n", text)
    text = _INLINE_TAG_RE.sub("", text)
    text = _QUOTES_RE.sub("", text)
    text = "\n" + text + "\n"
    text = _HEADING_RE.sub(r"\n\2", text)
    text = _LINE_MARKER_RE.sub("\n", text)
    text = _MAGIC_WORD_RE.sub("", text)
    if "&" in text:
        text = html.unescape(text)
    text = _WHITESPACE_RE.sub(_whitespace, text).strip()
    return _read_markers(text, targets, skipped)


def _read_markers(text: str, targets: list[str], skipped: Counter) -> ParsedText:
    """Strip the link markers, turning each pair into a span (trimmed of whitespace)."""
    parts = text.split(_LINK_OPEN)
    # No step deletes or reorders a marker; checked anyway, as a wrong span is worse than none.
    if len(parts) - 1 != len(targets) or _LINK_CLOSE in parts[0] or any(
        part.count(_LINK_CLOSE) != 1 for part in parts[1:]
    ):
        skipped["marker_mismatch"] += len(targets)
        return ParsedText(_MARKERS_RE.sub("", text), [], skipped)
    plain = [parts[0]]
    pos = len(parts[0])
    links: list[Link] = []
    for target, part in zip(targets, parts[1:]):
        anchor, _, rest = part.partition(_LINK_CLOSE)
        stripped = anchor.strip()
        if stripped:
            start = pos + len(anchor) - len(anchor.lstrip())
            links.append(Link(start, start + len(stripped), target, stripped))
        else:  # the anchor was only markup, e.g. [[X|'']]
            skipped["empty_anchor"] += 1
        plain += (anchor, rest)
        pos += len(anchor) + len(rest)
    return ParsedText("".join(plain), links, skipped)
