"""Averaging the replicated gradients over the workers while the backward still runs.

The replicated weights (transformer, heads, projections; ~110M parameters at the paper's
size, 440 MB of float32 gradients) must have the same averaged gradient on every worker
before the optimizer step. All-reduced in one piece after the backward, that exchange sat on
the critical path of every step (~3.5 ms on two NVLink H100s). As DDP does, `GradientSync`
cuts the parameters into buckets and all-reduces each bucket, asynchronously, as soon as the
backward has produced all of its gradients, so the exchange of the upper layers runs while
the backward goes on through the lower ones. The entity table's rows are not here: each
worker owns its rows and already holds their complete gradient.

Why not DDP itself: `averaged(..., "ddp")` (train.grad_sync=ddp) runs torch's
DistributedDataParallel with the table left out, and on two H200s the full job's step took
78.2 ms with it against 67.4 ms with `GradientSync` (docs/performance.md, section 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from eae_platform.pretrain.profiling import SpanTimer, span


class _Bucket:
    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        # One persistent buffer per bucket; after a step each parameter's .grad is a view
        # into it (as DDP's gradient_as_bucket_view): the averages need no copy back.
        self.flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.views = [v.view_as(p) for v, p in zip(self.flat.split([p.numel() for p in params]), params)]
        self.ready = 0  # gradients produced this step
        self.work = None  # the launched all-reduce

    @property
    def full(self) -> bool:
        return self.ready == len(self.params)


class GradientSync:
    """Buckets of ~`bucket_mb` MiB of the parameters' gradients, all-reduced (averaged) as
    each one fills during the backward; `wait()` after the backward finishes the step's
    exchange. Each `.grad` is then a view of its bucket, holding the average: zero the
    gradients with `set_to_none=True` (autograd's new gradient is copied into the bucket) or in
    place (autograd accumulates into the view itself); both work.

    Buckets follow the parameters in reverse (the backward reaches the heads and upper layers
    first) and are launched in that order on every worker: NCCL needs the same sequence of
    collectives everywhere, so a full bucket waits for the ones before it. They go on a
    process group of their own, so that their order never interleaves with the sharded
    table's collectives of the same backward. A parameter without a gradient this step (an
    unused head) is all-reduced as zeros: every worker sends the same sizes whatever its batch
    held. With one worker, or no process group, nothing is registered and `wait()` does nothing.
    """

    def __init__(self, params: list[torch.nn.Parameter], bucket_mb: float = 25.0, names: dict | None = None):
        """params: the replicated parameters (frozen ones are left out); names: parameter ->
        name, for the first step's notice of buckets held back to the end of the backward."""
        params = [p for p in params if p.requires_grad]
        self._names = names or {}
        self._told = False
        self.buckets: list[_Bucket] = []
        self._next = 0  # the first bucket not launched yet this step
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if self.world == 1 or not params:
            return
        self.group = dist.new_group()  # collective: every worker builds its GradientSync
        # NCCL averages inside the all-reduce; gloo only sums (and is divided before)
        self._average = "nccl" in str(dist.get_backend(self.group)) and params[0].is_cuda
        limit = bucket_mb * 2**20
        current, size = [], 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > limit or p.dtype != current[0].dtype or p.device != current[0].device):
                self.buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        self.buckets.append(_Bucket(current))
        for bucket in self.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(lambda _, bucket=bucket: self._produced(bucket))

    def _produced(self, bucket: _Bucket) -> None:
        """Autograd hook of each of the bucket's parameters: its .grad is final for this
        backward (one call per parameter, after every use of it has been summed)."""
        bucket.ready += 1
        while self._next < len(self.buckets) and self.buckets[self._next].full:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        # One copy into the bucket (a single foreach kernel), then the views replace the
        # gradients autograd made; a parameter without one sends zeros.
        pairs = [(v, p.grad) for v, p in zip(bucket.views, bucket.params) if p.grad is not None and p.grad is not v]
        if pairs:
            torch._foreach_copy_([v for v, _ in pairs], [g for _, g in pairs])
        for v, p in zip(bucket.views, bucket.params):
            if p.grad is None:
                v.zero_()
            p.grad = v
        if not self._average:
            bucket.flat.div_(self.world)
        op = dist.ReduceOp.AVG if self._average else dist.ReduceOp.SUM
        bucket.work = dist.all_reduce(bucket.flat, op=op, group=self.group, async_op=True)

    def wait(self, timer: SpanTimer | None = None) -> None:
        """After the backward: launch the buckets still waiting (some gradient missing) and
        wait for every all-reduce (the GPU's stream waits, not the host). Each `.grad` is then
        a view of its bucket, holding the average. Resets the buckets for the next step.
        timer: times this wait as "grad_sync_wait" (the all-reduces left after the backward)."""
        held = self.buckets[self._next :]
        if held and not self._told:
            self._told = True
            missing = [self._names.get(p, tuple(p.shape)) for b in held for p in b.params if p.grad is None]
            print(f"gradient sync: {len(held)} of {len(self.buckets)} buckets waited for the end of the "
                  f"backward; parameters without a gradient: {missing[:8]}", flush=True)
        with span(timer, "grad_sync_wait"):
            for bucket in held:
                self._launch(bucket)
            for bucket in self.buckets:
                bucket.work.wait()
                bucket.ready, bucket.work = 0, None
        self._next = 0


def averaged(model: torch.nn.Module, replicated: dict[str, torch.nn.Parameter], table: dict[str, torch.nn.Parameter],
             how: str = "buckets") -> tuple[torch.nn.Module, GradientSync]:
    """(the module to run the forward through, the sync whose `wait()` ends each step's average)
    for train.grad_sync `how`: "buckets" runs `model` itself with a `GradientSync` over
    `replicated` (name -> parameter); "ddp" wraps it in torch's DistributedDataParallel with the
    `table` parameters left out (each worker's rows differ in shape and content: DDP must neither
    broadcast nor average them), whose reducer has finished the average when the backward
    returns, so the sync returned does nothing. With one worker both run `model` as it is."""
    if how == "ddp" and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel

        # the one hook DDP offers for parameters it must not touch (sharded_table.py's docstring)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(table))
        # its own process group, as GradientSync's: the table's collectives of the same backward
        # never interleave with the gradients' all-reduces. device_ids=None: the inputs stay
        # where the loop put them. find_unused_parameters: a head without a loss in a step (a
        # batch without mentions) leaves parameters without a gradient, which DDP must be told.
        ddp = DistributedDataParallel(model, device_ids=None, process_group=dist.new_group(), bucket_cap_mb=25,
                                      gradient_as_bucket_view=True, find_unused_parameters=True)
        return ddp, GradientSync([])
    return model, GradientSync(list(replicated.values()), names={p: n for n, p in replicated.items()})
