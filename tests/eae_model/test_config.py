import pytest

from eae_model.config import PRESETS, EaEConfig, load_config


def test_paper_preset_is_bert_base_with_memory():
    c = load_config("paper")
    assert (c.hidden_size, c.num_heads, c.ffn_size, c.vocab_size, c.max_length) == (768, 12, 3072, 30522, 128)
    assert (c.l0, c.l1, c.num_entities, c.entity_dim) == (4, 8, 1_000_000, 256)
    assert c.k_train is None and c.k_inference == 100
    assert c.k(training=True) is None and c.k(training=False) == 100


def test_ablation_presets():
    assert load_config("emb512").entity_dim == 512
    no_eae = load_config("no_eae")
    assert not no_eae.use_entity_memory and no_eae.use_entity_pred and no_eae.l0 + no_eae.l1 == 12
    unsup = load_config("eae_unsup")
    assert not unsup.memory_el_supervision and unsup.k_inference is None
    mm = load_config("mm")
    assert not mm.has_entity_table and not mm.use_mention_detection
    assert set(PRESETS) == {"paper", "emb512", "no_eae", "eae_unsup", "mm", "small", "medium", "minilm", "tiny"}


def test_the_regime_studys_presets_grow_the_transformer_not_the_table():
    small, medium = load_config("small"), load_config("medium")
    assert (small.hidden_size, small.l0 + small.l1) == (128, 2) and (medium.hidden_size, medium.l0 + medium.l1) == (256, 4)
    assert small.entity_dim == medium.entity_dim == 128 and small.dropout == medium.dropout == 0.0


def test_memory_impl_defaults_to_auto():
    assert load_config("paper").memory_impl == "auto"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("model:\n  preset: tiny\n  num_entities: 100\n  k_inference: 8\n")
    c = load_config(path=path, overrides=["k_inference=null", "weight_mlm=0.5", "entity_trainable=false"])
    assert c.preset == "tiny" and c.num_entities == 100
    assert c.k_inference is None and c.weight_mlm == 0.5 and c.entity_trainable is False
    assert EaEConfig.from_dict(c.to_dict()) == c


def test_yaml_with_an_empty_model_section(tmp_path):
    """`model:` with nothing under it (a pretraining file's, say) leaves the preset as it is;
    it was a TypeError."""
    path = tmp_path / "m.yaml"
    path.write_text("model:\ntrain:\n  lr: 1.0e-4\n")
    assert load_config("tiny", path=path) == load_config("tiny")


def test_a_model_key_beside_the_model_section_is_refused_not_ignored(tmp_path):
    """`entity_dim: 16` at the top level of a file with `model:` was read by nothing: the
    model silently kept the preset's entity_dim."""
    path = tmp_path / "m.yaml"
    path.write_text("entity_dim: 16\nmodel:\n  num_entities: 100\ntrain:\n  lr: 1.0e-4\n")
    with pytest.raises(ValueError, match=r"entity_dim at the top level beside `model:`"):
        load_config("tiny", path=path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["nope=1"], "unknown EaEConfig keys: nope"),
        (["k_train=0"], "k_train must be positive"),
        (["num_heads=5"], "not divisible"),
        (["num_heads=0"], "num_heads must be positive, got 0"),  # was a ZeroDivisionError
        (["entity_init_std=-1"], "entity_init_std must be >= 0, got -1.0"),  # was torch's RuntimeError
        (["weight_mlm=-1"], "weight_mlm must be >= 0, got -1.0"),  # was accepted
        (["type_vocab_size=0"], "type_vocab_size must be positive, got 0"),  # was accepted
        (["dropout=1.5"], "dropout"),
        (["memory_pretune_margin=-0.1"], r"memory_pretune_margin must be in \[0, 1\), got -0.1"),
        (["memory_pretune_margin=1.0"], r"memory_pretune_margin must be in \[0, 1\), got 1.0"),
        (["l0"], "key=value"),
        (["num_entities="], "EaEConfig.num_entities must be a number, got null"),
        (["dropout=null"], "EaEConfig.dropout must be a number, got null"),
        # a word YAML does not read as a boolean was kept, a truthy string: the part stayed on
        (["use_entity_memory=flase"], "EaEConfig.use_entity_memory must be true or false, got 'flase'"),
        (["entity_trainable="], "EaEConfig.entity_trainable must be true or false, got None"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny", overrides=overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        load_config("huge")


def test_booleans_from_yaml_words_and_0_or_1():
    c = load_config("tiny", overrides=["use_entity_memory=off", "memory_layer_norm=no", "entity_trainable=0",
                                       "memory_query_detached=1"])
    assert (c.use_entity_memory, c.memory_layer_norm, c.entity_trainable, c.memory_query_detached) == (
        False, False, False, True)


def test_a_whole_number_in_exponent_form_is_an_int():
    """YAML 1.1 leaves 1e6 a string; it was refused as "must be a number"."""
    assert load_config("tiny", overrides=["num_entities=1e6"]).num_entities == 1_000_000
    with pytest.raises(ValueError, match="EaEConfig.num_entities must be a number, got '1.5e0'"):
        load_config("tiny", overrides=["num_entities=1.5e0"])
