"""QA encoding: questions -> model batches with an answer-position mention (the QA data formats
and answer resolution: tests/eae_data/test_qa.py)."""

import pytest

from eae_data.aliases import AliasMatcher
from eae_data.constants import NULL_ENTITY
from eae_data.qa.examples import QAExample
from eae_data.tokenizer import WordPieceTokenizer
from eae_model import bio
from eae_model.qa.encode import QAEncoder


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
