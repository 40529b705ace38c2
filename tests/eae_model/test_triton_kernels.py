"""The Triton kernels of the fused entity memory (memory_impl=triton) equal the chunked
PyTorch reference, forward and backward, and the whole model with them equals the dense one.

Without a GPU (CI) the kernels run in Triton's interpreter on CPU tensors: tests/conftest.py
sets TRITON_INTERPRET=1 before triton is imported. The interpreter computes tl.dot as a float32
numpy matmul, so float32 results agree with the reference to rounding (TOL); compiled on a GPU,
float32 tl.dot runs in TF32, hence the looser tolerance there. Shapes are small (the interpreter
runs one program after another) but cover the masks: M not a multiple of BLOCK_M, N not a
multiple of BLOCK_N nor of the 128-row slices, several slices merged, and M = 0.
"""

import pytest
import torch

from eae_data.constants import NULL_ENTITY
from eae_model.config import load_config
from eae_model.entity_table import EntityTable
from eae_model.kernels import common, triton_memory
from eae_model.kernels.fused_memory import chunked_backward, chunked_forward, triton_interpreted
from eae_model.kernels.triton_memory import memory_backward, memory_forward
from eae_model.mentions import Mentions
from eae_model.model import EaEModel
from eae_model.sharded_table import ShardedEntityTable
from tests.eae_model import test_sharded_table as sharded

INTERPRETED = triton_interpreted()
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET is off and there is no GPU", allow_module_level=True)
DEVICE = "cpu" if INTERPRETED else "cuda"
TOL = 1e-5 if INTERPRETED else 1e-4  # whole-tensor relative error (float32 dots: IEEE, as torch.matmul by default)

# (M, N, d): 100 queries = a full and a partial query block of 64 (the row kernel: 32, 4 blocks
# with a partial one); 1000 rows = 8 slices of 128, the last of 104 rows (a partial BLOCK_N
# tile); 77 rows = one partial slice, 37 queries one partial block.
SHAPES = [(100, 1000, 32), (37, 77, 16)]


def _close(got, want, tol=TOL, floor=1e-9):
    diff, norm = (got.double() - want.double()).norm().item(), want.double().norm().item()
    assert diff <= tol * norm + floor, f"|got - want| = {diff:.2e}, |want| = {norm:.2e}"


def _inputs(M, N, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Scores of std ~ 0.6 sqrt(d): softmaxes neither flat nor one-hot.
    H = torch.randn(M, d, generator=g) * 0.6
    E = torch.randn(N, d, generator=g)
    dO = torch.randn(M, d, generator=g)
    g_lse = torch.randn(M, generator=g)
    return H, E, dO, g_lse


def test_the_kernels_run_where_conftest_says():
    # TRITON_INTERPRET must have been set before triton was imported, or the kernels are compiled.
    assert common.INTERPRET == INTERPRETED


@pytest.mark.parametrize("retrieve", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_chunked(shape, retrieve):
    H, E, _, _ = _inputs(*shape)
    R_ref, lse_ref = chunked_forward(H, E, True, chunk_rows=300)
    R, lse = memory_forward(H.to(DEVICE), E.to(DEVICE), retrieve)
    assert lse.dtype == torch.float32 and lse.shape == (shape[0],)
    torch.testing.assert_close(lse.cpu(), lse_ref, rtol=0, atol=TOL * 10)
    if retrieve:
        assert R.dtype == torch.float32 and R.shape == H.shape
        _close(R.cpu(), R_ref)
    else:
        assert R is None


@pytest.mark.parametrize(("retrieve", "need_dh"), [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_chunked(shape, retrieve, need_dh):
    """retrieve: upstream gradients of R and lse (the memory layer); else of lse only (the
    EntityPred head), with or without the dH pass."""
    H, E, dO, g_lse = _inputs(*shape, seed=1)
    R, lse = chunked_forward(H, E, True)
    delta = ((dO * R).sum(1) if retrieve else 0.0) - g_lse
    dO = dO if retrieve else None
    dH_ref, dE_ref = chunked_backward(H, E, dO, lse, delta, chunk_rows=300)
    on = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    dH, dE = memory_backward(on(H), on(E), on(dO), on(lse), on(delta), need_dh)
    assert dE.dtype == torch.float32 and dE.shape == E.shape
    _close(dE.cpu(), dE_ref)
    if need_dh:
        assert dH.dtype == torch.float32 and dH.shape == H.shape
        _close(dH.cpu(), dH_ref)
    else:
        assert dH is None


def test_no_queries():
    E = torch.randn(50, 16, device=DEVICE)
    H = torch.zeros(0, 16, device=DEVICE)
    R, lse = memory_forward(H, E, True)
    assert R.shape == (0, 16) and lse.shape == (0,)
    assert memory_forward(H, E, False)[0] is None
    empty = torch.zeros(0, device=DEVICE)
    dH, dE = memory_backward(H, E, torch.zeros(0, 16, device=DEVICE), empty, empty)
    assert dH.shape == (0, 16) and dE.shape == (50, 16) and not dE.any()
    # Through the table: a batch without mentions.
    table = EntityTable(50, 16, impl="triton").to(DEVICE)
    torch.nn.init.normal_(table.weight)
    h = torch.zeros(0, 16, device=DEVICE, requires_grad=True)
    out = table.attend(h, None, torch.zeros(0, dtype=torch.long, device=DEVICE))
    assert out.retrieved.shape == (0, 16) and out.loss.item() == 0.0
    (out.retrieved.sum() + out.loss).backward()
    assert not table.weight.grad.any()


def test_bad_entity_dim_is_a_clear_error():
    with pytest.raises(ValueError, match="power of two >= 16"):
        memory_forward(torch.randn(4, 24, device=DEVICE), torch.randn(9, 24, device=DEVICE), True)


def _targets(M, N, g):
    t = torch.randint(0, N, (M,), generator=g)
    t[torch.rand(M, generator=g) < 0.4] = NULL_ENTITY
    return t


class _Calls:
    """Counts the kernel launches through eae_model.kernels.triton_memory (block_forward and
    block_backward import them at each call): proof that a path ran the kernels."""

    def __init__(self, monkeypatch):
        self.n = {"forward": 0, "backward": 0}
        for name, fn in (("forward", memory_forward), ("backward", memory_backward)):
            monkeypatch.setattr(triton_memory, f"memory_{name}", self._counting(name, fn))

    def _counting(self, name, fn):
        def wrapped(*args, **kwargs):
            self.n[name] += 1
            return fn(*args, **kwargs)

        return wrapped


@pytest.mark.parametrize("k", [None, 5])
@pytest.mark.parametrize("retrieve", [True, False])
def test_entity_table_triton_equals_dense(monkeypatch, k, retrieve):
    M, N, d = 29, 300, 16
    g = torch.Generator().manual_seed(2)
    h, E = torch.randn(M, d, generator=g) * 0.6, torch.randn(N, d, generator=g)
    targets = _targets(M, N, g)
    up = torch.randn(M, d, generator=g)
    calls = _Calls(monkeypatch)
    results = []
    for impl in ("dense", "triton"):
        table = EntityTable(N, d, impl=impl).to(DEVICE)
        with torch.no_grad():
            table.weight.copy_(E)
        hh = h.to(DEVICE).requires_grad_()
        out = table.attend(hh, k, targets.to(DEVICE), retrieve=retrieve)
        total = out.loss + ((out.retrieved * up.to(DEVICE)).sum() if retrieve else 0)
        total.backward()
        results.append((out.loss.detach(), None if out.retrieved is None else out.retrieved.detach(), hh.grad,
                        table.weight.grad))
    assert calls.n == {"forward": 1, "backward": 1}
    (l0, r0, gh0, gE0), (l1, r1, gh1, gE1) = results
    assert l1.item() == pytest.approx(l0.item(), rel=TOL)
    if retrieve:
        _close(r1, r0)
    _close(gh1, gh0)
    _close(gE1, gE0)


def test_model_with_triton_memory_equals_dense(monkeypatch):
    """The tiny model (entity_dim 32, 512 entities): the memory layer and EntityPred through
    the kernels, losses and every gradient as with the dense memory."""
    configs = [load_config("tiny", overrides=[f"memory_impl={impl}"]) for impl in ("dense", "triton")]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (3, 20), generator=g)
    mentions = Mentions.from_lists([[(1, 2), (5, 5)], [(3, 4)], [(2, 2), (8, 10), (12, 12)]], [[7, -1], [300], [1, 2, -1]])
    labels = torch.full_like(ids, -100)
    labels[0, 1:3] = ids[0, 1:3]
    calls = _Calls(monkeypatch)
    grads, losses = [], []
    for config in configs:
        torch.manual_seed(0)
        model = EaEModel(config).to(DEVICE).train()
        out = model(ids.to(DEVICE), mentions=mentions.to(DEVICE), mlm_labels=labels.to(DEVICE))
        out.loss.backward()
        losses.append({name: value.item() for name, value in out.losses.items()})
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert calls.n["forward"] >= 2 and calls.n["backward"] >= 2  # the memory and EntityPred
    assert losses[0].keys() == losses[1].keys() and "memory_el" in losses[0] and "entity_pred" in losses[0]
    for name in losses[0]:
        assert losses[1][name] == pytest.approx(losses[0][name], rel=TOL, abs=1e-6), name
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        _close(grads[1][name], grads[0][name])


def test_table_gradient_accumulates_in_place_like_autograd():
    """The kernels add the table's gradient straight into weight.grad (no second dense
    gradient): two backward passes without zero_grad sum, as autograd's would, a frozen
    table gets none, and the first pass of a step writes a fresh tensor."""
    M, N, d = 21, 300, 16
    g = torch.Generator().manual_seed(4)
    E = torch.randn(N, d, generator=g)
    hs = [torch.randn(M, d, generator=g) for _ in range(2)]
    targets = _targets(M, N, g).to(DEVICE)
    grads = {}
    for impl in ("dense", "triton"):
        table = EntityTable(N, d, impl=impl).to(DEVICE)
        with torch.no_grad():
            table.weight.copy_(E)
        for h in hs:  # two micro-batches, each through the memory and EntityPred's call
            h = h.to(DEVICE)
            (table.attend(h, None, targets).loss + table.attend(h * 0.5, None, targets, retrieve=False).loss
             + table.attend(h, None).retrieved.square().sum()).backward()
        grads[impl] = table.weight.grad
    _close(grads["triton"], grads["dense"])
    frozen = EntityTable(N, d, trainable=False, impl="triton").to(DEVICE)
    h = hs[0].to(DEVICE).requires_grad_()
    frozen.attend(h, None, targets).loss.backward()
    assert frozen.weight.grad is None and h.grad is not None


@pytest.mark.skipif(not INTERPRETED, reason="the sharded table's reference data lives on the CPU")
@pytest.mark.parametrize("case", sharded.CASES, ids=[c[0] for c in sharded.CASES])
def test_sharded_table_one_worker_with_triton(monkeypatch, case):
    """eae_model.sharded_table's fused path (plan.fused) on one worker, against the
    unsharded reference: the same per-shard code as with several workers."""
    name, k, counts, chunk, retrieve = case
    full, data = sharded.make_data(100, (sum(counts) or 4,))
    table = ShardedEntityTable(sharded.N, sharded.D, chunk_rows=chunk, memory_impl="triton")
    calls = _Calls(monkeypatch)
    res = sharded.compare(table, full, data, 0, k, retrieve)
    assert calls.n["backward"] == 1 and calls.n["forward"] == (1 if k is None or k >= sharded.N or not retrieve else 0)
    assert res["shapes_ok"] and res["unlinked_gold_zero"], res
    for key in ("retrieved", "lse", "gold", "loss", "grad_h", "grad_E"):
        if key in res:
            assert res[key] <= sharded.TOL, (name, key, res[key])


def test_autotuning_key_buckets_mention_counts():
    """Mention counts change every step: the kernels' autotuning key (and the split of E that
    is part of it) must not, within a power of two, or every step would re-time every config."""
    assert common.m_key(0) == common.m_key(16) == 16
    assert common.m_key(1000) == common.m_key(1024) == 1024 < common.m_key(1025)
    cpu = torch.device("cpu")
    assert {triton_memory._splits(m, 1_000_000, cpu) for m in (1025, 1126, 1800, 2048)} == {
        triton_memory._splits(2048, 1_000_000, cpu)}


@pytest.mark.parametrize(("M", "margin", "buckets"), [
    (1900, 0.25, [4096]),  # [1425, 2375]: 2048 (its own) and 4096
    (2100, 0.25, [2048]),  # [1575, 2625]: 2048 and 4096 (its own)
    (3000, 0.5, [2048, 8192]),  # [1500, 4500]: 2048, 4096 (its own), 8192
    (30, 0.25, [64]),  # [22, 38]
    (20, 0.5, [16]),  # [10, 30]: 16 (the smallest bucket) and 32 (its own)
    (1000, 0.01, []),  # [990, 1010]: 1024 only
    (1, 0.9, []),  # [1, 2]: 16 only
    (1900, 0.0, []),
    (0, 0.25, []),
])
def test_pretune_buckets_are_the_neighbours_a_count_may_reach(M, margin, buckets):
    assert triton_memory.pretune_buckets(M, margin) == buckets


@pytest.mark.parametrize("retrieve", [True, False])
def test_pretune_runs_the_kernels_and_changes_nothing(monkeypatch, retrieve):
    """One forward and one backward launch on random queries; E and the global random stream
    are left as they were."""
    E = torch.randn(77, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    before, rng = E.clone(), torch.get_rng_state()
    calls = _Calls(monkeypatch)
    triton_memory.pretune(E, 40, retrieve)
    assert calls.n == {"forward": 1, "backward": 1}
    assert torch.equal(E, before) and torch.equal(torch.get_rng_state(), rng)


def _table_call(table, full, h, targets, k=None, retrieve=True):
    """One attend and backward on a fresh copy of h: the outputs and gradients, detached."""
    table.load_full(full)
    table.weight.grad = None
    h = h.clone().requires_grad_()
    out = table.attend(h, k, targets, retrieve=retrieve)
    (out.loss + out.lse.sum() + (out.retrieved.square().sum() if retrieve else 0)).backward()
    return {"retrieved": out.retrieved, "lse": out.lse, "loss": out.loss, "grad_h": h.grad,
            "grad_E": table.weight.grad}


def test_sharded_table_pretunes_neighbouring_buckets_at_first_call(monkeypatch):
    """30 mentions (bucket 32) with margin 0.25 (counts 22-38): bucket 64 is tuned at the first
    fused call of each variant, once; results are those of a table that tunes nothing ahead."""
    N, d, M = 300, 16, 30
    g = torch.Generator().manual_seed(6)
    full, h = torch.randn(N, d, generator=g), torch.randn(M, d, generator=g) * 0.6
    targets = _targets(M, N, g)
    full, h, targets = full.to(DEVICE), h.to(DEVICE), targets.to(DEVICE)
    plain = ShardedEntityTable(N, d, memory_impl="triton", device=DEVICE)
    table = ShardedEntityTable(N, d, memory_impl="triton", pretune_margin=0.25, device=DEVICE)
    calls = _Calls(monkeypatch)
    got = _table_call(table, full, h, targets)
    assert table.pretuned == {(True, 64)} and calls.n == {"forward": 2, "backward": 2}
    want = _table_call(plain, full, h, targets)
    assert plain.pretuned == set()
    for key in want:  # on a GPU the two tables' autotuning may pick other tile sizes: float32 rounding apart
        if INTERPRETED:
            assert torch.equal(got[key], want[key]), key
        else:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)
    _table_call(table, full, h, targets)  # a second call tunes nothing ahead
    assert table.pretuned == {(True, 64)}
    _table_call(table, full, h, targets, retrieve=False)  # EntityPred's variant: its first call
    assert table.pretuned == {(True, 64), (False, 64)}
    topk = ShardedEntityTable(N, d, memory_impl="triton", pretune_margin=0.25, device=DEVICE)
    _table_call(topk, full, h, targets, k=3)  # top-k retrieval: its forward runs no kernels
    assert topk.pretuned == set()
    for margin in (-0.1, 1.0):
        with pytest.raises(ValueError, match="pretune_margin must be in"):
            ShardedEntityTable(N, d, memory_impl="triton", pretune_margin=margin)
