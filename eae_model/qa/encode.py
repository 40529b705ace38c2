"""Questions -> model inputs: "[CLS] question [ANS] [SEP]" with the question's proper-name
mentions (unlinked) and one mention on the answer-position token, linked to the answer entity.

The paper appends a special answer-position token and trains the model to predict the answer
entity there with the entity-linking loss; the question's mentions get the mention-detection
loss. The answer position is a mention of its own (s = t = its index), so the memory reads it
(EaE) and EntityPred predicts from it, but it is no text span: its BIO label is IGNORE.

Which token: `[MASK]` by default. The paper does not say which token; [MASK] is the one the
model saw in pretraining exactly where a masked mention's entity had to be predicted, which is
what the answer position asks for. A fresh token (e.g. `[unused0]`) can be chosen by config.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import torch

from eae_data.aliases import AliasMatcher
from eae_data.constants import NULL_ENTITY
from eae_data.contexts import token_span
from eae_data.qa.examples import QAExample
from eae_data.tokenizer import WordPieceTokenizer
from eae_model import bio
from eae_model.mentions import Mentions


@dataclass
class EncodedQuestion:
    ids: list[int]  # [CLS] question [ANS] [SEP]
    spans: list[tuple[int, int]]  # question mentions, wordpiece (start, end) inclusive
    answer_position: int
    answer_id: int  # NULL_ENTITY when the answer did not resolve


@dataclass
class QABatch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mentions: Mentions  # question mentions (unlinked) and the answer positions (linked to answers)
    bio_labels: torch.Tensor  # [B, L]: the question mentions' tags, IGNORE at [ANS] and padding
    answer_index: torch.Tensor  # [B]: which mention is example b's answer position
    answer_ids: torch.Tensor  # [B]: the answer entity, NULL_ENTITY if unresolved

    def to(self, device) -> "QABatch":
        return QABatch(self.input_ids.to(device), self.attention_mask.to(device), self.mentions.to(device),
                       self.bio_labels.to(device), self.answer_index.to(device), self.answer_ids.to(device))


class QAEncoder:
    """encode(examples) -> [EncodedQuestion]; collate(encoded) -> QABatch.

    mention_matcher: finds the question's proper-name mentions by alias matching (None: no
    question mentions). `skipped` counts mentions lost to truncation or misalignment."""

    def __init__(self, tokenizer: WordPieceTokenizer, max_length: int, answer_token: str = "[MASK]",
                 mention_matcher: AliasMatcher | None = None, pad_token_id: int = 0):
        answer_id = tokenizer.token_to_id(answer_token)
        if answer_id is None:
            raise ValueError(f"answer token {answer_token!r} is not in the WordPiece vocabulary")
        if max_length < 4:
            raise ValueError(f"max_length {max_length} leaves no room for a question")
        self.tokenizer, self.max_length, self.answer_token_id = tokenizer, max_length, answer_id
        self.matcher, self.pad_token_id = mention_matcher, pad_token_id
        self.skipped: Counter[str] = Counter()
        self.truncated = 0

    def encode(self, examples: list[QAExample]) -> list[EncodedQuestion]:
        encodings = self.tokenizer.encode_batch([ex.question for ex in examples])
        out = []
        for ex, enc in zip(examples, encodings):
            ids, offsets = enc.ids[:-1], enc.offsets[:-1]  # drop [SEP]: [ANS] goes before it
            if len(ids) > self.max_length - 2:
                ids, offsets = ids[: self.max_length - 2], offsets[: self.max_length - 2]
                self.truncated += 1
            spans = []
            if self.matcher is not None:
                reach = list(itertools.accumulate((e for _, e in offsets), max))
                for span in self.matcher.find(ex.question, []):
                    placed = token_span(offsets, reach, span.start, span.end)
                    if placed is None:
                        self.skipped["truncated" if span.end > reach[-1] else "misaligned"] += 1
                    else:
                        spans.append(placed)
            position = len(ids)
            ids = ids + [self.answer_token_id, self.tokenizer.sep_id]
            answer = NULL_ENTITY if ex.answer_id is None else ex.answer_id
            out.append(EncodedQuestion(ids, spans, position, answer))
        return out

    def collate(self, questions: list[EncodedQuestion]) -> QABatch:
        length = max(len(q.ids) for q in questions)
        input_ids = torch.full((len(questions), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(questions), length), dtype=torch.long)
        spans, entities, answer_index = [], [], []
        n = 0
        for b, q in enumerate(questions):
            input_ids[b, : len(q.ids)] = torch.tensor(q.ids)
            mask[b, : len(q.ids)] = 1
            # mentions in position order; the answer position is the last token but [SEP]
            spans.append(list(q.spans) + [(q.answer_position, q.answer_position)])
            entities.append([NULL_ENTITY] * len(q.spans) + [q.answer_id])
            n += len(q.spans)
            answer_index.append(n)
            n += 1
        mentions = Mentions.from_lists(spans, entities)
        question_only = Mentions.from_lists([q.spans for q in questions])
        labels = bio.bio_labels(question_only, mask)
        labels[torch.arange(len(questions)), torch.tensor([q.answer_position for q in questions])] = bio.IGNORE
        return QABatch(input_ids, mask, mentions, labels, torch.tensor(answer_index),
                       torch.tensor([q.answer_id for q in questions]))
