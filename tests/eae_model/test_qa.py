"""QA data: loaders for the official formats (small hand-written files), answer resolution,
and the encoding with an answer-position mention."""

import json

import pytest
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eae_model import bio
from eae_model.aliases import AliasMatcher
from eae_model.constants import NULL_ENTITY
from eae_model.qa.encode import QAEncoder
from eae_model.qa.examples import QADataError, QAExample, load_dataset, normalize_answer, parse_target_value
from eae_model.qa.resolve import AnswerResolver
from eae_model.tokenizer import WordPieceTokenizer

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


def test_encoding_appends_the_answer_position_as_a_linked_mention():
    tok = WordPieceTokenizer()
    encoder = QAEncoder(tok, max_length=16, mention_matcher=AliasMatcher(["Arlo Venn", "Osk"]))
    examples = [QAExample("a", "Where was Arlo Venn born?", ["Osk"], "dev", answer_id=7),
                QAExample("b", "Who wrote it?", ["x"], "dev")]
    encoded = encoder.encode(examples)
    first = encoded[0]
    assert first.ids[0] == tok.cls_id and first.ids[-1] == tok.sep_id
    assert first.ids[first.answer_position] == tok.mask_id and first.answer_position == len(first.ids) - 2
    start, end = first.spans[0]
    assert tok.decode(first.ids[start : end + 1]) == "arlo venn"
    batch = encoder.collate(encoded)
    assert batch.input_ids.shape == (2, len(first.ids))
    m = batch.mentions
    assert m.starts[batch.answer_index].tolist() == [e.answer_position for e in encoded]
    assert m.entity_ids[batch.answer_index].tolist() == [7, NULL_ENTITY]
    assert m.entity_ids.tolist().count(NULL_ENTITY) == 2  # the question mention is unlinked
    # BIO: the question's mention is tagged, the answer position is not supervised
    assert batch.bio_labels[0, start].item() == bio.B and batch.bio_labels[0, end].item() == bio.I
    assert batch.bio_labels[0, first.answer_position].item() == bio.IGNORE
    assert (batch.bio_labels[1, : len(encoded[1].ids)] != bio.B).all()


def test_long_questions_are_truncated_and_keep_their_answer_position():
    tok = WordPieceTokenizer()
    encoder = QAEncoder(tok, max_length=8, answer_token="[unused0]")
    [q] = encoder.encode([QAExample("a", "one two three four five six seven eight nine ten", ["x"], "dev")])
    assert len(q.ids) == 8 and q.ids[q.answer_position] == tok.token_to_id("[unused0]") and encoder.truncated == 1
    with pytest.raises(ValueError, match="not in the WordPiece vocabulary"):
        QAEncoder(tok, 8, answer_token="[NOPE]")
