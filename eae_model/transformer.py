"""BERT's embeddings and post-LayerNorm transformer layers (Devlin et al., 2019).

Kept to BERT's exact structure and parameter shapes so the paper's parameter counts hold:
per layer Q, K, V, O projections with biases, a GELU feed-forward block, LayerNorm after each
residual sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eae_model.config import EaEConfig


class TokenEmbed(nn.Module):
    """X0 = TokenEmbed(x): word + position + segment embeddings, LayerNorm, dropout."""

    def __init__(self, config: EaEConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_length, config.hidden_size)
        self.segment = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, L] -> X0 [B, L, H]."""
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None]
        if token_type_ids is None:
            x = x + self.segment.weight[0]
        else:
            x = x + self.segment(token_type_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: EaEConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.dropout

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, H], key_mask [B, L] bool (True = real token) -> [B, L, H]."""
        b, length, hidden = x.shape
        heads = lambda t: t.view(b, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask[:, None, None, :], dropout_p=self.dropout_p if self.training else 0.0
        )
        return self.output(out.transpose(1, 2).reshape(b, length, hidden))


class TransformerLayer(nn.Module):
    """One BERT layer: post-LN attention block, post-LN GELU feed-forward block."""

    def __init__(self, config: EaEConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.ffn_size)
        self.ffn_out = nn.Linear(config.ffn_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, key_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class Transformer(nn.Module):
    """Transformer(X, num_layers): a stack of `num_layers` BERT layers."""

    def __init__(self, config: EaEConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_mask)
        return x
