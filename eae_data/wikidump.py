"""Streaming reader for MediaWiki XML dumps (plain or bz2, single- or multistream); no Ray.

A full `enwiki-YYYYMMDD-pages-articles(-multistream).xml.bz2` is ~20 GB compressed, so nothing
here holds a dump in memory: bytes are read in 1 MiB chunks, decompressed incrementally, and cut
into `<page>...</page>` chunks that are parsed one at a time with ElementTree.

Cutting pages out of the byte stream (rather than one `iterparse` over the document) is what
makes the reader both parallel and robust:
- a page chunk is well formed on its own, so a reader can start anywhere: `plan_partitions`
  splits plain XML into byte ranges and multistream bz2 into groups of streams, and a range's
  reader starts at its first `<page>`. A page belongs to the range in which its `<page>` tag
  starts, so every page is read exactly once across a file's partitions;
- a damaged page costs only itself: the reader resyncs at the next `<page>`;
- tags inside a chunk carry no namespace (the `xmlns` sits on the `<mediawiki>` root), so any
  export schema version (0.10, 0.11, ...) reads the same.
`<page>` and `</page>` cannot occur inside a page's text: XML escapes `<` there. (MediaWiki
writes `<page>` without attributes, so the literal tag is what is searched for.)

Failures never raise; `iter_pages` counts them in `stats` and names the lost pages in
`skipped` (see `ReadStats` for the reasons).
"""

from __future__ import annotations

import bz2
import html
import os
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eae_data.packaged import package_file

__all__ = [
    "DEFAULT_MAX_PAGE_BYTES",
    "EMBEDDED_DUMP",
    "Page",
    "Partition",
    "ReadStats",
    "embedded_dump_path",
    "iter_pages",
    "plan_partitions",
]

EMBEDDED_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# Wikipedia caps page text at 2 MiB; XML escaping can inflate that a few times.
DEFAULT_MAX_PAGE_BYTES = 64 << 20
_READ_SIZE = 1 << 20
_PAGE_OPEN = b"<page>"
_PAGE_CLOSE = b"</page>"
# A bz2 stream header (`BZh` + block size) followed by the first block's magic 0x314159265359.
_BZ2_STREAM_RE = re.compile(rb"BZh[1-9]\x31\x41\x59\x26\x53\x59")
_BZ2_STREAM_LEN = 10
# A multistream file's first stream (Wikipedia: the siteinfo header; pbzip2: one block) ends
# well within this; no second stream header in it → treated as single-stream (one partition,
# still read correctly in full).
_MULTISTREAM_PROBE = 16 << 20
# How far past a planned cut to look for the next stream start before giving up that cut.
_STREAM_SEARCH_LIMIT = 64 << 20


def embedded_dump_path(name: str = EMBEDDED_DUMP) -> Path:
    """Path of a dump shipped in gensim's test data (located without importing gensim, which
    pulls scipy). `name` may also be "enwiki-table-markup.xml.bz2"."""
    return package_file("gensim", "gensim==4.4.0", "test", "test_data", name, what="the sample Wikipedia dump ships")


@dataclass(slots=True)
class Page:
    title: str
    ns: int
    page_id: int
    redirect: str | None  # target title of a redirect page, as written in the dump
    text: str  # wikitext of the (last) revision; "" when empty


@dataclass(frozen=True, slots=True)
class Partition:
    """A piece of one dump file that one worker reads: pages whose `<page>` starts in
    [start, end) of the file (plain XML), or in the bz2 streams that start in [start, end)."""

    path: str
    start: int
    end: int
    kind: str  # "xml" or "bz2"


@dataclass
class ReadStats:
    """What reading saw, mergeable across partitions for a manifest:
    `iter_pages(part, rs.counts, rs.skipped)` fills one, `merge` adds another.

    `counts`: `pages` (yielded), `xml_bytes` (decompressed bytes read; a partition reads on
    past its end to finish its last page, so the sum can exceed a file's), `empty_text` (pages
    yielded with empty text) and one key per failure. Page failures count lost pages:
    `malformed_xml` (not well formed, or no `</page>` before the next `<page>`), `invalid_utf8`
    (the page is skipped, not repaired: a dump is valid UTF-8, so a bad byte means damage),
    `missing_title`, `missing_id`, `missing_ns`, `missing_text` (no `<text>` element),
    `oversized_page` (over `max_page_bytes` without `</page>`), `truncated_xml` (the file ends
    inside a page). Stream failures count events, and the page they cut off (if any) is listed
    under the same reason: `truncated_bz2` (the file ends inside a bz2 stream), `corrupt_bz2`
    (undecodable bz2 data: the rest of the partition is lost), `read_error` (OSError reading).
    `trailing_data` counts non-bz2 bytes after a bz2 stream (ignored, as bzip2 does).

    `skipped`: reason → lost pages, each named by its title, else `id N`, else
    `<path>@<offset>` (decompressed byte offset within the partition).
    """

    counts: Counter = field(default_factory=Counter)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def merge(self, other: ReadStats) -> None:
        self.counts.update(other.counts)
        for reason, pages in other.skipped.items():
            self.skipped.setdefault(reason, []).extend(pages)


# --------------------------------------------------------------------------- partitions


# Compressions users may have but that are not supported: refuse them at planning time rather
# than read them as XML that has no pages.
_UNSUPPORTED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"7z\xbc\xaf\x27\x1c": "7z",
}


def _sniff_kind(path: str) -> str:
    """"bz2" or "xml", by the file's first bytes (not its name)."""
    with open(path, "rb") as f:
        head = f.read(6)
    if re.match(rb"BZh[1-9]", head):
        return "bz2"
    for magic, name in _UNSUPPORTED_MAGIC.items():
        if head.startswith(magic):
            raise ValueError(f"{path} is {name}-compressed; dumps must be plain XML or bz2")
    return "xml"


def _next_stream_start(f, pos: int, limit: int) -> int | None:
    """Offset of the first bz2 stream header at or after `pos`, searching `limit` bytes."""
    f.seek(pos)
    tail = b""
    base = pos
    while base - pos < limit:
        chunk = f.read(_READ_SIZE)
        if not chunk:
            return None
        data = tail + chunk
        m = _BZ2_STREAM_RE.search(data)
        if m:
            return base - len(tail) + m.start()
        tail = data[-(_BZ2_STREAM_LEN - 1) :]
        base += len(chunk)
    return None


def _bz2_cuts(path: str, size: int, target_bytes: int) -> list[int]:
    """The first stream start at or after every multiple of target_bytes; [0] for a
    single-stream file."""
    cuts = [0]
    with open(path, "rb") as f:
        if size <= target_bytes or _next_stream_start(f, 1, _MULTISTREAM_PROBE) is None:
            return cuts
        goal = target_bytes
        while goal < size:
            found = _next_stream_start(f, goal, _STREAM_SEARCH_LIMIT)
            if found is None:
                searched = goal + _STREAM_SEARCH_LIMIT
            else:
                cuts.append(found)
                searched = found + 1
            # next multiple of target_bytes not yet searched
            goal = max(goal + target_bytes, -(-searched // target_bytes) * target_bytes)
    return cuts


def plan_partitions(paths: list[str], target_bytes: int) -> list[Partition]:
    """Split each file into partitions of about `target_bytes` file (compressed) bytes.

    Plain XML splits at any byte; multistream bz2 at stream starts (found by scanning for the
    stream header near each cut); a single-stream bz2 is one partition. The kind is told by
    the first bytes; other compressions (gzip, xz, zstd, 7z) raise ValueError.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    parts: list[Partition] = []
    for path in map(str, paths):
        size = os.path.getsize(path)
        kind = _sniff_kind(path)
        if kind == "xml":
            cuts = list(range(0, size, target_bytes)) or [0]
        else:
            cuts = _bz2_cuts(path, size, target_bytes)
        ends = cuts[1:] + [size]
        parts.extend(Partition(path, s, e, kind) for s, e in zip(cuts, ends))
    return parts


# --------------------------------------------------------------------------- byte sources


class _Source:
    """Decompressed bytes of a partition, plus where its own pages stop.

    `limit`: offset in the decompressed bytes from which a `<page>` belongs to the next
    partition (None until known). `failure`: the reason reading stopped early, if it did.
    """

    def __init__(self, partition: Partition, stats: Counter):
        self.partition = partition
        self.stats = stats
        self.limit: int | None = None
        self.failure: str | None = None

    def chunks(self) -> Iterator[bytes]:
        try:
            if self.partition.kind == "bz2":
                yield from self._bz2_chunks()
            else:
                yield from self._xml_chunks()
        except OSError:
            self._fail("read_error")

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.stats[reason] += 1

    def _xml_chunks(self) -> Iterator[bytes]:
        p = self.partition
        self.limit = p.end - p.start
        with open(p.path, "rb") as f:
            f.seek(p.start)
            while chunk := f.read(_READ_SIZE):
                yield chunk

    def _bz2_chunks(self) -> Iterator[bytes]:
        p = self.partition
        produced = 0  # decompressed bytes so far
        with open(p.path, "rb") as f:
            f.seek(p.start)
            read_end = p.start  # file offset after the bytes read so far
            pending = b""  # bytes read but not yet given to a decompressor
            dec = None
            while True:
                if dec is None:  # at a stream boundary
                    if not pending:
                        pending = f.read(_READ_SIZE)
                        read_end += len(pending)
                        if not pending:
                            return
                    if not pending.startswith(b"BZh"[: len(pending)]):
                        self.stats["trailing_data"] += 1
                        return
                    if self.limit is None and read_end - len(pending) >= p.end:
                        self.limit = produced  # streams from here on belong to the next partition
                    dec = bz2.BZ2Decompressor()
                if dec.needs_input:
                    data = pending or f.read(_READ_SIZE)
                    if not pending:
                        read_end += len(data)
                    pending = b""
                    if not data:
                        self._fail("truncated_bz2")
                        return
                else:
                    data = b""  # drain output the decompressor still holds
                try:
                    out = dec.decompress(data, max_length=_READ_SIZE)
                except (OSError, EOFError, ValueError):
                    self._fail("corrupt_bz2")
                    return
                if out:
                    produced += len(out)
                    yield out
                if dec.eof:
                    pending = dec.unused_data
                    dec = None


# --------------------------------------------------------------------------- pages


def iter_pages(
    partition: Partition,
    stats: Counter,
    skipped: dict[str, list[str]] | None = None,
    *,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
) -> Iterator[Page]:
    """Pages of one partition, in file order. Never raises on bad input: failures are counted
    in `stats` and the lost pages named in `skipped` (reasons: see `ReadStats`)."""
    skipped = {} if skipped is None else skipped

    def lose(reason: str, raw: bytes | bytearray, offset: int) -> None:
        stats[reason] += 1
        skipped.setdefault(reason, []).append(_page_label(raw, partition.path, offset))

    source = _Source(partition, stats)
    buf = bytearray()
    base = 0  # decompressed offset of buf[0]
    pos = 0  # where to search next in buf
    page_start: int | None = None  # index in buf of the current page's `<page>`, if inside one
    for chunk in source.chunks():
        stats["xml_bytes"] += len(chunk)
        buf += chunk
        while True:
            if page_start is None:
                i = buf.find(_PAGE_OPEN, pos)
                if i < 0:
                    keep = len(_PAGE_OPEN) - 1  # a tag may straddle chunks
                    drop = max(len(buf) - keep, 0)
                    del buf[:drop]
                    base += drop
                    pos = 0
                    if source.limit is not None and base >= source.limit:
                        return
                    break
                if source.limit is not None and base + i >= source.limit:
                    return
                page_start, pos = i, i + len(_PAGE_OPEN)
            j = buf.find(_PAGE_CLOSE, pos)
            if j < 0:
                if len(buf) - page_start > max_page_bytes:
                    lose("oversized_page", buf[page_start : page_start + 65536], base + page_start)
                    base += len(buf)  # a page's text holds no `<page>`: the next is a new page
                    del buf[:]
                    page_start, pos = None, 0
                else:
                    pos = max(pos, len(buf) - len(_PAGE_CLOSE) + 1)
                break
            nested = buf.find(_PAGE_OPEN, page_start + len(_PAGE_OPEN), j)
            if nested >= 0:  # this page never closed: resync at the next one
                lose("malformed_xml", buf[page_start:nested], base + page_start)
                page_start, pos = None, nested
                continue
            end = j + len(_PAGE_CLOSE)
            raw = bytes(buf[page_start:end])
            offset = base + page_start
            del buf[:end]
            base += end
            page_start, pos = None, 0
            page = _parse_page(raw, stats, lose, offset)
            if page is not None:
                stats["pages"] += 1
                yield page
    if page_start is not None:  # the data ended inside a page
        raw, offset = buf[page_start : page_start + 65536], base + page_start
        if source.failure:  # already counted as one stream failure: just name the page
            skipped.setdefault(source.failure, []).append(_page_label(raw, partition.path, offset))
        else:
            lose("truncated_xml", raw, offset)


def _parse_page(raw: bytes, stats: Counter, lose, offset: int) -> Page | None:
    try:
        elem = ET.fromstring(raw)
    except ET.ParseError:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            lose("invalid_utf8", raw, offset)
        else:
            lose("malformed_xml", raw, offset)
        return None
    fields: dict[str, ET.Element] = {}
    for child in elem:
        fields[child.tag.rpartition("}")[2]] = child  # the last revision wins
    title = fields["title"].text if "title" in fields else None
    if not title:
        lose("missing_title", raw, offset)
        return None
    ints = {}
    for name in ("id", "ns"):
        try:
            ints[name] = int(fields[name].text)
        except (KeyError, TypeError, ValueError):
            lose(f"missing_{name}", raw, offset)
            return None
    text_elem = None
    if "revision" in fields:
        for child in fields["revision"]:
            if child.tag.rpartition("}")[2] == "text":
                text_elem = child
    if text_elem is None:
        lose("missing_text", raw, offset)
        return None
    text = text_elem.text or ""
    if not text:
        stats["empty_text"] += 1
    redirect = fields["redirect"].get("title") if "redirect" in fields else None
    return Page(title, ints["ns"], ints["id"], redirect, text)


_TITLE_RE = re.compile(rb"<title>([^<]{1,512})</title>")
_ID_RE = re.compile(rb"<id>\s*(\d{1,20})\s*</id>")


def _page_label(raw: bytes | bytearray, path: str, offset: int) -> str:
    """How a lost page is named in `skipped`: its title, else its id, else where it was."""
    head = bytes(raw[:65536])
    if m := _TITLE_RE.search(head):
        return html.unescape(m.group(1).decode("utf-8", "replace"))
    if m := _ID_RE.search(head):
        return f"id {int(m.group(1))}"
    return f"{path}@{offset}"
