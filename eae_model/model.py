"""Entities as Experts (Févry et al., EMNLP 2020), as the paper's equations:

    X0 = TokenEmbed(x)
    X1 = Transformer(X0, num_layers=l0)
    X2 = EntityMemory(X1, mentions)
    X3 = LayerNorm(X2 + X1)
    X4 = Transformer(X3, num_layers=l1)
    heads: BIO mention detection on X1; TokenPred and EntityPred on X4.

Training uses the given mention spans; inference (mentions=None) decodes the BIO head's
spans from X1 and uses those. The ablations are switches of EaEConfig: without the memory
(No-EaE, MM) X3 is X1 and the l0 + l1 layers run back to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from eae_data.constants import CLS_TOKEN_ID, NULL_ENTITY, SEP_TOKEN_ID
from eae_model import bio
from eae_model.config import EaEConfig
from eae_model.entity_table import EntityTable, TableOutput, mean_cross_entropy
from eae_model.heads import EntityPredHead, MentionDetectionHead, TokenPredHead
from eae_model.memory import EntityMemory, MemoryOutput
from eae_model.mentions import Mentions
from eae_model.transformer import TokenEmbed, Transformer

IGNORE = -100  # label of tokens without a masked-LM target
_ALL = object()  # sentinel: use the config's k for the current mode


@dataclass
class EaEOutput:
    x1: torch.Tensor  # [B, L, H]
    x4: torch.Tensor  # [B, L, H]
    mentions: Mentions  # the spans used: given (training) or decoded (inference)
    bio_logits: torch.Tensor | None = None  # [B, L, 3]
    memory: MemoryOutput | None = None
    entity_pred: TableOutput | None = None  # EntityPred's EL loss (and dense logits: linked mentions only when targets are given)
    entity_queries: torch.Tensor | None = None  # EntityPred's h', [M, d]
    mlm_positions: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch, position) of targets
    mlm_logits: torch.Tensor | None = None  # [T, V] at mlm_positions
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    loss: torch.Tensor | None = None


@dataclass
class TargetIndices:
    """Where a training step's losses look: the masked tokens and the linked mentions.

    Finding them takes `nonzero`, whose output size the host must read: on a GPU that makes
    the host wait until the GPU has run everything queued before it. In the forward, that wait
    came at the start of every step and emptied the GPU's queue, and the host then stayed just
    ahead of the GPU for the whole step, leaving it idle between kernels (~8 ms of an 80 ms
    step on an H100, docs/performance.md section 1). Computed with the batch on the host
    (`of(...)` on CPU tensors, then `.to(device)`) and passed to forward(), the step has no
    host sync at all."""

    mlm_positions: tuple[torch.Tensor, torch.Tensor] | None  # (batch, position) of masked tokens
    linked: torch.Tensor | None  # [M_linked] indices of the mentions with an entity

    @staticmethod
    def of(mlm_labels: torch.Tensor | None, mentions: Mentions | None) -> "TargetIndices":
        positions = (mlm_labels != IGNORE).nonzero(as_tuple=True) if mlm_labels is not None else None
        linked = None
        if mentions is not None and mentions.entity_ids is not None:
            linked = (mentions.entity_ids != NULL_ENTITY).nonzero(as_tuple=True)[0]
        return TargetIndices(positions, linked)

    def map(self, fn) -> "TargetIndices":
        """The same indices with fn applied to every tensor (`.to(device)`, `.pin_memory()`)."""
        positions = None if self.mlm_positions is None else tuple(fn(t) for t in self.mlm_positions)
        return TargetIndices(positions, None if self.linked is None else fn(self.linked))


class EaEModel(nn.Module):
    def __init__(
        self, config: EaEConfig, entity_init: torch.Tensor | None = None, entity_table: nn.Module | None = None
    ):
        """entity_init: optional [num_entities, entity_dim] matrix to start E from (paper
        section 6: e.g. TransE or Deep-Ed embeddings); frozen if config.entity_trainable is False.
        entity_table: a table to use instead of a local EntityTable (e.g. the sharded one of
        distributed training), with the same interface."""
        super().__init__()
        self.config = c = config
        self.token_embed = TokenEmbed(c)
        self.transformer_l0 = Transformer(c, c.l0)
        self.transformer_l1 = Transformer(c, c.l1)
        self.token_pred = TokenPredHead(c.hidden_size, c.vocab_size, c.layer_norm_eps)
        self.mention_head = MentionDetectionHead(c.hidden_size) if c.use_mention_detection else None
        if c.use_entity_memory:
            self.entity_memory = EntityMemory(c.hidden_size, c.entity_dim)
            self.memory_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.memory_layer_norm else None
        else:
            self.entity_memory = self.memory_norm = None
        self.entity_pred = EntityPredHead(c.hidden_size, c.entity_dim) if c.use_entity_pred else None
        if entity_table is None and c.has_entity_table:
            entity_table = EntityTable(
                c.num_entities, c.entity_dim, c.entity_trainable, c.memory_impl, c.memory_chunk_rows
            )
            self.entity_table = entity_table
            self.apply(self._init_module)
            self.set_entity_embeddings(entity_init)
        else:
            self.apply(self._init_module)
            self.entity_table = entity_table  # an outside table keeps its own initialisation

    def _init_module(self, module: nn.Module) -> None:
        # BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def entity_embeddings(self) -> torch.Tensor | None:
        """E, [N, d] (this process's rows when the table is sharded)."""
        return None if self.entity_table is None else self.entity_table.weight

    @torch.no_grad()
    def set_entity_embeddings(self, matrix: torch.Tensor | None = None) -> None:
        """Fill E from `matrix` ([N, d]) or, when None, randomly (N(0, entity_init_std))."""
        table = self.entity_embeddings
        if table is None:
            raise ValueError(f"preset {self.config.preset!r} has no entity table")
        if matrix is None:
            nn.init.normal_(table, std=self.config.entity_init_std)
        elif tuple(matrix.shape) != tuple(table.shape):
            raise ValueError(f"entity matrix has shape {tuple(matrix.shape)}, expected {tuple(table.shape)}")
        else:
            table.copy_(matrix)

    def mention_allowed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] bool: tokens a decoded mention may cover (not padding, [CLS] or [SEP])."""
        special = (input_ids == CLS_TOKEN_ID) | (input_ids == SEP_TOKEN_ID)
        return attention_mask.bool() & ~special

    def table_call_sizes(self, mentions: Mentions, indices: TargetIndices) -> list[int]:
        """The mention counts of the entity-table calls that a forward given these mentions
        and indices makes, in order: the memory's (all mentions), then EntityPred's (the linked
        ones) when the mentions carry entity ids; without ids EntityPred's call has nothing to
        compute (no loss; its predictions are the table's `top_k`) and a sharded table makes
        none. What a sharded table's `expect` needs before the forward."""
        sizes = [len(mentions)] if self.entity_memory is not None else []
        if self.entity_pred is not None and mentions.entity_ids is not None:
            sizes.append(len(indices.linked))
        return sizes

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        mentions: Mentions | None = None,
        mlm_labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        k: int | None | object = _ALL,
        validate: bool = True,
        bio_labels: torch.Tensor | None = None,
        indices: TargetIndices | None = None,
    ) -> EaEOutput:
        """input_ids [B, L]; attention_mask [B, L] (1 = real token); mentions: the given spans
        (training, with entity ids for the EL losses) or None to use the BIO head's decoded
        spans; mlm_labels [B, L]: the original token at masked positions, IGNORE elsewhere;
        k: the memory's top-k (None = all), by default config.k_train / k_inference;
        bio_labels [B, L]: mention-detection targets when they are not the given spans' tags
        (QA: the answer position is a mention but no text span); indices: the batch's
        TargetIndices when the caller has them (training: computed on the host with the batch,
        so the forward does not wait for the GPU), else computed here.

        Losses are computed only when mentions are given (training), for what labels are given:
        BIO (models with the head), EL for the memory and EntityPred (linked mentions), masked LM
        (mlm_labels).
        Without mentions (inference) there is no loss; mlm_labels still give mlm_logits."""
        c = self.config
        if attention_mask is None:
            attention_mask = (input_ids != c.pad_token_id).long()
        if input_ids.shape[1] > c.max_length:
            raise ValueError(f"sequence of {input_ids.shape[1]} tokens exceeds max_length {c.max_length}")
        key_mask = attention_mask.bool()
        if validate and not key_mask.any(1).all():
            raise ValueError("every context needs at least one real token (attention_mask all zero)")
        if k is _ALL:
            k = c.k(self.training)

        # Without the caller's indices, the forward's only host syncs (nonzero), before any layer
        # is launched, so that the GPU's queue does not drain mid-step.
        if indices is None:  # linked mentions only for EntityPred: no nonzero without it
            indices = TargetIndices.of(mlm_labels, mentions if self.entity_pred is not None else None)
        mlm_positions = indices.mlm_positions if mlm_labels is not None else None
        linked = indices.linked if self.entity_pred is not None else None

        x1 = self.transformer_l0(self.token_embed(input_ids, token_type_ids), key_mask)
        bio_logits = self.mention_head(x1) if self.mention_head is not None else None
        given = mentions is not None
        if not given:
            if bio_logits is None:
                mentions = Mentions.empty(input_ids.device)
            else:
                with torch.no_grad():
                    tags = bio.decode_bio(bio_logits, self.mention_allowed(input_ids, attention_mask))
                mentions = bio.tags_to_mentions(tags)
        elif validate:
            mentions.validate(attention_mask, c.num_entities if c.has_entity_table else None)

        # Entity-linking targets: linked mentions of given spans (unlinked: NULL_ENTITY).
        targets = mentions.entity_ids if given else None
        memory = None
        x3 = x1
        if self.entity_memory is not None:
            memory_targets = targets if c.memory_el_supervision else None
            query_x1 = x1.detach() if c.memory_query_detached else x1
            memory = self.entity_memory(query_x1, mentions, self.entity_table, k, memory_targets)
            x3 = memory.x2 + x1 if self.memory_norm is None else self.memory_norm(memory.x2 + x1)
        x4 = self.transformer_l1(x3, key_mask)

        out = EaEOutput(x1=x1, x4=x4, mentions=mentions, bio_logits=bio_logits, memory=memory)
        if self.entity_pred is not None:
            out.entity_queries, out.entity_pred = self.entity_pred(x4, mentions, self.entity_table, targets, linked)
        if mlm_labels is not None:
            out.mlm_positions = mlm_positions
            out.mlm_logits = self.token_pred(x4[out.mlm_positions], self.token_embed.word.weight)
        if given:
            self._add_losses(out, attention_mask, mlm_labels, bio_labels)
        return out

    def token_logits(self, x4: torch.Tensor) -> torch.Tensor:
        """TokenPred at every position: x4 [..., H] -> [..., V]."""
        return self.token_pred(x4, self.token_embed.word.weight)

    def _add_losses(self, out: EaEOutput, attention_mask: torch.Tensor, mlm_labels: torch.Tensor | None,
                    bio_targets: torch.Tensor | None = None) -> None:
        c, m = self.config, out.mentions
        losses: dict[str, torch.Tensor] = {}
        weights: dict[str, float] = {}
        if out.bio_logits is not None:
            labels = bio.bio_labels(m, attention_mask) if bio_targets is None else bio_targets
            losses["mention"] = mean_cross_entropy(out.bio_logits.flatten(0, 1), labels.flatten(), IGNORE)
            weights["mention"] = c.weight_mention
        if m.entity_ids is not None:
            # Entity linking: softmax over all entities, only for linked mentions.
            if out.memory is not None and c.memory_el_supervision:
                losses["memory_el"] = out.memory.loss
                weights["memory_el"] = c.weight_memory_el
            if out.entity_pred is not None:
                losses["entity_pred"] = out.entity_pred.loss
                weights["entity_pred"] = c.weight_entity_pred
        if mlm_labels is not None:
            losses["mlm"] = mean_cross_entropy(out.mlm_logits, mlm_labels[out.mlm_positions], IGNORE)
            weights["mlm"] = c.weight_mlm
        out.losses = losses
        if losses:
            out.loss = sum(weights[name] * value for name, value in losses.items())
