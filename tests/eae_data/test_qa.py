"""QA data: loaders for the official formats (small hand-written files) and answer resolution
(the encoding with an answer-position mention: tests/eae_model/test_qa_encode.py)."""

import json

import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from eae_data.qa.examples import QADataError, QAExample, check_dataset, load_dataset, normalize_answer, parse_target_value
from eae_data.qa.resolve import AnswerResolver

TRIVIAQA_TRAIN = {
    "Data": [
        {"Answer": {"Aliases": ["Paris", "Paris, France"], "MatchedWikiEntityName": "Paris",
                    "NormalizedAliases": ["paris"], "NormalizedValue": "paris", "Type": "WikipediaEntity",
                    "Value": "Paris"},
         "EntityPages": [], "Question": "Which city is the capital of France?", "QuestionId": "tc_1",
         "QuestionSource": "http://www.triviaquiz.org/", "SearchResults": []},
        {"Answer": {"Aliases": ["1066"], "NormalizedAliases": ["1066"], "NormalizedValue": "1066",
                    "Type": "Numerical", "Value": "1066"},
         "Question": "In which year was the Battle of Hastings?", "QuestionId": "tc_2"},
        {"Question": "", "QuestionId": "tc_3", "Answer": {"Value": "x"}},
        {"Question": "No answer here?", "QuestionId": "tc_4"},
    ],
    "Domain": "Unfiltered", "Split": "train", "Version": 1.0,
}
TRIVIAQA_DEV = {"Data": [{"Answer": {"Aliases": ["The Thames", "River Thames"], "Value": "River Thames"},
                          "Question": "Which river flows through London?", "QuestionId": "tc_9"}],
                "Domain": "Unfiltered", "Split": "dev", "Version": 1.0}
WEBQUESTIONS = [
    {"url": "http://www.freebase.com/view/en/justin_bieber", "targetValue": "(list (description \"Jazmine Grace Grimaldi\"))",
     "utterance": "what is the name of justin bieber brother?"},
    {"url": "http://www.freebase.com/view/en/france", "targetValue": "(list (description Paris) (description \"Lyon\"))",
     "utterance": "what are the cities of france?"},
    {"url": "x", "targetValue": "(list)", "utterance": "an unanswerable one?"},
]


def _write(path, blob):
    path.write_text(json.dumps(blob))
    return str(path)


def test_triviaqa_official_format_dev_file_is_the_test_set(tmp_path):
    train, dev = _write(tmp_path / "train.json", TRIVIAQA_TRAIN), _write(tmp_path / "dev.json", TRIVIAQA_DEV)
    data = load_dataset(f"triviaqa:{train},{dev}", dev_fraction=0.0)
    assert [ex.id for ex in data.splits["train"]] == ["tc_1", "tc_2"]
    assert data.splits["train"][0].answers == ["Paris", "Paris, France"]
    assert [ex.id for ex in data.splits["test"]] == ["tc_9"] and data.splits["dev"] == []
    assert data.skipped == {"no_question": 1, "no_answer": 1}
    # with three files, the second is dev
    three = load_dataset(f"triviaqa:{train},{dev},{dev}")
    assert [ex.split for ex in three.splits["dev"]] == ["dev"] and len(three.splits["test"]) == 1


def test_webquestions_official_format(tmp_path):
    path = _write(tmp_path / "wq.json", WEBQUESTIONS)
    data = load_dataset(f"webquestions:{path},{path}", dev_fraction=0.0)
    assert [ex.answers for ex in data.splits["test"]] == [["Jazmine Grace Grimaldi"], ["Paris", "Lyon"]]
    assert data.skipped == {"no_answer": 2}  # the `(list)` record, once per file
    assert parse_target_value('(list (description "say \\"hi\\"") (description Rome))') == ['say "hi"', "Rome"]


def test_dev_carved_from_train_is_stable_and_disjoint(tmp_path):
    path = _write(tmp_path / "wq.json", WEBQUESTIONS * 40)
    a = load_dataset(f"webquestions:{path},{path}", dev_fraction=0.3)
    b = load_dataset(f"webquestions:{path},{path}", dev_fraction=0.3)
    assert [e.id for e in a.splits["dev"]] == [e.id for e in b.splits["dev"]]
    assert 0 < len(a.splits["dev"]) < 80
    assert not {e.id for e in a.splits["dev"]} & {e.id for e in a.splits["train"]}


def test_fanoutqa_single_hop_subquestions_share_their_question_split():
    data = load_dataset("fanoutqa")  # the real dev file shipped in the fanoutqa package
    n = sum(data.counts().values())
    assert n > 1000 and data.skipped["answer_not_a_string"] > 100
    splits = {}
    for split, examples in data.splits.items():
        for ex in examples:
            assert ex.answers[0].strip() and ex.question.strip()
            splits.setdefault(ex.meta["parent"], set()).add(split)
    assert all(len(s) == 1 for s in splits.values())
    assert all(data.counts()[s] > 50 for s in ("train", "dev", "test"))


def test_bad_files_are_clear_errors(tmp_path):
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(QADataError, match="not valid UTF-8 JSON"):
        load_dataset(f"triviaqa:{tmp_path / 'bad.json'},{tmp_path / 'bad.json'}")
    with pytest.raises(QADataError, match="not a TriviaQA file"):
        load_dataset(f"triviaqa:{_write(tmp_path / 'l.json', [])},{tmp_path / 'l.json'}")
    with pytest.raises(QADataError, match="file not found"):
        load_dataset(f"webquestions:{tmp_path / 'nope.json'},{tmp_path / 'nope.json'}")
    with pytest.raises(QADataError, match="needs 2..3"):
        load_dataset("triviaqa:only-one.json")
    with pytest.raises(QADataError, match="unknown QA dataset format"):
        load_dataset("squad:x.json")


def test_check_dataset_names_a_missing_file_and_reads_none(tmp_path):
    """What `eae finetune qa` and `eae tune` check on the driver before Ray starts."""
    bad = _write(tmp_path / "bad.json", {"not": "a list"})  # present but unreadable: not opened here
    check_dataset(f"webquestions:{bad},{bad}")
    check_dataset("fanoutqa")  # the file in the installed package
    (tmp_path / "world").mkdir()
    for spec, missing in ((f"synth:{tmp_path / 'world'}", tmp_path / "world" / "questions.jsonl"),
                          (f"triviaqa:{bad},{tmp_path / 'dev.json'}", tmp_path / "dev.json"),
                          (f"webquestions:{tmp_path / 'train.json'},{bad}", tmp_path / "train.json"),
                          (f"fanoutqa:{tmp_path / 'f.json'}", tmp_path / "f.json")):
        with pytest.raises(QADataError, match=f"^{missing}: not found"):
            check_dataset(spec)
    for spec, message in (("", "no QA dataset given"), ("squad:x.json", "unknown QA dataset format"),
                          ("triviaqa:only-one.json", "needs 2..3"), ("synth:", "synth needs a directory")):
        with pytest.raises(QADataError, match=message):
            check_dataset(spec)


def _vocab(tmp_path):
    pq.write_table(pa.table({"entity_id": [0, 1, 2, 3], "title": ["Paris", "River Thames", "France", "The Beatles"],
                             "count": [9, 5, 4, 3]}), tmp_path / "entities.parquet")
    pq.write_table(pa.table({"alias": ["Thames", "City of Light", "Thames"], "entity_id": [1, 0, 2], "count": [7, 2, 1]}),
                   tmp_path / "aliases.parquet")
    pq.write_table(pa.table({"alias": ["Paris, France"], "title": ["Paris"]}), tmp_path / "redirects.parquet")
    return AnswerResolver.from_dir(tmp_path)


def test_answer_resolution_order(tmp_path):
    r = _vocab(tmp_path)
    assert r.resolve(["Paris"]) == 0 and r.resolve(["paris"]) == 0  # title; MediaWiki first letter
    assert r.resolve(["1066", "Paris, France"]) == 0  # redirect, after an unresolvable alias
    assert r.resolve(["Thames"]) == 1  # anchor text: its most frequent entity
    assert r.resolve(["the thames."]) == 1  # normalised
    assert r.resolve(["beatles"]) == 3  # normalisation drops the article
    assert r.resolve(["Lyon", ""]) is None
    assert r.matches(1, ["The Thames"]) and not r.matches(0, ["The Thames"])
    ex = [QAExample("a", "q", ["Paris"], "dev"), QAExample("b", "q", ["Atlantis"], "dev")]
    assert r.resolve_all(ex) == 1 and ex[1].answer_id is None


def test_missing_vocabulary_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="entity vocabulary"):
        AnswerResolver.from_dir(tmp_path)
