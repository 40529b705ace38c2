"""The shipped MiniLM encoder under EaE's memory (eae_model/pretrained.py): its weights land in
TokenEmbed and the l0 + l1 stacks so that they compute what Hugging Face's BertModel computes
from the same file; an encoder of another shape is refused with what differs."""

from __future__ import annotations

import pytest
import torch

from eae_model.config import config_from_values
from eae_model.model import EaEModel
from eae_model.pretrained import check_encoder, encoder_dir, load_bert_encoder


def test_the_minilm_encoder_computes_in_eae_what_bert_computes():
    from transformers import BertModel

    model = EaEModel(config_from_values("minilm", {"num_entities": 16})).eval()
    # 3 embedding tables + their LayerNorm (2), and 6 layers x 8 modules x (weight, bias)
    assert load_bert_encoder(model, "minilm") == 5 + 6 * 8 * 2
    bert = BertModel.from_pretrained(str(encoder_dir("minilm")), add_pooling_layer=False).eval()
    ids = torch.tensor([[101, 7592, 2088, 102, 0, 0], [101, 1996, 4248, 2829, 4419, 102]])  # "hello world", padded
    mask = ids != 0
    with torch.no_grad():
        x = model.token_embed(ids)
        ours = model.transformer_l1(model.transformer_l0(x, mask), mask)
        theirs = bert(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-4, rtol=1e-4)
    # the MLM decoder is tied to the loaded word embeddings; the memory stays newly initialised
    assert torch.equal(model.token_embed.word.weight, bert.embeddings.word_embeddings.weight)


def test_an_encoder_of_another_shape_is_refused_with_what_differs(tmp_path):
    medium = config_from_values("medium", {"num_entities": 16})
    with pytest.raises(ValueError, match=r"hidden_size 384 \(the model's 256\).*num_hidden_layers 6 \(the model's 4\)"):
        check_encoder(medium, "minilm")
    with pytest.raises(ValueError, match=r"max_position_embeddings 512 \(the model's max_length 1024\)"):
        check_encoder(config_from_values("minilm", {"max_length": 1024}), "minilm")
    with pytest.raises(FileNotFoundError, match="nor a directory with a BERT encoder's config.json"):
        check_encoder(medium, str(tmp_path))
