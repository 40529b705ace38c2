"""The whole model against the paper's equations, its losses, presets and inference path."""

import pytest
import torch
import torch.nn.functional as F
import torch.utils._python_dispatch

from eae_model.config import load_config
from eae_model.mentions import MentionError, Mentions
from eae_model.model import IGNORE, EaEModel, TargetIndices


def _batch(seed=0, length=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (3, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0  # a padded context
    ids[2, 8:] = 0
    ids[2, 7] = 102
    mentions = Mentions.from_lists([[(1, 2), (5, 5)], [(3, 6)], [(2, 3)]], [[4, -1], [9], [-1]])
    return ids, mask, mentions


def _model(preset="tiny", seed=0, **overrides):
    torch.manual_seed(seed)
    config = load_config(preset if preset == "tiny" else "tiny", overrides=[f"{k}={v}" for k, v in overrides.items()])
    return EaEModel(config).double().eval()


@pytest.mark.parametrize("k, norm", [(None, True), (5, True), (5, False)])
def test_forward_follows_the_equations(k, norm):
    """X0..X4 recomputed step by step from the model's own parts and the memory written out
    by hand; the model's X4 and heads must match exactly. norm=False: model.memory_layer_norm
    off, X3 = X2 + X1 (for a model started from a pretrained encoder)."""
    model = _model(memory_layer_norm=norm)
    ids, mask, mentions = _batch()
    out = model(ids, mask, mentions=mentions, k=k)
    key = mask.bool()
    x0 = model.token_embed(ids)
    x1 = model.transformer_l0(x0, key)
    # EntityMemory by hand.
    E = model.entity_embeddings
    x2 = torch.zeros_like(x1)
    for b, s, t in zip(mentions.batch_ids.tolist(), mentions.starts.tolist(), mentions.ends.tolist()):
        h = model.entity_memory.project_query.weight @ torch.cat([x1[b, s], x1[b, t]])
        scores = E @ h
        idx = scores.argsort(descending=True)[: (k or len(scores))]
        alpha = torch.softmax(scores[idx], 0)
        x2[b, s] = model.entity_memory.project_value.weight @ (alpha @ E[idx])
    if norm:
        x3 = F.layer_norm(x2 + x1, (x1.shape[-1],), model.memory_norm.weight, model.memory_norm.bias, 1e-12)
    else:
        assert model.memory_norm is None
        x3 = x2 + x1
    x4 = model.transformer_l1(x3, key)
    torch.testing.assert_close(out.x1, x1)
    torch.testing.assert_close(out.x4, x4)
    # EntityPred: its own W_f on X4 spans, scored against E.
    spans = torch.cat([x4[mentions.batch_ids, mentions.starts], x4[mentions.batch_ids, mentions.ends]], -1)
    h = spans @ model.entity_pred.project_query.weight.T
    torch.testing.assert_close(out.entity_queries, h)
    # With targets, only linked mentions are scored against E (the EL loss reads no other).
    linked = mentions.entity_ids >= 0
    torch.testing.assert_close(out.entity_pred.logits, h[linked] @ E.T)
    torch.testing.assert_close(out.bio_logits, model.mention_head.classifier(x1))


def test_losses_are_the_papers_cross_entropies():
    model = _model()
    ids, mask, mentions = _batch()
    labels = torch.full_like(ids, IGNORE)
    labels[0, 1:3] = ids[0, 1:3]
    masked = ids.clone()
    masked[0, 1:3] = 103
    out = model(masked, mask, mentions=mentions, mlm_labels=labels)
    linked = mentions.entity_ids >= 0
    # EL over all entities, only linked mentions (null-entity mentions get no EL loss).
    want_el = F.cross_entropy(out.memory.logits[linked], mentions.entity_ids[linked])
    want_ep = F.cross_entropy(out.entity_queries[linked] @ model.entity_embeddings.T, mentions.entity_ids[linked])
    # BIO on every real token: B at starts, I inside, O elsewhere.
    bio = torch.zeros_like(ids)
    bio[0, 1], bio[0, 2], bio[0, 5] = 1, 2, 1
    bio[1, 3], bio[1, 4:7] = 1, 2
    bio[2, 2], bio[2, 3] = 1, 2
    want_bio = F.cross_entropy(out.bio_logits[mask.bool()], bio[mask.bool()])
    want_mlm = F.cross_entropy(model.token_logits(out.x4)[0, 1:3], ids[0, 1:3])
    for name, want in [("memory_el", want_el), ("entity_pred", want_ep), ("mention", want_bio), ("mlm", want_mlm)]:
        torch.testing.assert_close(out.losses[name], want, msg=name)
    torch.testing.assert_close(out.loss, want_el + want_ep + want_bio + want_mlm)


class _HostSyncs(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops whose result size or value the host must read (on a GPU: a wait for it)."""

    SYNCS = {"nonzero", "_local_scalar_dense", "is_nonzero", "masked_select"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCS:
            self.seen.append(name)
        # `t[i] = 1`: the 1 becomes a CPU tensor, on a GPU copied from pageable memory (a wait)
        if name in ("index_put_", "index_put") and args[2].dim() == 0:
            self.seen.append(f"{name} of a scalar")
        return func(*args, **(kwargs or {}))


def test_given_target_indices_the_training_forward_never_reads_the_device():
    """TargetIndices found with the batch (on the host) give the same losses and gradients as
    the forward's own, and then the training forward and backward run no host sync at all."""
    model = _model()
    ids, mask, mentions = _batch()
    labels = torch.full_like(ids, IGNORE)
    labels[0, 1:3], labels[1, 4] = ids[0, 1:3], ids[1, 4]
    runs = {}
    for given in (False, True):
        model.zero_grad(set_to_none=True)
        indices = TargetIndices.of(labels, mentions) if given else None
        with _HostSyncs() as syncs:
            out = model(ids, mask, mentions=mentions, mlm_labels=labels, validate=False, indices=indices)
            out.loss.backward()
        runs[given] = (out.losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, syncs.seen)
    assert runs[False][2].count("nonzero") == 2  # without them: masked positions, linked mentions
    assert runs[True][2] == []
    for name, value in runs[False][0].items():
        torch.testing.assert_close(runs[True][0][name], value, rtol=0, atol=0, msg=name)
    assert runs[True][1].keys() == runs[False][1].keys()
    for name, grad in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], grad, rtol=0, atol=0, msg=name)


def test_loss_weights_and_unsup_preset():
    ids, mask, mentions = _batch()
    unsup = _model(memory_el_supervision=False, weight_mlm=0.0)
    out = unsup(ids, mask, mentions=mentions)
    assert "memory_el" not in out.losses
    assert set(out.losses) == {"mention", "entity_pred"}
    torch.testing.assert_close(out.loss, out.losses["mention"] + out.losses["entity_pred"])


@pytest.mark.parametrize("detached", [False, True])
def test_memory_query_detached_keeps_the_memory_s_gradient_out_of_the_l0_layers(detached):
    """model.memory_query_detached: the same forward; the memory's EL loss still trains W_f and
    the table but reaches no l0 parameter (the token embeddings included), and EntityPred's loss
    still reaches them through X1's residual path into X3."""
    ids, mask, mentions = _batch()
    model = _model(memory_query_detached=detached)
    out = model(ids, mask, mentions=mentions)
    torch.testing.assert_close(out.x4, _model()(ids, mask, mentions=mentions).x4, rtol=0, atol=0)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)
        l0 = [p.grad for p in [*model.token_embed.parameters(), *model.transformer_l0.parameters()]]
        return sum(0.0 if g is None else g.abs().sum().item() for g in l0), model.entity_memory.project_query.weight.grad

    l0_from_memory, w_f = grads(out.losses["memory_el"])
    assert (l0_from_memory == 0.0) == detached, l0_from_memory
    assert w_f is not None and w_f.abs().sum() > 0
    assert grads(out.losses["entity_pred"])[0] > 0


def test_no_linked_mentions_gives_zero_el_loss_with_gradient_graph():
    model = _model()
    ids, mask, _ = _batch()
    mentions = Mentions.from_lists([[(1, 2)], [], []], [[-1], [], []])
    out = model(ids, mask, mentions=mentions)
    assert out.losses["memory_el"].item() == 0.0 and out.losses["entity_pred"].item() == 0.0
    out.loss.backward()  # still differentiable


def test_memory_output_only_at_mention_starts():
    model = _model()
    ids, mask, mentions = _batch()
    out = model(ids, mask, mentions=mentions)
    nonzero = out.memory.x2.abs().sum(-1) != 0
    want = torch.zeros_like(nonzero)
    want[mentions.batch_ids, mentions.starts] = True
    assert torch.equal(nonzero, want)


def test_empty_mention_list_is_plain_transformer_plus_layernorm():
    model = _model()
    ids, mask, _ = _batch()
    out = model(ids, mask, mentions=Mentions.empty())
    x1 = out.x1
    x3 = model.memory_norm(x1)
    torch.testing.assert_close(out.x4, model.transformer_l1(x3, mask.bool()))
    assert out.entity_pred.logits.shape == (0, model.config.num_entities)


@pytest.mark.parametrize(
    "spans, message",
    [
        ([[(1, 12)], [], []], "not inside"),
        ([[(-1, 2)], [], []], "not inside"),
        ([[(4, 2)], [], []], "start <= end"),
        ([[], [], [(6, 9)]], "past the 8 real tokens"),
        ([[(1, 3), (3, 5)], [], []], "overlapping"),
        ([[(1, 3), (2, 2)], [], []], "overlapping"),
    ],
)
def test_bad_mentions_are_rejected_clearly(spans, message):
    model = _model()
    ids, mask, _ = _batch()
    with pytest.raises(MentionError, match=message):
        model(ids, mask, mentions=Mentions.from_lists(spans))


def test_bad_batch_and_entity_ids_rejected():
    model = _model()
    ids, mask, _ = _batch()
    m = Mentions.from_lists([[(1, 1)], [], []])
    m.batch_ids[0] = 3
    with pytest.raises(MentionError, match="outside the batch"):
        model(ids, mask, mentions=m)
    with pytest.raises(MentionError, match="entity id 512"):
        model(ids, mask, mentions=Mentions.from_lists([[(1, 1)], [], []], [[512], [], []]))
    with pytest.raises(ValueError, match="max_length"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_inference_uses_decoded_spans_and_k_inference():
    model = _model()
    ids, mask, _ = _batch()
    with torch.no_grad():
        model.mention_head.classifier.bias.copy_(torch.tensor([0.0, 0.0, -50.0]))
        model.mention_head.classifier.weight.zero_()
        model.mention_head.classifier.bias[1] = 5.0  # every allowed token a one-token mention
    out = model(ids, mask)
    allowed = model.mention_allowed(ids, mask)
    assert len(out.mentions) == int(allowed.sum())
    assert torch.equal(out.mentions.starts, out.mentions.ends)
    assert not allowed[out.mentions.batch_ids, out.mentions.starts].logical_not().any()
    # eval mode: top-k with config.k_inference must equal an explicit k
    again = model(ids, mask, mentions=out.mentions, k=model.config.k_inference)
    torch.testing.assert_close(out.x4, again.x4)
    full = model(ids, mask, mentions=out.mentions, k=None)
    assert not torch.allclose(full.x4, out.x4)


@pytest.mark.parametrize("preset", ["no_eae", "mm"])
def test_ablations_run_layers_back_to_back(preset):
    torch.manual_seed(0)
    config = load_config(preset, overrides=["hidden_size=32", "num_heads=2", "ffn_size=64", "num_entities=50",
                                            "entity_dim=8", "vocab_size=6000", "l0=1", "l1=2", "dropout=0"])
    model = EaEModel(config).double().eval()
    ids, mask, mentions = _batch()
    out = model(ids, mask, mentions=mentions)
    assert model.entity_memory is None and out.memory is None
    x = model.token_embed(ids)
    for layer in [*model.transformer_l0.layers, *model.transformer_l1.layers]:
        x = layer(x, mask.bool())
    torch.testing.assert_close(out.x4, x)
    assert (out.entity_pred is not None) == (preset == "no_eae")
    assert (model.entity_embeddings is None) == (preset == "mm")


def test_entity_table_from_matrix_and_frozen():
    config = load_config("tiny", overrides=["entity_trainable=false"])
    matrix = torch.randn(config.num_entities, config.entity_dim)
    model = EaEModel(config, entity_init=matrix)
    assert torch.equal(model.entity_embeddings.detach(), matrix)
    assert not model.entity_embeddings.requires_grad
    ids, mask, mentions = _batch()
    model(ids.clamp(max=config.vocab_size - 1), mask, mentions=mentions).loss.backward()
    assert model.entity_embeddings.grad is None
    assert model.entity_memory.project_query.weight.grad is not None
    with pytest.raises(ValueError, match="expected"):
        EaEModel(config, entity_init=torch.zeros(3, 3))
