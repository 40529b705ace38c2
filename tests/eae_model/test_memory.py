"""EntityMemory against references computed independently of the implementation."""

import math

import pytest
import torch

from eae_model.entity_table import EntityTable, entity_attention
from eae_model.memory import EntityMemory
from eae_model.mentions import Mentions


def T(weight):
    """An EntityTable over exactly this tensor (gradients reach it)."""
    table = EntityTable(*weight.shape)
    del table.weight
    table.weight = weight
    return table


def _loop_reference(x1, spans, w_f, w_b, table, k):
    """The paper's equations, one mention at a time, in Python floats."""
    batch, length, hidden = x1.shape
    out = [[[0.0] * hidden for _ in range(length)] for _ in range(batch)]
    retrieved_all = []
    for b, s, t in spans:
        span = x1[b, s].tolist() + x1[b, t].tolist()
        h = [sum(w_f[i][j] * span[j] for j in range(len(span))) for i in range(len(w_f))]
        scores = [sum(e_i * h_i for e_i, h_i in zip(row, h)) for row in table.tolist()]
        chosen = sorted(range(len(scores)), key=lambda j: -scores[j])[: (k or len(scores))]
        top = max(scores[j] for j in chosen)
        z = sum(math.exp(scores[j] - top) for j in chosen)
        alpha = {j: math.exp(scores[j] - top) / z for j in chosen}
        e_m = [sum(alpha[j] * table[j, d].item() for j in chosen) for d in range(table.shape[1])]
        retrieved_all.append(e_m)
        out[b][s] = [sum(w_b[i][d] * e_m[d] for d in range(len(e_m))) for i in range(hidden)]
    return torch.tensor(out, dtype=torch.float64), torch.tensor(retrieved_all, dtype=torch.float64)


def _layer(hidden, dim, seed=0):
    torch.manual_seed(seed)
    layer = EntityMemory(hidden, dim).double()
    return layer


def test_hand_computed_two_entities():
    # hidden 1, entity dim 1: h = 1*x_s + 1*x_t; E = [[1], [2]]; x_s=1, x_t=0 -> h = 1,
    # scores (1, 2), alpha = softmax(1, 2), E_m = a0*1 + a1*2, output W_b * E_m = 3 * E_m.
    layer = EntityMemory(1, 1).double()
    with torch.no_grad():
        layer.project_query.weight.copy_(torch.tensor([[1.0, 1.0]]))
        layer.project_value.weight.copy_(torch.tensor([[3.0]]))
    table = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    x1 = torch.tensor([[[0.5], [1.0], [0.0]]], dtype=torch.float64)
    mentions = Mentions.from_lists([[(1, 2)]])
    a0 = math.exp(1) / (math.exp(1) + math.exp(2))
    expected_em = a0 * 1 + (1 - a0) * 2
    out = layer(x1, mentions, T(table), k=None)
    assert out.x2[0, 1, 0].item() == pytest.approx(3 * expected_em, abs=1e-12)
    assert out.x2[0, 0, 0].item() == 0.0 and out.x2[0, 2, 0].item() == 0.0
    assert out.logits.tolist() == [[1.0, 2.0]]
    # k = 1 keeps only entity 1: alpha = 1, E_m = 2.
    out_k1 = layer(x1, mentions, T(table), k=1)
    assert out_k1.x2[0, 1, 0].item() == pytest.approx(6.0, abs=1e-12)


@pytest.mark.parametrize("k", [None, 7, 3, 1])
def test_matches_loop_reference(k):
    hidden, dim, n = 6, 4, 7
    layer = _layer(hidden, dim)
    table = torch.randn(n, dim, dtype=torch.float64)
    x1 = torch.randn(2, 5, hidden, dtype=torch.float64)
    spans = [(0, 0, 1), (0, 3, 3), (1, 1, 4)]
    mentions = Mentions.from_lists([[(0, 1), (3, 3)], [(1, 4)]])
    out = layer(x1, mentions, T(table), k=k)
    want_x2, want_em = _loop_reference(
        x1, spans, layer.project_query.weight.tolist(), layer.project_value.weight.tolist(), table, k
    )
    torch.testing.assert_close(out.x2, want_x2, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.retrieved, want_em, rtol=1e-10, atol=1e-12)


def test_k_all_is_exactly_full_softmax():
    torch.manual_seed(1)
    h, table = torch.randn(5, 8), torch.randn(30, 8)
    full, logits = entity_attention(h, table, None)
    torch.testing.assert_close(full, torch.softmax(h @ table.T, -1) @ table, rtol=0, atol=0)
    # k >= N is the same computation as k = all, bit for bit.
    same, _ = entity_attention(h, table, 30)
    assert torch.equal(same, full)
    torch.testing.assert_close(logits, h @ table.T)


def test_top_k_gradients_only_reach_retrieved_rows():
    torch.manual_seed(2)
    h = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    table = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    retrieved, logits = entity_attention(h, table, 3)
    retrieved.sum().backward()
    top = set(logits.topk(3).indices[0].tolist())
    touched = set(table.grad.abs().sum(1).nonzero().flatten().tolist())
    assert touched == top


def test_gradients_match_loop_reference_autograd():
    """Gradients w.r.t. x1, W_f, W_b and E against a float64 reference built from the
    equations with plain tensor ops (no shared code with the layer)."""
    hidden, dim, n, k = 4, 3, 6, 2
    layer = _layer(hidden, dim, seed=3)
    table = torch.randn(n, dim, dtype=torch.float64, requires_grad=True)
    x1 = torch.randn(2, 4, hidden, dtype=torch.float64, requires_grad=True)
    mentions = Mentions.from_lists([[(0, 2)], [(1, 1), (2, 3)]])
    weights = torch.randn(2, 4, hidden, dtype=torch.float64)
    (layer(x1, mentions, T(table), k=k).x2 * weights).sum().backward()
    got = [x1.grad.clone(), table.grad.clone(), layer.project_query.weight.grad.clone(), layer.project_value.weight.grad.clone()]

    x1r = x1.detach().clone().requires_grad_()
    tr = table.detach().clone().requires_grad_()
    wf = layer.project_query.weight.detach().clone().requires_grad_()
    wb = layer.project_value.weight.detach().clone().requires_grad_()
    total = 0
    for b, s, t in [(0, 0, 2), (1, 1, 1), (1, 2, 3)]:
        h = wf @ torch.cat([x1r[b, s], x1r[b, t]])
        scores = tr @ h
        idx = torch.argsort(scores, descending=True)[:k]
        alpha = torch.exp(scores[idx]) / torch.exp(scores[idx]).sum()
        total = total + (weights[b, s] * (wb @ (alpha[:, None] * tr[idx]).sum(0))).sum()
    total.backward()
    for g, r in zip(got, [x1r.grad, tr.grad, wf.grad, wb.grad]):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [None, 3])
def test_gradcheck_float64(k):
    layer = _layer(3, 2, seed=4)
    mentions = Mentions.from_lists([[(0, 1), (2, 2)], [(1, 3)]])

    def fn(x1, table, wf, wb):
        layer.project_query.weight.data, layer.project_value.weight.data = wf, wb
        return torch.func.functional_call(
            layer, {"project_query.weight": wf, "project_value.weight": wb}, (x1, mentions, T(table), k)
        ).x2

    x1 = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    table = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    wf = layer.project_query.weight.detach().clone().requires_grad_()
    wb = layer.project_value.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(fn, (x1, table, wf, wb))


def test_empty_mentions_give_zero_output():
    layer = _layer(4, 3)
    x1 = torch.randn(2, 5, 4, dtype=torch.float64)
    out = layer(x1, Mentions.empty(), T(torch.randn(6, 3, dtype=torch.float64)), k=None)
    assert torch.equal(out.x2, torch.zeros_like(x1))
    assert out.logits.shape == (0, 6) and out.loss.item() == 0.0
