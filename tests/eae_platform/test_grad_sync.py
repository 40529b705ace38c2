"""GradientSync: the replicated gradients averaged over two real workers (spawned processes,
gloo), in buckets launched while the backward runs, equal to the average of each worker's own
gradients computed in one process; `averaged`, the loop's choice between it and DDP
(train.grad_sync), leaves each worker's table rows alone in both."""

from __future__ import annotations

import functools

import pytest
import torch

from eae_platform.pretrain.grad_sync import GradientSync, averaged
from eae_platform.pretrain.profiling import SpanTimer
from tests.eae_platform.gloo_workers import run_workers


class _Net(torch.nn.Module):
    """Four layers, one parameter the backward never reaches, one used only on some batches."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        # Registered first, so in the last bucket (buckets take the parameters in reverse):
        # the buckets before it are complete during the backward.
        self.unused = torch.nn.Parameter(torch.randn(3))
        self.sometimes = torch.nn.Parameter(torch.randn(8))
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.layers[0].weight.requires_grad_(False)  # frozen: never synchronised

    def forward(self, x: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        if use_sometimes:
            x = x * self.sometimes
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return (x**2).sum()


STEPS = 3


def _batch(rank: int, step: int) -> tuple[torch.Tensor, bool]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(5, 8, generator=g), rank == 1  # `sometimes` gets a gradient on rank 1 only


def _grads_of(net: _Net) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()}


def _two_steps(rank: int, world: int) -> list:
    net = _Net()
    # 300-byte buckets: one Linear each (256 + 32 bytes), the last one with layers.0.bias,
    # `sometimes` and `unused`
    sync = GradientSync(list(net.parameters()), bucket_mb=300 / 2**20)
    timer = SpanTimer(torch.device("cpu"))
    results = []
    # the second step checks that the buckets reset; the third zeroes the gradients in place
    # (they are the buckets' views by then), so autograd accumulates into the buckets
    for step in range(STEPS):
        net.zero_grad(set_to_none=step < 2)
        x, use = _batch(rank, step)
        net(x, use).backward()
        launched = sum(b.work is not None for b in sync.buckets)  # during the backward
        sync.wait(timer)
        waits = timer.counts["grad_sync_wait"]
        waited = (waits, timer.take().get("grad_sync_wait", 0.0))
        grads = {n: None if g is None else g.numpy() for n, g in _grads_of(net).items()}
        as_views = all(p.grad is v for b in sync.buckets for p, v in zip(b.params, b.views))
        results.append((launched, len(sync.buckets), grads, as_views, waited))
    return results


def test_buckets_average_over_workers_and_start_during_the_backward(tmp_path):
    got = run_workers(_two_steps, 2, tmp_path)
    for step in range(STEPS):
        expected = {}
        for rank in range(2):  # each worker's own gradients, in this process
            net = _Net()
            x, use = _batch(rank, step)
            net(x, use).backward()
            for name, g in _grads_of(net).items():
                expected.setdefault(name, []).append(g)
        for rank in range(2):
            launched, buckets, grads, as_views, (waits, seconds) = got[rank][step]
            assert buckets == 4
            assert waits == 1 and seconds > 0  # the wait is timed (SpanTimer), once a step
            assert as_views  # the averages are in the buckets: no copy back into .grad
            # every bucket went out before wait() but the last, which holds `unused` (zeros,
            # sent by wait)
            assert launched == buckets - 1, (rank, step, launched, buckets)
            assert grads["layers.0.weight"] is None  # frozen
            grads = {n: None if g is None else torch.from_numpy(g) for n, g in grads.items()}
            torch.testing.assert_close(grads["unused"], torch.zeros(3))
            for name, per_rank in expected.items():
                if name in ("layers.0.weight", "unused"):
                    continue
                want = sum(g if g is not None else torch.zeros_like(per_rank[1]) for g in per_rank) / 2
                torch.testing.assert_close(grads[name], want, rtol=1e-6, atol=1e-7)


def test_one_worker_registers_nothing():
    net = _Net()
    sync = GradientSync(list(net.parameters()))
    x, use = _batch(0, 0)
    net(x, use).backward()
    want = _grads_of(net)
    sync.wait()
    assert sync.buckets == []
    for name, g in _grads_of(net).items():
        assert (g is None) == (want[name] is None)
        if g is not None:
            torch.testing.assert_close(g, want[name], rtol=0, atol=0)


class _WithTable(_Net):
    """_Net beside rows of its own, as a worker's shard of the entity table: rank r holds 2 + r
    rows (DDP must neither broadcast them nor average their gradient)."""

    def __init__(self, rank: int):
        super().__init__()
        self.entity_table = torch.nn.Module()  # named as the model's: entity_table.weight
        self.entity_table.weight = torch.nn.Parameter(torch.full((2 + rank, 8), float(rank + 1)))

    def forward(self, x: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        return super().forward(x, use_sometimes) + (self.entity_table.weight.sum(0) * x).sum()


def _steps_through(how: str, rank: int, world: int) -> tuple:
    net = _WithTable(rank)
    names = dict(net.named_parameters())
    table = {"entity_table.weight": names.pop("entity_table.weight")}
    forward, sync = averaged(net, names, table, how)
    results = []
    for step in range(STEPS):
        net.zero_grad(set_to_none=True)
        x, use = _batch(rank, step)
        forward(x, use).backward()
        sync.wait()
        results.append({n: None if g is None else g.numpy() for n, g in _grads_of(net).items()})
    return results, type(forward).__name__, net.entity_table.weight.detach().numpy()


@pytest.mark.parametrize("how", ["buckets", "ddp"])
def test_both_syncs_average_the_replicated_gradients_and_leave_the_table_s_rows_alone(tmp_path, how):
    got = run_workers(functools.partial(_steps_through, how), 2, tmp_path)
    for rank in range(2):
        steps, wrapper, rows = got[rank]
        assert wrapper == ("DistributedDataParallel" if how == "ddp" else "_WithTable")
        torch.testing.assert_close(torch.from_numpy(rows), torch.full((2 + rank, 8), float(rank + 1)))  # not broadcast
        for step in range(STEPS):
            own, per_rank = {}, []
            for r in range(2):  # each worker's own gradients, in this process
                net = _WithTable(r)
                x, use = _batch(r, step)
                net(x, use).backward()
                per_rank.append(_grads_of(net))
            grads = {n: None if g is None else torch.from_numpy(g) for n, g in steps[step].items()}
            # the worker's own rows get its own gradient, not an average
            torch.testing.assert_close(grads["entity_table.weight"], per_rank[rank]["entity_table.weight"], rtol=1e-6, atol=1e-6)
            for name in per_rank[1]:
                if name in ("layers.0.weight", "unused", "entity_table.weight"):
                    continue
                want = sum(g[name] if g[name] is not None else torch.zeros_like(per_rank[1][name]) for g in per_rank) / 2
                torch.testing.assert_close(grads[name], want, rtol=1e-6, atol=1e-7)
