"""The block-wise (fused) entity memory equals the dense reference, forward and backward."""

import pytest
import torch

from eae_data.constants import NULL_ENTITY
from eae_model.config import load_config
from eae_model.entity_table import EntityTable, entity_attention, linking_loss
from eae_model.kernels.exact_topk import chunked_top_k
from eae_model.kernels.fused_memory import block_attention, cast_rows, chunked_backward, chunked_forward
from eae_model.mentions import Mentions
from eae_model.model import EaEModel


def _inputs(M=37, N=1000, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(M, d, generator=g, dtype=dtype) * 2).requires_grad_()
    E = torch.randn(N, d, generator=g, dtype=dtype).requires_grad_()
    return h, E, g


def _dense(h, E):
    logits = h @ E.T
    return torch.softmax(logits, -1) @ E, torch.logsumexp(logits, -1)


@pytest.mark.parametrize("chunk_rows", [1000, 128, 77])
@pytest.mark.parametrize("retrieve", [True, False])
def test_block_attention_matches_dense_forward_and_backward(chunk_rows, retrieve):
    h, E, g = _inputs()
    R_ref, lse_ref = _dense(h, E)
    gR, glse = torch.randn(R_ref.shape, generator=g, dtype=h.dtype), torch.randn(lse_ref.shape, generator=g, dtype=h.dtype)
    ref_loss = (lse_ref * glse).sum() + ((R_ref * gR).sum() if retrieve else 0)
    ref_grads = torch.autograd.grad(ref_loss, (h, E))

    R, lse, gold = block_attention(h, E, retrieve, "chunked", chunk_rows)
    assert (R is not None) == retrieve and gold is None
    torch.testing.assert_close(lse, lse_ref, rtol=1e-10, atol=1e-10)
    if retrieve:
        torch.testing.assert_close(R, R_ref, rtol=1e-10, atol=1e-10)
    loss = (lse * glse).sum() + ((R * gR).sum() if retrieve else 0)
    for got, want in zip(torch.autograd.grad(loss, (h, E)), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_chunked_float32_is_within_float32_tolerance_of_float64():
    h, E, g = _inputs(M=64, N=5000, d=32)
    R_ref, lse_ref = _dense(h, E)
    R, lse = chunked_forward(h.detach().float(), E.detach().float(), True, 999)
    torch.testing.assert_close(R.double(), R_ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), lse_ref.detach(), rtol=1e-5, atol=1e-5)
    dO = torch.randn(R.shape, generator=g)
    delta = (dO * R).sum(1) - 1.0
    dH, dE = chunked_backward(h.detach().float(), E.detach().float(), dO, lse, delta, 999)
    ref = torch.autograd.grad((R_ref * dO.double()).sum() + lse_ref.sum(), (h, E))
    # Whole-tensor relative error: float32 arithmetic lands far under 1e-5.
    for got, want in ((dH, ref[0]), (dE, ref[1])):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def _close(got, want, tol=1e-5, floor=1e-9):
    """Whole-tensor relative error (elementwise tolerances trip on near-zero entries); `floor`
    absorbs gradients that are zero up to rounding noise (e.g. a bias before a LayerNorm)."""
    diff, norm = (got.double() - want.double()).norm().item(), want.double().norm().item()
    assert diff <= tol * norm + floor, f"|got - want| = {diff:.2e}, |want| = {norm:.2e}"


def _targets(M, N, g):
    t = torch.randint(0, N, (M,), generator=g)
    t[torch.rand(M, generator=g) < 0.4] = NULL_ENTITY
    return t


@pytest.mark.parametrize("k", [None, 5])
@pytest.mark.parametrize("retrieve", [True, False])
def test_entity_table_chunked_equals_dense(k, retrieve):
    h, E, g = _inputs(M=29, N=700, d=16, dtype=torch.float32)
    targets = _targets(29, 700, g)
    dense, chunked = EntityTable(700, 16), EntityTable(700, 16, impl="chunked", chunk_rows=64)
    with torch.no_grad():
        dense.weight.copy_(E)
        chunked.weight.copy_(E)
    up = torch.randn(29, 16, generator=g)
    results = []
    for table in (dense, chunked):
        hh = h.detach().clone().requires_grad_()
        out = table.attend(hh, k, targets, retrieve=retrieve)
        total = out.loss + ((out.retrieved * up).sum() if retrieve else 0)
        total.backward()
        results.append((out.loss.detach(), None if out.retrieved is None else out.retrieved.detach(), hh.grad, table.weight.grad))
    (l0, r0, gh0, gE0), (l1, r1, gh1, gE1) = results
    _close(l1, l0)
    if retrieve:
        _close(r1, r0)
    _close(gh1, gh0)
    _close(gE1, gE0)
    assert torch.equal(chunked.top_k(h.detach(), 7)[1], dense.top_k(h.detach(), 7)[1])


def test_loss_without_linked_mentions_is_zero_and_in_graph():
    table = EntityTable(50, 8, impl="chunked")
    torch.nn.init.normal_(table.weight)
    h = torch.randn(4, 8, requires_grad=True)
    out = table.attend(h, None, torch.full((4,), NULL_ENTITY), retrieve=False)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert h.grad is not None and not h.grad.any()


def test_model_with_chunked_memory_equals_dense():
    overrides = ["memory_chunk_rows=100"]
    configs = [load_config("tiny", overrides=overrides + [f"memory_impl={impl}"]) for impl in ("dense", "chunked")]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (3, 20), generator=g)
    mentions = Mentions.from_lists([[(1, 2), (5, 5)], [(3, 4)], [(2, 2), (8, 10), (12, 12)]], [[7, -1], [300], [1, 2, -1]])
    labels = torch.full_like(ids, -100)
    labels[0, 1:3] = ids[0, 1:3]
    grads, losses = [], []
    for config in configs:
        torch.manual_seed(0)
        model = EaEModel(config).train()
        out = model(ids, mentions=mentions, mlm_labels=labels)
        out.loss.backward()
        losses.append({name: value.item() for name, value in out.losses.items()})
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert losses[0].keys() == losses[1].keys() and "memory_el" in losses[0] and "entity_pred" in losses[0]
    for name in losses[0]:
        assert losses[1][name] == pytest.approx(losses[0][name], rel=1e-5, abs=1e-6)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        _close(grads[1][name], grads[0][name])


@pytest.mark.parametrize("fused", [False, True])
def test_cast_rows_is_reused_until_the_table_changes(fused):
    """fused=True: Adam(fused=True), the GPU pretraining's optimizer, updates the table without
    moving its version counter; the cast must still follow every step."""
    table = EntityTable(50, 8, impl="chunked")
    torch.nn.init.normal_(table.weight)
    first = cast_rows(table.weight, torch.bfloat16)
    assert first.dtype == torch.bfloat16 and torch.equal(first, table.weight.detach().to(torch.bfloat16))
    assert cast_rows(table.weight, torch.bfloat16) is first  # the same step's second read
    assert cast_rows(table.weight, torch.float32) is not first  # another dtype: not the cached copy
    optimizer = torch.optim.Adam(table.parameters(), lr=0.5, fused=fused)
    table.attend(torch.randn(3, 8), None, torch.tensor([1, -1, 4]), retrieve=False).loss.backward()
    optimizer.step()  # an in-place update must invalidate the cast
    second = cast_rows(table.weight, torch.bfloat16)
    assert second is not first and torch.equal(second, table.weight.detach().to(torch.bfloat16))
    assert not torch.equal(second, first)
    with torch.no_grad():
        table.weight.copy_(torch.zeros(50, 8))
    assert not cast_rows(table.weight, torch.bfloat16).any()


def test_model_bf16_autocast_chunked_equals_dense():
    """Under bf16 autocast the chunked path reads the table through cast_rows (one cast per
    step, reused by the memory and EntityPred, forward and backward): the losses and the
    table's gradient stay those of the dense path, and a second step sees the updated table."""
    configs = [load_config("tiny", overrides=["memory_chunk_rows=100", f"memory_impl={impl}"]) for impl in ("dense", "chunked")]
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1000, 2000, (3, 20), generator=g)
    mentions = Mentions.from_lists([[(1, 2), (5, 5)], [(3, 4)], [(2, 2), (8, 10)]], [[7, -1], [300], [1, 2]])
    results = []
    for config in configs:
        torch.manual_seed(0)
        model = EaEModel(config).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        losses = []
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(ids, mentions=mentions)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            losses.append(out.losses["entity_pred"].item())
        results.append((losses, model.entity_table.weight.detach().clone()))
    (dense_losses, dense_w), (chunked_losses, chunked_w) = results
    assert chunked_losses == pytest.approx(dense_losses, rel=2e-2)
    assert dense_losses[1] != dense_losses[0]  # the second step saw the first update
    torch.testing.assert_close(chunked_w, dense_w, rtol=0, atol=5e-3)


def test_entity_pred_with_no_linked_mentions():
    config = load_config("tiny", overrides=["memory_impl=chunked", "memory_chunk_rows=100"])
    model = EaEModel(config).train()
    ids = torch.randint(1000, 2000, (2, 12))
    out = model(ids, mentions=Mentions.from_lists([[(1, 2)], [(3, 3)]], [[-1], [-1]]))
    assert out.losses["entity_pred"].item() == 0.0 and out.entity_queries.shape[0] == 2
    out.loss.backward()
    assert not model.entity_pred.project_query.weight.grad.any()


def test_no_mentions():
    table = EntityTable(50, 8, impl="chunked", chunk_rows=16)
    torch.nn.init.normal_(table.weight)
    h = torch.zeros(0, 8, requires_grad=True)
    out = table.attend(h, None, torch.zeros(0, dtype=torch.long))
    assert out.retrieved.shape == (0, 8) and out.loss.item() == 0.0
    (out.retrieved.sum() + out.loss).backward()
    assert not table.weight.grad.any()


def test_dense_attention_reference_is_unchanged():
    # The dense path's numerics (the default) stay those of entity_attention + linking_loss.
    h, E, g = _inputs(M=6, N=40, d=8, dtype=torch.float32)
    table = EntityTable(40, 8)
    with torch.no_grad():
        table.weight.copy_(E)
    targets = _targets(6, 40, g)
    out = table.attend(h, None, targets)
    retrieved, logits = entity_attention(h, E, None)
    assert torch.equal(out.retrieved, retrieved) and torch.equal(out.loss, linking_loss(logits, targets))


def test_chunked_top_k_equals_topk():
    g = torch.Generator().manual_seed(1)
    h, E = torch.randn(13, 16, generator=g), torch.randn(3001, 16, generator=g)
    vals, ids = chunked_top_k(h, E, 50, chunk_rows=256)
    ref_vals, ref_ids = (h @ E.T).topk(50, dim=1)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(vals, ref_vals)


def test_bad_impl_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="memory_impl must be auto, dense, chunked or triton"):
        load_config("tiny", overrides=["memory_impl=flash"])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # on CPU tensors only Triton's interpreter runs triton
    with pytest.raises(ValueError, match="needs CUDA"):
        block_attention(torch.randn(2, 16), torch.randn(5, 16), True, "triton")


def test_auto_is_triton_on_cuda_tensors_and_dense_elsewhere():
    """memory_impl=auto (the default): the fused kernels where they run fast (CUDA), the dense
    logits on CPUs, even when Triton's interpreter could run the kernels there (CI)."""
    from eae_model.kernels.fused_memory import resolve_impl
    from eae_model.sharded_table import ShardedEntityTable

    cpu = torch.zeros(2, 4)
    assert resolve_impl("auto", cpu) == "dense" and resolve_impl("chunked", cpu) == "chunked"
    assert not ShardedEntityTable(10, 4, memory_impl="auto")._fused(cpu)
    if torch.cuda.is_available():
        assert resolve_impl("auto", cpu.cuda()) == "triton"
    table = EntityTable(50, 8, impl="auto")
    torch.nn.init.normal_(table.weight)
    out = table.attend(torch.randn(3, 8), None, torch.tensor([1, -1, 4]))
    assert out.logits is not None  # dense: the [M, N] logits are returned
