"""The sharded entity table equals the unsharded memory layer and EL loss.

Two real worker processes (torch.multiprocessing, spawn, gloo over localhost TCP) each own half
of E and have their own mentions. The reference is `entity_attention` on the full matrix with
the data-parallel objective J = (1/W) sum_w L_w, where worker w's loss is
    L_w = EL loss_w + sum(E_m,w * G_w) + 0.1 sum(lse_w * c_w)
(G_w, c_w fixed random seeds for the gradients of the retrieved vectors and of lse). Compared,
in float32 within 1e-5: E_m, lse, gold scores, loss, dL_w/dh_w (= W dJ/dh_w, what the worker's
own backward gives), and the worker's rows of dJ/dE (DDP's averaging convention).
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.nn.functional as F

from eae_model.entity_table import entity_attention
from eae_model.sharded_table import ShardedEntityTable, bytes_per_step, exchange_counts, shard_bounds
from eae_platform.pretrain.profiling import SpanTimer  # the timing hook the Ray layer passes in
from tests.conftest import free_port

N, D, W = 11, 16, 2  # N odd: shards of 6 and 5 rows
TOL = 1e-5

# name, k, mentions per worker, chunk_rows, retrieve
CASES = [
    ("all", None, (5, 3), 65536, True),
    ("all-chunked-rank0-empty", None, (0, 6), 2, True),
    ("k3", 3, (4, 6), 65536, True),
    ("k3-chunked", 3, (6, 5), 2, True),
    ("k7-exceeds-shards", 7, (0, 6), 65536, True),
    ("k7-exceeds-shards-chunked", 7, (5, 4), 4, True),
    ("k20-above-N", 20, (3, 4), 65536, True),
    ("link-only", None, (5, 2), 3, False),
]


def make_data(seed: int, counts: tuple[int, ...]):
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(N, D, generator=gen) * 0.5
    data = []
    for m in counts:
        t = torch.randint(0, N, (m,), generator=gen)
        t[torch.rand(m, generator=gen) < 0.3] = -1
        if m:
            t[-1] = -1  # at least one unlinked mention per worker that has any
        h = torch.randn(m, D, generator=gen) * 0.5
        data.append({"h": h, "t": t, "G": torch.randn(m, D, generator=gen), "c": torch.randn(m, generator=gen)})
    return full, data


def reference(full, data, k, retrieve):
    """Unsharded: per worker outputs, dL_w/dh_w, and dJ/dE with J = mean_w L_w."""
    E = full.clone().requires_grad_(True)
    hs = [x["h"].clone().requires_grad_(True) for x in data]
    outs, J = [], 0.0
    for x, h in zip(data, hs):
        R, logits = entity_attention(h, E, k)
        lse = logits.logsumexp(-1)
        linked = x["t"] != -1
        loss = F.cross_entropy(logits, x["t"], ignore_index=-1, reduction="sum") / linked.sum().clamp(min=1)
        L = loss + 0.1 * (lse * x["c"]).sum() + ((R * x["G"]).sum() if retrieve else 0.0)
        J = J + L / len(data)
        gold = logits.gather(1, x["t"].clamp(min=0)[:, None])[:, 0]
        outs.append(
            {"R": R.detach(), "lse": lse.detach(), "gold": gold.detach(), "loss": loss.detach(), "linked": linked}
        )
    J.backward()
    for o, h in zip(outs, hs):
        o["gh"] = h.grad * len(data)
    return outs, E.grad


def compare(table: ShardedEntityTable, full, data, rank, k, retrieve) -> dict:
    ref, ref_gE = reference(full, data, k, retrieve)
    if not table.grad_average:  # the gradient of sum_w L_w instead of its mean
        ref_gE = ref_gE * len(data)
    x, r = data[rank], ref[rank]
    table.load_full(full)
    table.weight.grad = None
    h = x["h"].clone().requires_grad_(True)
    out = table.attend(h, k, x["t"], retrieve=retrieve)
    L = out.loss + 0.1 * (out.lse * x["c"]).sum() + ((out.retrieved * x["G"]).sum() if retrieve else 0.0)
    L.backward()
    diff = lambda a, b: (a - b).abs().max().item() if a.numel() else 0.0  # noqa: E731
    result = {
        "lse": diff(out.lse, r["lse"]),
        "gold": diff(out.gold[r["linked"]], r["gold"][r["linked"]]),
        "unlinked_gold_zero": bool((out.gold[~r["linked"]] == 0).all()),
        "loss": abs(out.loss.item() - r["loss"].item()),
        "grad_h": diff(h.grad, r["gh"]),
        "grad_E": diff(table.weight.grad, ref_gE[table.lo : table.hi]),
        "shapes_ok": out.lse.shape == (len(x["h"]),) and out.loss.dim() == 0,
    }
    if retrieve:
        result["retrieved"] = diff(out.retrieved, r["R"])
        result["shapes_ok"] &= out.retrieved.shape == x["h"].shape
    else:
        result["shapes_ok"] &= out.retrieved is None
    return result


def compare_top_k(table: ShardedEntityTable, full, h) -> dict:
    table.load_full(full)
    worst, ids_equal = 0.0, True
    for k in (1, 3, 6, 7, N, N + 2):
        scores, ids = table.top_k(h, k)
        want_s, want_i = (h @ full.T).topk(min(k, N), dim=1)
        if h.shape[0]:
            worst = max(worst, (scores - want_s).abs().max().item())
        ids_equal &= torch.equal(ids, want_i) and scores.shape == (h.shape[0], min(k, N))
    return {"top_k_scores": worst, "top_k_ids_equal": ids_equal}


# ----------------------------------------------------------------------------- the workers


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W, timeout=datetime.timedelta(seconds=60)
    )
    # Count the bytes each all_to_all sends to other workers, to check bytes_per_step.
    sent = {"bytes": 0, "gather_groups": []}
    real_a2a, real_all_gather = dist.all_to_all_single, dist.all_gather

    def counting_a2a(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
        row = input.element_size() * (input[0].numel() if input.shape[0] else 0)
        sent["bytes"] += row * sum(n for w, n in enumerate(input_split_sizes) if w != rank)
        return real_a2a(output, input, output_split_sizes, input_split_sizes, group=group, **kw)

    def counting_all_gather(tensors, tensor, group=None, **kw):
        sent["bytes"] += tensor.numel() * tensor.element_size() * (W - 1)
        sent["gather_groups"].append(group)
        return real_all_gather(tensors, tensor, group=group, **kw)

    dist.all_to_all_single, dist.all_gather = counting_a2a, counting_all_gather

    results = {}
    try:
        fresh = ShardedEntityTable(N, D)
        results["state_dict"] = {key: value for key, value in fresh.state_dict().items()}
        results["bounds"] = (fresh.lo, fresh.hi)
        for seed, (name, k, counts, chunk, retrieve) in enumerate(CASES):
            full, data = make_data(seed, counts)
            table = ShardedEntityTable(N, D, chunk_rows=chunk)
            sent["bytes"] = 0
            res = compare(table, full, data, rank, k, retrieve)
            res["bytes_sent"] = sent["bytes"]
            res.update(compare_top_k(table, full, data[rank]["h"]))
            results[name] = res
        # grad_average=False: weight.grad is d(sum_w L_w)/dE, for losses that are global means.
        full, data = make_data(2, CASES[2][2])
        results["k3-grad-sum"] = compare(ShardedEntityTable(N, D, grad_average=False), full, data, rank, 3, True)
        # Bad input on one worker raises on both instead of hanging.
        table = ShardedEntityTable(N, D)
        t = torch.tensor([N if rank == 1 else 0])
        try:
            table.attend(torch.zeros(1, D), None, t)
            results["bad_target_raised"] = False
        except ValueError as err:
            results["bad_target_raised"] = "worker 1" in str(err)
        # As under NCCL: R0 (the mention counts) goes over a gloo group of its own, on the host.
        real_backend = dist.get_backend
        dist.get_backend = lambda group=None: "nccl"
        try:
            table = ShardedEntityTable(N, D)
        finally:
            dist.get_backend = real_backend
        full, data = make_data(2, CASES[2][2])
        sent["gather_groups"] = []
        results["k3-sizes-on-host"] = compare(table, full, data, rank, 3, True)
        host = table._comm.host_group
        results["sizes_on_host"] = host is not None and sent["gather_groups"] == [host]  # one attend: one R0
        try:
            table.attend(torch.zeros(1, D), None, t)
            results["bad_target_raised_on_host"] = False
        except ValueError as err:
            results["bad_target_raised_on_host"] = "worker 1" in str(err)
        # R0 ahead of the calls (the training loop's prefetch thread): exchange_counts over a
        # gloo group of its own, then expect; the calls themselves gather nothing.
        ahead = dist.new_group(backend="gloo")
        counts = (4, 6, 3)
        full, data = make_data(4, counts[:W])
        sent["gather_groups"] = []
        expected = exchange_counts([len(data[rank]["h"]), 2 + rank], ahead)
        results["counts_exchanged"] = expected == [list(counts[:W]), [2, 3]] and sent["gather_groups"] == [ahead]
        table = ShardedEntityTable(N, D)
        table.expect(expected[:1])
        table.timer = SpanTimer(torch.device("cpu"))  # the training loop's timing of exchanges
        sent["gather_groups"] = []
        results["k3-counts-ahead"] = compare(table, full, data, rank, 3, True)
        results["no_gather_in_call"] = sent["gather_groups"] == []
        results["exchanges_timed"] = (table.timer.counts["exchange"], table.timer.take().get("exchange", 0.0))
    finally:
        torch.save(results, f"{out_dir}/rank{rank}.pt")
        dist.destroy_process_group()
    # the results saved, leave without the interpreter's finalization, where gloo's teardown can
    # abort a finished worker (tests/eae_platform/gloo_workers.py says when it did); an exception
    # above still ends the worker non-zero
    os._exit(0)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("sharded")
    port = free_port()
    assert port != 6379
    start = time.monotonic()
    ctx = mp.start_processes(_worker, args=(port, str(out)), nprocs=W, start_method="spawn", join=False)
    deadline = start + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("sharded table workers did not finish in 120 s (collective mismatch?)")
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(W)]
    return results, time.monotonic() - start


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", [c[0] for c in CASES] + ["k3-grad-sum", "k3-sizes-on-host", "k3-counts-ahead"])
def test_two_workers_match_unsharded(two_workers, name):
    results, _ = two_workers
    for rank, res in enumerate(results):
        r = res[name]
        print(name, rank, {key: value for key, value in r.items() if key != "bytes_sent"})
        assert r["shapes_ok"] and r["unlinked_gold_zero"] and r.get("top_k_ids_equal", True), (name, rank, r)
        for key in ("retrieved", "lse", "gold", "loss", "grad_h", "grad_E", "top_k_scores"):
            if key in r:
                assert r[key] <= TOL, (name, rank, key, r[key])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bytes_sent_match_formula(two_workers, case):
    results, _ = two_workers
    name, k, counts, _, retrieve = case
    measured = sum(res[name]["bytes_sent"] for res in results)
    predicted = bytes_per_step(sum(counts), D, k, W, num_entities=N, retrieve=retrieve)["total"]
    assert measured == predicted, (name, measured, predicted)


def test_two_workers_bounds_state_dict_and_errors(two_workers):
    results, seconds = two_workers
    print(f"two-worker run: {seconds:.1f} s")
    assert [res["bounds"] for res in results] == [shard_bounds(N, W, r) for r in range(W)] == [(0, 6), (6, 11)]
    # Per-shard checkpoints: own rows and their range; together they are the W=1 table.
    shards = [res["state_dict"] for res in results]
    assert [sd["weight"].shape[0] for sd in shards] == [6, 5]
    assert torch.equal(ShardedEntityTable.full_from_shards(shards), ShardedEntityTable(N, D).weight.detach())
    assert all(res["bad_target_raised"] for res in results)
    # under NCCL the counts go between the hosts over gloo: same results, same errors
    assert all(res["sizes_on_host"] and res["bad_target_raised_on_host"] for res in results)
    # counts exchanged ahead: [call][worker], and the call itself gathers nothing
    assert all(res["counts_exchanged"] and res["no_gather_in_call"] for res in results)
    # a timed table (SpanTimer): the six exchanges of a top-k call's forward and backward
    # (queries, candidates, prefix lengths, partials; output gradients, query gradients)
    assert all(res["exchanges_timed"][0] == 6 and res["exchanges_timed"][1] > 0 for res in results)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_worker_without_process_group(case):
    """No process group: one worker owns all rows, same code path, no communication."""
    name, k, counts, chunk, retrieve = case
    torch.manual_seed(0)
    full, data = make_data(100, (sum(counts) or 4,))
    table = ShardedEntityTable(N, D, chunk_rows=chunk)
    assert (table.lo, table.hi, table.world_size) == (0, N, 1)
    res = compare(table, full, data, 0, k, retrieve)
    res.update(compare_top_k(table, full, data[0]["h"]))
    print(name, res)
    assert res["shapes_ok"] and res["unlinked_gold_zero"] and res["top_k_ids_equal"]
    for key in ("retrieved", "lse", "gold", "loss", "grad_h", "grad_E", "top_k_scores"):
        if key in res:
            assert res[key] <= TOL, (name, key, res[key])


def test_no_linked_mentions_gives_zero_loss_in_graph():
    table = ShardedEntityTable(N, D, init_std=0.5)
    h = torch.randn(3, D, requires_grad=True)
    out = table.attend(h, 3, torch.full((3,), -1))
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    out.loss.backward()
    assert h.grad.abs().max() == 0 and table.weight.grad.abs().max() == 0


def test_expected_counts_are_checked_and_consumed():
    """One worker, no process group: exchange_counts is local and `expect` replaces R0."""
    assert exchange_counts([5, 2]) == [[5], [2]]
    full, data = make_data(7, (5,))
    table = ShardedEntityTable(N, D)
    table.expect([[5]])
    res = compare(table, full, data, 0, 3, True)  # one call, with the expected count
    assert res["lse"] <= TOL and res["grad_E"] <= TOL
    table.expect([[4], [2]])  # the first expectation was consumed: a new one is accepted
    with pytest.raises(RuntimeError, match="were not made"):
        table.expect([[4]])
    with pytest.raises(ValueError, match="this call has 3 mentions, 4 were expected"):
        table.attend(torch.zeros(3, D), None, torch.zeros(3, dtype=torch.long))
    # a failed call drops the step's expectations; bad input is still a clear error
    table.expect([[2]])
    with pytest.raises(ValueError, match="targets"):
        table.attend(torch.zeros(2, D), None, torch.tensor([0, N]))
    table.expect([[1]])


def test_state_dict_roundtrip_and_mismatch():
    table = ShardedEntityTable(N, D, seed=3)
    other = ShardedEntityTable(N, D, seed=4)
    other.load_state_dict(table.state_dict())
    assert torch.equal(other.weight, table.weight)
    sd = table.state_dict()
    sd["_extra_state"] = {**sd["_extra_state"], "lo": 1}
    with pytest.raises(ValueError, match="reshard"):
        other.load_state_dict(sd)
    with pytest.raises(ValueError, match="targets"):
        table.attend(torch.zeros(2, D), None, torch.tensor([0, N]))


def test_bytes_per_step_formula():
    M, d, W8 = 18432, 256, 8
    full = bytes_per_step(M, d, None, W8)
    assert full["bytes_per_mention"] == 16 * d + 36  # 4d+4 queries, 2(d+4)4 partials/grads, 4d query grads
    assert full["total"] == 7 * M * (16 * d + 36) + 16 * 8 * 7
    assert full["per_worker"] == full["total"] / 8
    topk = bytes_per_step(M, d, 100, W8, num_entities=1_000_000)
    assert topk["bytes_per_mention"] == 16 * d + 36 + 100 * 4 + 4
    assert topk["replicated_allreduce_per_worker"] == 2 * 7 / 8 * 1_000_000 * d * 4
    # k >= N is the full softmax; k above a shard's rows is capped at ceil(N / W).
    assert bytes_per_step(10, 4, 50, 2, num_entities=50)["messages"] == bytes_per_step(10, 4, None, 2)["messages"]
    assert bytes_per_step(10, 4, 30, 2, num_entities=50)["messages"]["candidates"] == 1 * 10 * 25 * 4
    link_only = bytes_per_step(M, d, 100, W8, retrieve=False)
    assert link_only["bytes_per_mention"] == 8 * d + 36
    bf16 = bytes_per_step(M, d, None, W8, dtype_bytes=2)
    assert bf16["bytes_per_mention"] == 2 * d + 4 + 2 * (d + 4) * 4 + 4 * d
    assert bytes_per_step(M, d, None, 1)["total"] == 0


@pytest.mark.parametrize("entity_pred", [True, False])
def test_table_call_sizes_are_the_calls_a_training_forward_makes(entity_pred):
    """EaEModel.table_call_sizes, which the training loop exchanges ahead of each step, lists
    the forward's table calls exactly: expected counts for them are all consumed, and any
    other list fails."""
    from eae_model.config import load_config
    from eae_model.mentions import Mentions
    from eae_model.model import EaEModel, TargetIndices

    config = load_config("tiny", overrides=[f"num_entities={N}", f"use_entity_pred={str(entity_pred).lower()}"])
    table = ShardedEntityTable(N, config.entity_dim)
    model = EaEModel(config, entity_table=table)
    input_ids = torch.randint(5, config.vocab_size, (2, 12))
    # 4 mentions, 2 of them linked
    mentions = Mentions.from_lists([[(1, 2), (5, 5)], [(3, 4), (8, 9)]], [[3, -1], [-1, 7]])
    labels = torch.full_like(input_ids, -100)
    labels[0, 1] = input_ids[0, 1]
    indices = TargetIndices.of(labels, mentions)
    sizes = model.table_call_sizes(mentions, indices)
    assert sizes == ([4, 2] if entity_pred else [4])
    run = lambda: model(input_ids, mentions=mentions, mlm_labels=labels, indices=indices)  # noqa: E731
    reference = run().loss
    table.expect([[c] for c in sizes])
    assert torch.equal(run().loss, reference)
    table.expect([[c] for c in sizes])  # accepted: the previous step's were all consumed
    run()
    table.expect([[c] for c in sizes + [4]])
    run()
    with pytest.raises(RuntimeError, match="1 expected table call"):
        table.expect([[4]])
    # The spans without entity ids (the evaluations): the memory's call alone; EntityPred,
    # with no loss to compute, calls nothing (its predictions are top_k's)
    table._expected.clear()
    spans = mentions.spans()
    assert model.table_call_sizes(spans, indices) == [4]
    table.expect([[4]])
    out = model(input_ids, mentions=spans, mlm_labels=labels, indices=indices)
    table.expect([[4]])  # accepted: the forward made exactly the one call
    assert set(out.losses) == {"mention", "mlm"}  # no linking loss


def test_a_call_that_asks_for_nothing_computes_and_exchanges_nothing():
    """retrieve=False without targets (EntityPred given spans without ids) returns at once, on
    every worker alike: no count is taken from `expect` and none is exchanged."""
    table = ShardedEntityTable(N, D)
    table.expect([[3]])
    out = table.attend(torch.randn(3, D), None, None, retrieve=False)
    assert out.retrieved is None and out.lse is None and out.gold is None and out.loss is None
    with pytest.raises(RuntimeError, match="1 expected table call"):  # still waiting for its call
        table.expect([[3]])
    assert table.attend(torch.randn(3, D), None, None, retrieve=True).retrieved.shape == (3, D)
