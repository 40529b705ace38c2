"""Parameter counts: the paper's figures, and counts that match a real allocated model."""

import pytest
import torch

from eae_model.config import load_config
from eae_model.model import EaEModel
from eae_model.summary import parameter_counts

# Paper, section "Models Evaluated" / Table 2. Our counts omit BERT's 0.59M pooler (EaE has no
# next-sentence objective), hence the tolerance of 1M.
PAPER_COUNTS = {"paper": 367e6, "no_eae": 366e6, "emb512": 623e6, "mm": 110e6}


@pytest.mark.parametrize("preset, expected", PAPER_COUNTS.items())
def test_paper_parameter_counts(preset, expected):
    total = parameter_counts(load_config(preset))["total"]
    assert abs(total - expected) < 1e6, f"{preset}: {total:,} vs paper {expected:,.0f}"


def test_components_of_the_paper_preset():
    counts = parameter_counts(load_config("paper"))
    h, v, d = 768, 30522, 256
    assert counts["entity_table"] == 1_000_000 * d
    assert counts["entity_memory"] == 2 * h * d + d * h + 2 * h  # W_f, W_b, LayerNorm
    assert counts["entity_pred"] == 2 * h * d
    assert counts["mention_head"] == h * 3 + 3
    layer = 4 * (h * h + h) + (h * 3072 + 3072) + (3072 * h + h) + 2 * 2 * h
    assert counts["transformer_l0"] == 4 * layer and counts["transformer_l1"] == 8 * layer
    assert counts["token_embed"] == (v + 128 + 2) * h + 2 * h
    assert counts["token_pred"] == h * h + h + 2 * h + v  # decoder tied to the word embeddings
    assert counts["total"] == sum(value for key, value in counts.items() if key != "total")


@pytest.mark.parametrize("preset", ["tiny", "no_eae", "mm"])
def test_meta_count_equals_allocated_model(preset):
    overrides = [] if preset == "tiny" else ["num_entities=1000", "vocab_size=1000"]
    config = load_config(preset, overrides=overrides)
    real = EaEModel(config)
    assert parameter_counts(config)["total"] == sum(p.numel() for p in real.parameters())
    assert not any(p.is_meta for p in real.parameters())
