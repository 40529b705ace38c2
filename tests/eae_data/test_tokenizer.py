import pytest

from eae_data.tokenizer import WordPieceTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer()


def test_bert_uncased_ids(tokenizer):
    assert tokenizer.encode("hello world").ids == [101, 7592, 2088, 102]
    assert tokenizer.vocab_size == 30522
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id) == (101, 102, 0, 103)


def test_uncased_wordpieces_and_offsets(tokenizer):
    text = "Abraham Lincoln's Kentucky"
    enc = tokenizer.encode(text)
    pieces = [tokenizer.id_to_token(i) for i in enc.ids]
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert "abraham" in pieces and "lincoln" in pieces
    # offsets point back into the original (cased) text
    for piece, (s, e) in zip(pieces[1:-1], enc.offsets[1:-1]):
        assert text[s:e].lower() == piece.removeprefix("##")


def test_missing_vocab_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        WordPieceTokenizer(tmp_path / "nope.txt")
