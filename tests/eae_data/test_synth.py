import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from eae_data.synth import RELATIONS, build_world, fact_sentence, type_counts, write_world

NS = {"m": "http://www.mediawiki.org/xml/export-0.10/"}
FILES = ("world.xml", "entities.jsonl", "facts.jsonl", "questions.jsonl", "summary.json")
LINK = re.compile(r"\[\[([^\]|]+)(?:\|[^\]]*)?\]\]")
N, SEED = 400, 3


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    write_world(out, N, SEED)
    return out


@pytest.fixture(scope="module")
def pages(out) -> dict[str, dict]:
    """title -> {id, text, redirect (target title or None)}."""
    root = ET.parse(out / "world.xml").getroot()
    pages = {}
    for page in root.findall("m:page", NS):
        redirect = page.find("m:redirect", NS)
        title = page.findtext("m:title", namespaces=NS)
        assert title not in pages
        assert page.findtext("m:ns", namespaces=NS) == "0"
        pages[title] = {
            "id": int(page.findtext("m:id", namespaces=NS)),
            "text": page.findtext("m:revision/m:text", namespaces=NS),
            "redirect": None if redirect is None else redirect.get("title"),
        }
    return pages


def _resolve(pages: dict, title: str) -> str:
    return pages[title]["redirect"] or title


def test_same_seed_same_bytes_other_seed_other_bytes(out, tmp_path):
    write_world(tmp_path / "again", N, SEED)
    write_world(tmp_path / "other", N, SEED + 1)
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    for name in ("world.xml", "entities.jsonl", "questions.jsonl"):
        assert (tmp_path / "other" / name).read_bytes() != (out / name).read_bytes(), name


def test_bytes_do_not_depend_on_the_hash_seed(tmp_path):
    # Set iteration order changes with PYTHONHASHSEED; the files must not.
    write_world(tmp_path / "here", 60, 11)
    code = f"from eae_data.synth import write_world; write_world({str(tmp_path / 'there')!r}, 60, 11)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[2])
    for name in FILES:
        assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "there" / name).read_bytes(), name


def test_dump_has_one_article_per_entity_and_a_redirect_per_alias(out, pages):
    entities = _jsonl(out / "entities.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert [e["id"] for e in entities] == list(range(N))
    assert len(pages) == summary["num_pages"] == N + summary["num_redirects"]
    assert len({p["id"] for p in pages.values()}) == len(pages)
    for e in entities:
        article = pages[e["title"]]
        assert article["redirect"] is None and article["id"] == e["id"] + 1
        assert f"'''{e['name']}'''" in article["text"]  # bold name in the lead
        for alias in e["aliases"]:
            assert pages[alias]["redirect"] == e["title"]
            assert pages[alias]["text"].startswith(f"#REDIRECT [[{e['title']}]]")
    redirects = [p for p in pages.values() if p["redirect"] is not None]
    assert len(redirects) == summary["num_redirects"] > 0
    assert any("&" in title for title in pages)  # escaped on write, unescaped on parse
    for p in pages.values():
        if p["redirect"] is None:
            assert "{{Infobox " in p["text"] and "[[Category:" in p["text"] and "<ref" in p["text"]


def test_every_link_target_is_an_article_or_a_redirect_to_one(pages):
    targets = 0
    for p in pages.values():
        for target in LINK.findall(p["text"]):
            if not target.startswith("Category:"):
                assert target in pages, target
                assert pages[_resolve(pages, target)]["redirect"] is None
                targets += 1
    assert targets > 5 * N


def test_questions_answer_entities_with_articles(out, pages):
    entities = {e["id"]: e for e in _jsonl(out / "entities.jsonl")}
    questions = _jsonl(out / "questions.jsonl")
    assert {q["relation"] for q in questions} == set(RELATIONS)
    for q in questions:
        assert set(q) >= {"id", "question", "answer", "answer_aliases", "relation", "subject", "split"}
        assert q["question"].endswith("?") and "{" not in q["question"]
        assert entities[q["answer_id"]]["title"] == q["answer"]
        assert entities[q["subject_id"]]["title"] == q["subject"]
        assert pages[q["answer"]]["redirect"] is None
        for alias in q["answer_aliases"]:
            assert alias == entities[q["answer_id"]]["name"] or _resolve(pages, alias) == q["answer"]
    assert len({q["id"] for q in questions}) == len(questions)


def test_split_keeps_every_dev_and_test_fact_out_of_training_questions(out, pages):
    facts = {f["id"]: f for f in _jsonl(out / "facts.jsonl")}
    questions = _jsonl(out / "questions.jsonl")
    by_split: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for q in questions:
        by_split[q["split"]].append(q)
    assert 0.7 < len(by_split["train"]) / len(questions) < 0.9
    assert by_split["dev"] and by_split["test"]

    def pairs(qs):  # unordered entity pairs: a fact and its converse look the same
        return {frozenset((q["subject_id"], q["answer_id"])) for q in qs}

    train_keys = {(q["subject_id"], q["relation"]) for q in by_split["train"]}
    for held_out in ("dev", "test"):
        assert not train_keys & {(q["subject_id"], q["relation"]) for q in by_split[held_out]}
        assert not pairs(by_split["train"]) & pairs(by_split[held_out])
        for q in by_split[held_out]:
            fact = facts[q["fact_id"]]
            assert (fact["subject_id"], fact["relation"], fact["object_id"], fact["split"]) == (
                q["subject_id"], q["relation"], q["answer_id"], held_out)
            # Stated in the subject's article, with a link to the object.
            assert fact["evidence"] in pages[q["subject"]]["text"]
            assert q["answer"] in {_resolve(pages, t) for t in LINK.findall(fact["evidence"])}


def test_counts_per_type_follow_the_shares(out):
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == SEED and summary["num_entities"] == N
    assert summary["entities_per_type"] == type_counts(N)
    assert type_counts(1000) == {"country": 20, "city": 150, "river": 40, "organisation": 120, "work": 200,
                                 "person": 470}
    entities = _jsonl(out / "entities.jsonl")
    for t, n in summary["entities_per_type"].items():
        assert sum(e["type"] == t for e in entities) == n
    assert sum(summary["questions_per_split"].values()) == sum(summary["facts_per_relation"].values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_worlds_are_consistent(seed):
    world = build_world(50, seed)
    assert min(type_counts(50).values()) >= 2
    assert len({e.title.lower() for e in world.entities} | {a.lower() for a, _ in world.redirects()}) == (
        len(world.entities) + len(world.redirects()))  # no title or alias is used twice
    seen = set()
    for f in world.facts:
        s, o = world.entities[f.subject], world.entities[f.object]
        assert (s.type, o.type) == RELATIONS[f.relation]
        assert (f.subject, f.relation) not in seen  # functional: one answer per question
        seen.add((f.subject, f.relation))
        sentence = fact_sentence(world, f)
        assert f"[[{o.title}" in sentence or any(f"[[{a}]]" in sentence for a in o.aliases)
        if f.relation == "capital":
            assert world.object_of(o, "located_in") is s
        if f.relation == "on_river":
            assert world.object_of(o, "flows_through") is world.object_of(s, "located_in")
        if f.relation == "based_on":
            assert o.year < s.year and o.name == s.name and s.title == f"{s.name} (film)"
        if f.relation in ("author", "director", "founded_by"):
            assert o.year + 20 <= s.year <= o.attrs.get("death", 2024)
    for e in world.entities:
        assert re.fullmatch(r"[A-Za-z][A-Za-z .&-]*( \(film\))?", e.title), e.title


@pytest.mark.parametrize("num_entities, seed", [(49, 0), (0, 0), (-3, 0), (100.0, 0), ("100", 0),
                                                (True, 0), (100, "0"), (100, 1.5), (100, None)])
def test_bad_arguments_are_rejected_before_writing(tmp_path, num_entities, seed):
    with pytest.raises(ValueError):
        write_world(tmp_path / "w", num_entities, seed)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("renderings", [0, -1, 1.5, True, "2"])
def test_bad_renderings_are_rejected_before_writing(tmp_path, renderings):
    with pytest.raises(ValueError):
        write_world(tmp_path / "w", 100, 0, renderings)
    assert not (tmp_path / "w").exists()


def test_renderings_restate_every_fact_in_new_wording_never_a_probes(out, tmp_path):
    """--renderings 3: the same world (entities, facts, questions), each article stating each of
    its facts twice more, with its subject named, in sentences that are no probe's wording."""
    from eae_data.synth import restatement
    from eae_data.wikitext import parse_wikitext
    from eae_platform.evaluate.probes import SYNTH_TEMPLATES

    write_world(tmp_path / "r3", N, SEED, 3)
    for name in ("entities.jsonl", "facts.jsonl", "questions.jsonl"):
        assert (tmp_path / "r3" / name).read_bytes() == (out / name).read_bytes(), name
    assert json.loads((tmp_path / "r3" / "summary.json").read_text())["renderings"] == 3
    assert json.loads((out / "summary.json").read_text())["renderings"] == 1
    restated = (tmp_path / "r3" / "world.xml").read_text()
    with_facts = sum(1 for facts in build_world(N, SEED).subject_facts if facts)
    assert restated.count("== Overview ==") == restated.count("== Summary ==") == with_facts
    assert "== Overview ==" not in (out / "world.xml").read_text()

    world = build_world(N, SEED)
    probe_wordings = {t.replace("[X] ", "").replace(" [Y] .", "") for t in SYNTH_TEMPLATES.values()}
    for e in world.entities:
        facts = world.subject_facts[e.id]
        texts = [parse_wikitext(restatement(world, e, r)) for r in (1, 2)]
        if not facts:
            assert all(t.text == "" for t in texts)
            continue
        for t in texts:
            targets = sorted(_resolve_title(world, t.text[link.start:link.end], link.target) for link in t.links)
            assert targets == sorted(world.entities[f.object].title for f in facts)  # each fact once, linked
            assert t.text.count(e.name) >= len(facts)  # every sentence names its subject
            assert not any(w in t.text for w in probe_wordings), t.text
    assert restatement(world, world.entities[5], 1) != restatement(world, world.entities[5], 2)


def _resolve_title(world, anchor, target):
    by_alias = {a: x.title for x in world.entities for a in x.aliases}
    return by_alias.get(target, target)
