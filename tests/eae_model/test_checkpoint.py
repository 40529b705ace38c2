import json

import pytest
import torch

from eae_model.checkpoint import load_model, save_model
from eae_model.config import load_config
from eae_model.mentions import Mentions
from eae_model.model import EaEModel


def test_save_load_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    model = EaEModel(load_config("tiny")).eval()
    # Move weights off their initial values so a loader that re-initialises would be caught.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(1000, 5000, (2, 10))
    mentions = Mentions.from_lists([[(1, 2)], [(3, 3)]], [[1, 2], [3]])
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(tmp_path / "m").eval()
    assert loaded.config == model.config
    a, b = model(ids, mentions=mentions), loaded(ids, mentions=mentions)
    assert torch.equal(a.x4, b.x4) and torch.equal(a.entity_pred.logits, b.entity_pred.logits)
    # inference path (decoded spans, top-k) too
    assert torch.equal(model(ids).x4, loaded(ids).x4)


def test_frozen_table_stays_frozen(tmp_path):
    model = EaEModel(load_config("tiny", overrides=["entity_trainable=false"]))
    save_model(model, tmp_path)
    assert not load_model(tmp_path).entity_embeddings.requires_grad


def test_loading_never_unpickles(tmp_path, monkeypatch):
    save_model(EaEModel(load_config("tiny")), tmp_path)
    import pickle

    def refuse(*a, **k):
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    load_model(tmp_path)


def test_bad_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a saved EaE model"):
        load_model(tmp_path)
    save_model(EaEModel(load_config("tiny")), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_entities"] = 10
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeError, match="entity_table.weight"):
        load_model(tmp_path)
