"""The streaming dump reader: the real sample's counts, partitions that read every page exactly
once (plain XML byte ranges, bz2 multistream), and damaged input counted, never raised."""

import bz2
import gzip
import pickle
import re
from collections import Counter
from xml.sax.saxutils import escape, quoteattr

import pytest

from eae_data.wikidump import (
    Page,
    Partition,
    ReadStats,
    embedded_dump_path,
    iter_pages,
    plan_partitions,
)
from eae_data.wikitext import parse_wikitext

HEADER = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-{v}/" version="{v}" xml:lang="en">\n'
    "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n  </siteinfo>\n"
)
FOOTER = "</mediawiki>\n"


def page_xml(title, page_id, text, ns=0, redirect=None) -> str:
    redirect_tag = f"    <redirect title={quoteattr(redirect)} />\n" if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"{redirect_tag}    <revision>\n      <id>{page_id + 1000}</id>\n"
        f'      <text xml:space="preserve">{escape(text)}</text>\n    </revision>\n  </page>\n'
    )


def dump_xml(pages: list[str], version="0.10") -> bytes:
    return (HEADER.format(v=version) + "".join(pages) + FOOTER).encode()


def small_pages(n=8) -> list[str]:
    return [page_xml(f"Page {i}", i + 1, f"Text of [[page {i}]] & more.") for i in range(n)]


def read_all(paths_or_parts, target_bytes=1 << 40, **kw):
    parts = (
        paths_or_parts
        if paths_or_parts and isinstance(paths_or_parts[0], Partition)
        else plan_partitions(paths_or_parts, target_bytes)
    )
    stats = ReadStats()
    pages = []
    for part in parts:
        pages += iter_pages(part, stats.counts, stats.skipped, **kw)
    return pages, stats


@pytest.fixture(scope="module")
def sample_xml() -> bytes:
    return bz2.decompress(embedded_dump_path().read_bytes())


@pytest.fixture(scope="module")
def sample_pages():
    pages, stats = read_all([str(embedded_dump_path())])
    return pages, stats


# --------------------------------------------------------------------------- the real sample


def test_embedded_dump_counts(sample_pages):
    pages, stats = sample_pages
    assert len(pages) == 206 and stats.counts["pages"] == 206
    assert stats.skipped == {}
    assert stats.counts["xml_bytes"] == 6_089_746
    redirects = [p for p in pages if p.redirect is not None]
    articles = [p for p in pages if p.redirect is None and p.ns == 0]
    assert len(redirects) == 100  # 99 article redirects + the project page, itself a redirect
    assert Counter(p.ns for p in redirects) == {0: 99, 4: 1}
    assert len(articles) == 106
    assert pages[0] == Page(
        "AccessibleComputing", 0, 10, "Computer accessibility", pages[0].text
    )
    assert pages[0].text.startswith("#REDIRECT [[Computer accessibility]]")
    assert len({p.page_id for p in pages}) == 206

    links = Counter()
    skipped = Counter()
    for page in articles:
        parsed = parse_wikitext(page.text)
        links.update(link.target for link in parsed.links)
        skipped += parsed.skipped
    # Exact figures of this parser; the data notes say ~30k `[[` links in all, of which the
    # ones inside templates, refs, tables and file captions are dropped with them.
    assert links.total() == 22_596
    assert skipped["inside_dropped_markup"] == 7_783
    assert 28_000 < links.total() + sum(skipped.values()) < 33_000
    assert len(links) > 10_000 and links.most_common(1)[0][1] >= 10


def test_table_markup_dump():
    pages, stats = read_all([str(embedded_dump_path("enwiki-table-markup.xml.bz2"))])
    assert [p.title for p in pages][:2] == [
        "Constructive vote of no confidence",
        "List of Prison Break characters",
    ]
    assert len(pages) == 5 and stats.skipped == {}
    for page in pages:
        text = parse_wikitext(page.text).text
        assert "{|" not in text and "|}" not in text and "{{" not in text


def test_embedded_dump_path_without_gensim(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gensim"):
        embedded_dump_path()


# --------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("n", [2, 7, 40])
def test_plain_xml_byte_ranges_read_every_page_once(tmp_path, sample_xml, sample_pages, n):
    path = tmp_path / "dump.xml"
    path.write_bytes(sample_xml)
    parts = plan_partitions([str(path)], -(-len(sample_xml) // n))
    assert len(parts) == n and all(p.kind == "xml" for p in parts)
    assert [p.start for p in parts[1:]] == [p.end for p in parts[:-1]]
    pages, stats = read_all(parts)
    assert [p.page_id for p in pages] == [p.page_id for p in sample_pages[0]]
    assert pages == sample_pages[0]
    assert stats.skipped == {}


def test_every_cut_position_reads_every_page_once(tmp_path):
    """Cuts at every byte: a page, kept or lost, belongs to the range where its `<page>` starts."""
    pages = small_pages(6)
    pages[2] = pages[2].replace("</page>", "")  # unclosed: lost once, page 4 still read
    pages[4] = pages[4].replace("</title>", "</titel>")
    path = tmp_path / "small.xml"
    path.write_bytes(dump_xml(pages))
    for target in (1, 2, 5, 17, 64, 1 << 20):
        got, stats = read_all([str(path)], target)
        assert [p.page_id for p in got] == [1, 2, 4, 6], target
        assert stats.skipped == {"malformed_xml": ["Page 2", "id 5"]}, target


def streams(pieces: list[bytes]) -> tuple[bytes, list[int]]:
    """Pieces compressed as separate bz2 streams, concatenated; and each stream's offset."""
    data, offsets = b"", []
    for piece in pieces:
        offsets.append(len(data))
        data += bz2.compress(piece, 1)
    return data, offsets


def sample_page_chunks(sample_xml: bytes, n_pages: int) -> tuple[bytes, list[bytes]]:
    starts = [m.start() for m in re.finditer(rb"  <page>", sample_xml)][: n_pages + 1]
    return sample_xml[: starts[0]], [sample_xml[a:b] for a, b in zip(starts, starts[1:])]


def test_multistream_bz2_splits_at_stream_starts(tmp_path, sample_xml, sample_pages):
    header, pages = sample_page_chunks(sample_xml, 60)
    groups = [b"".join(pages[i : i + 7]) for i in range(0, len(pages), 7)]
    data, offsets = streams([header, *groups, b"</mediawiki>\n"])  # as Wikipedia's multistream
    path = tmp_path / "multi.xml.bz2"
    path.write_bytes(data)
    for target in (1, 20_000, 60_000, len(data)):
        parts = plan_partitions([str(path)], target)
        assert all(p.kind == "bz2" for p in parts)
        assert {p.start for p in parts} <= set(offsets)
        if target == 1:
            assert [p.start for p in parts] == offsets
        got, stats = read_all(parts)
        assert [p.page_id for p in got] == [p.page_id for p in sample_pages[0][:60]], target
        assert stats.skipped == {} and stats.counts["truncated_bz2"] == 0
    assert len(plan_partitions([str(path)], 60_000)) > 2


def test_multistream_with_pages_cut_across_streams(tmp_path, sample_xml, sample_pages):
    """Streams cut at arbitrary bytes (as pbzip2 writes them): still every page exactly once."""
    header, pages = sample_page_chunks(sample_xml, 30)
    body = header + b"".join(pages) + b"</mediawiki>\n"
    cuts = list(range(0, len(body), 9_973)) + [len(body)]
    data, _ = streams([body[a:b] for a, b in zip(cuts, cuts[1:])])
    path = tmp_path / "pbzip2.xml.bz2"
    path.write_bytes(data)
    for target in (1, 5_000, 30_000):
        got, stats = read_all([str(path)], target)
        assert [p.page_id for p in got] == [p.page_id for p in sample_pages[0][:30]], target
        assert stats.skipped == {}


def test_single_stream_bz2_is_one_partition_and_files_are_partitioned_each(tmp_path):
    single = tmp_path / "single.xml.bz2"
    single.write_bytes(bz2.compress(dump_xml(small_pages(6))))
    plain = tmp_path / "no-extension"
    plain.write_bytes(dump_xml([page_xml("Other", 99, "x")]))
    parts = plan_partitions([str(single), str(plain)], 10)
    assert [(p.path, p.kind) for p in parts if p.kind == "bz2"] == [(str(single), "bz2")]
    assert parts[0] == Partition(str(single), 0, single.stat().st_size, "bz2")
    assert len(parts) > 2 and all(p.path == str(plain) for p in parts[1:])
    pages, _ = read_all(parts)
    assert [p.page_id for p in pages] == [1, 2, 3, 4, 5, 6, 99]


def test_any_export_schema_version(tmp_path):
    for version in ("0.10", "0.11"):
        path = tmp_path / f"v{version}.xml"
        path.write_bytes(dump_xml(small_pages(3), version))
        pages, _ = read_all([str(path)])
        assert [p.title for p in pages] == ["Page 0", "Page 1", "Page 2"]
        assert pages[0].text == "Text of [[page 0]] & more."


def test_partitions_and_stats_pickle_and_merge():
    part = Partition("/x.xml", 0, 10, "xml")
    assert pickle.loads(pickle.dumps(part)) == part
    a = ReadStats(Counter(pages=2, malformed_xml=1), {"malformed_xml": ["A"]})
    b = ReadStats(Counter(pages=3, malformed_xml=1, invalid_utf8=1), {"malformed_xml": ["B"], "invalid_utf8": ["C"]})
    a.merge(pickle.loads(pickle.dumps(b)))
    assert a.counts == {"pages": 5, "malformed_xml": 2, "invalid_utf8": 1}
    assert a.skipped == {"malformed_xml": ["A", "B"], "invalid_utf8": ["C"]}


# --------------------------------------------------------------------------- bad input


def test_truncated_bz2_keeps_pages_before_the_cut(tmp_path, sample_pages):
    data = embedded_dump_path().read_bytes()
    path = tmp_path / "half.xml.bz2"
    path.write_bytes(data[: len(data) // 2])
    pages, stats = read_all([str(path)])
    assert 50 < len(pages) < 206
    assert pages == sample_pages[0][: len(pages)]
    assert stats.counts["truncated_bz2"] == 1
    assert stats.skipped == {"truncated_bz2": [sample_pages[0][len(pages)].title]}


def test_corrupt_bz2_keeps_pages_before_the_damage(tmp_path, sample_xml, sample_pages):
    header, pages = sample_page_chunks(sample_xml, 20)
    data, offsets = streams([header, b"".join(pages[:10]), b"".join(pages[10:])])
    damaged = bytearray(data)
    middle = (offsets[2] + len(data)) // 2
    damaged[middle : middle + 64] = bytes(64)
    path = tmp_path / "corrupt.xml.bz2"
    path.write_bytes(damaged)
    got, stats = read_all([str(path)])
    assert got[:10] == sample_pages[0][:10]
    assert all(p in sample_pages[0] for p in got)
    assert stats.counts["corrupt_bz2"] == 1


def test_malformed_xml_resyncs_at_the_next_page(tmp_path):
    pages = small_pages(6)
    pages[1] = pages[1].replace("</title>", "</titel>")  # mismatched tag
    pages[3] = pages[3].replace("</page>", "")  # unclosed page
    path = tmp_path / "bad.xml"
    path.write_bytes(dump_xml(pages))
    got, stats = read_all([str(path)])
    assert [p.page_id for p in got] == [1, 3, 5, 6]
    assert stats.counts["malformed_xml"] == 2
    assert stats.skipped == {"malformed_xml": ["id 2", "Page 3"]}


def test_invalid_utf8_skips_only_that_page(tmp_path):
    data = dump_xml(small_pages(3)).replace(b"Text of [[page 1]]", b"Text \xff\xfe of [[page 1]]")
    path = tmp_path / "utf8.xml"
    path.write_bytes(data)
    got, stats = read_all([str(path)])
    assert [p.page_id for p in got] == [1, 3]
    assert stats.skipped == {"invalid_utf8": ["Page 1"]}


def test_empty_and_incomplete_pages(tmp_path):
    pages = small_pages(2) + [
        page_xml("Empty", 10, ""),
        "  <page>\n    <title>No text</title>\n    <ns>0</ns>\n    <id>11</id>\n  </page>\n",
        "  <page>\n    <ns>0</ns>\n    <id>12</id>\n    <revision><text>x</text></revision>\n  </page>\n",
        page_xml("Bad id", 0, "x").replace("<id>0</id>", "<id>zero</id>", 1),
    ] + [page_xml("Last", 13, "end")]
    path = tmp_path / "empty.xml"
    path.write_bytes(dump_xml(pages))
    got, stats = read_all([str(path)])
    assert [(p.page_id, p.text) for p in got][2:] == [(10, ""), (13, "end")]
    assert stats.counts["empty_text"] == 1
    assert stats.skipped == {
        "missing_text": ["No text"],
        "missing_title": ["id 12"],
        "missing_id": ["Bad id"],
    }


def test_huge_page_is_read_whole_or_skipped_over_the_limit(tmp_path):
    huge = "[[Big]] " + "word " * 1_000_000  # 5 MB of text
    path = tmp_path / "huge.xml"
    path.write_bytes(dump_xml([page_xml("A", 1, "a"), page_xml("Huge", 2, huge), page_xml("B", 3, "b")]))
    got, stats = read_all([str(path)])
    assert [p.page_id for p in got] == [1, 2, 3] and got[1].text == huge
    got, stats = read_all([str(path)], max_page_bytes=1 << 20)
    assert [p.page_id for p in got] == [1, 3]
    assert stats.skipped == {"oversized_page": ["Huge"]}


def test_truncated_xml_and_unreadable_or_foreign_files(tmp_path):
    data = dump_xml(small_pages(4))
    path = tmp_path / "cut.xml"
    path.write_bytes(data[: data.index(b"Text of [[page 2]]")])
    got, stats = read_all([str(path)])
    assert [p.page_id for p in got] == [1, 2]
    assert stats.skipped == {"truncated_xml": ["Page 2"]}

    stats = Counter()
    assert list(iter_pages(Partition(str(tmp_path / "missing.xml"), 0, 10, "xml"), stats)) == []
    assert stats["read_error"] == 1

    gz = tmp_path / "dump.xml.bz2"  # the name lies: the bytes decide
    gz.write_bytes(gzip.compress(data))
    with pytest.raises(ValueError, match="gzip"):
        plan_partitions([str(gz)], 1 << 20)

    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 100)
    got, stats = read_all([str(garbage)])
    assert got == [] and stats.skipped == {}
