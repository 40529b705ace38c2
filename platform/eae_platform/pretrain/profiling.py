"""`train.profile_steps`: torch.profiler over a few training steps of every worker, to see
where a step's time goes in the real job (data, collectives, host syncs and all).

Writes `profile-rank<r>.txt` beside the run's example traces: the step's wall time, the GPU
kernels' summed time and their busy time (on a GPU: the union of kernel intervals over all
streams; the rest of the wall time is the GPU waiting for the host or for another worker,
with the longest of those gaps), every NCCL kernel in order with its duration (with several
workers), and the top operators by device and by host time.

Always on, for the job's reports: `SpanTimer` (with several workers, the time a step spends in
the sharded table's exchanges and waiting for the gradients' all-reduces: `exchange_s`,
`grad_sync_wait_s`), `GcTimer` (in Python's garbage collections: `gc_s`) and, on GPUs, `GpuLag`
(how far the GPU runs behind the host: `gpu_lag_s`)."""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch


def gpu_spans(prof) -> list[tuple[float, float, str]]:
    """(start, end, name) of a finished torch.profiler run's GPU kernels and copies (all streams)."""
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start]


def gpu_busy(prof) -> tuple[float, list[tuple[float, str, str]]]:
    """`busy_time` of a finished torch.profiler run's GPU kernels and copies (all streams)."""
    return busy_time(gpu_spans(prof))


def collective_timeline(spans: list[tuple[float, float, str]], limit: int = 200) -> list[str]:
    """The NCCL kernels among spans, in the order they started: start (ms after the first
    span), duration (ms) and name. A collective's kernel runs from when its stream reaches it
    until every worker has joined and the data has moved, so on a fast link a long one is
    mostly this worker waiting for another: which of a step's exchanges wait, and how long,
    says where the workers drift apart."""
    if not spans:
        return []
    t0 = min(start for start, _, _ in spans)
    nccl = sorted(span for span in spans if span[2].startswith(("ncclDevKernel", "ncclKernel")))
    return [f"  {(start - t0) / 1e3:9.3f} {(end - start) / 1e3:7.3f}  {name[:70]}" for start, end, name in nccl[:limit]]


def busy_time(spans: list[tuple[float, float, str]]) -> tuple[float, list[tuple[float, str, str]]]:
    """spans: (start, end, name) intervals, e.g. kernels on several streams -> the length of
    their union (summed kernel time counts overlapping streams twice) and the idle gaps between
    them as (length, the interval reaching furthest before it, the one after it), longest first."""
    spans = sorted(spans)
    busy, gaps, reach, before = 0.0, [], None, ""
    for begin, finish, name in spans:
        if reach is None or begin > reach:
            if reach is not None:
                gaps.append((begin - reach, before, name))
            busy += finish - begin
            reach = finish
        elif finish > reach:
            busy += finish - reach
            reach = finish
        if finish >= reach:
            before = name
    gaps.sort(key=lambda g: -g[0])
    return busy, gaps


class StepProfiler:
    """Call `before(step)` before a step's batch is fetched and `after(step)` after its
    optimizer step (step: the 1-based number of that step)."""

    def __init__(self, steps: tuple[int, int] | None, out: Path, device: torch.device):
        self.steps, self.out, self.device = steps, out, device
        self.profile = None
        self.start = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before(self, step: int) -> None:
        if self.steps is None or step != self.steps[0] or self.profile is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._sync()
        self.profile = profile(activities=activities)
        self.profile.__enter__()
        self.start = time.perf_counter()

    def after(self, step: int) -> None:
        if self.profile is None or step != self.steps[1]:
            return
        self._sync()
        wall = time.perf_counter() - self.start
        self.profile.__exit__(None, None, None)
        events = self.profile.key_averages()
        n = self.steps[1] - self.steps[0] + 1
        kernels = sum(e.self_device_time_total for e in events) / 1e3  # ms; kernels and copies
        lines = [f"steps {self.steps[0]}-{self.steps[1]}: wall {wall * 1e3 / n:.1f} ms/step, "
                 f"GPU kernels {kernels / n:.1f} ms/step ({100 * kernels / 1e3 / wall:.0f}% of wall)"]
        if self.device.type == "cuda":
            spans = gpu_spans(self.profile)
            busy, gaps = busy_time(spans)
            lines[0] += f", GPU busy {busy / 1e3 / n:.1f} ms/step (idle {wall * 1e3 / n - busy / 1e3 / n:.1f})"
            lines += ["", "longest idle gaps (ms, after -> before):"]
            lines += [f"  {g / 1e3:7.3f}  {a[:60]} -> {b[:60]}" for g, a, b in gaps[:15]]
            timeline = collective_timeline(spans)
            if timeline:
                lines += ["", "collectives in order (start ms, duration ms, kernel):", *timeline]
            lines += ["", "by device time:", events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70)]
        lines += ["", "by host time:", events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)]
        self.out.write_text("\n".join(lines) + "\n")
        print(f"profile: {lines[0]} -> {self.out}", flush=True)
        self.profile = None


class GcTimer:
    """Seconds this process spends in Python's garbage collections, in any of its threads (the
    step's, the prefetch threads', Ray Data's): the job's `gc_s` metric. A full collection walks
    every object the process tracks (~170 ms for the ~340k that importing torch, Ray and MLflow
    leaves, on the 2-core CI machine) and stops the step's kernel launches; on several GPUs
    the other workers would wait for it at the next collective. Measured on two H100s: 3.1 s in
    the first 10 steps (torch.compile's garbage), < 0.5 ms a step after (docs/performance.md)."""

    def __init__(self):
        self.seconds = 0.0
        self._started: float | None = None
        gc.callbacks.append(self._time)

    def _time(self, phase: str, info: dict) -> None:
        # called by the collecting thread, which holds the interpreter lock: one at a time
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        """Seconds spent collecting since the last take()."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def close(self) -> None:
        if self._time in gc.callbacks:
            gc.callbacks.remove(self._time)


class SpanTimer:
    """Time a step spends in named spans (the sharded table's exchanges, the wait for the
    gradients' all-reduces), measured where the step's work runs and without the profiler's
    cost: on a GPU two CUDA events on the current stream per span, so a span's time is the
    stream's, from reaching the collective to its end (the transfer and the wait for the other
    workers to join, which the profiler's host overhead inflates); on a CPU the host's clock
    (gloo's collectives block the host). `take()` reads them: on a GPU it waits for the stream
    to pass the last span, so call it where the host waits for the GPU anyway."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)  # spans since the last take()

    @contextmanager
    def span(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            begin = time.perf_counter()
            yield
            self._seconds[name] += time.perf_counter() - begin
        self.counts[name] += 1

    def take(self) -> dict[str, float]:
        """Seconds per span name since the last take()."""
        if self._events:
            self._events[-1][2].synchronize()
            for name, start, end in self._events:
                self._seconds[name] += start.elapsed_time(end) / 1e3
        out = dict(self._seconds)
        self._events.clear()
        self._seconds.clear()
        self.counts.clear()
        return out


class GpuLag:
    """How far the GPU runs behind the host: per step, the seconds from the host finishing the
    step's launches (`mark()`) to the GPU finishing the step, averaged over the steps since
    the last `take()` (the job's `gpu_lag_s`). About a step or more: the host is ahead, its
    pauses (a collection, another thread holding the interpreter) are absorbed by the queued
    work. Near the last kernels' own duration: the GPU waits for the host (a host-bound step;
    with several GPUs a late host also holds the others at the next collective). One CUDA
    event per step; `take()` waits for the last one, as SpanTimer.take does. On CPUs: None."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[float, torch.cuda.Event]] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((time.perf_counter(), event))

    def take(self) -> float | None:
        if not self._marks:
            return None
        last = self._marks[-1][1]
        last.synchronize()
        done = time.perf_counter()  # the GPU reached the last mark at most this late
        lags = gpu_lags([h for h, _ in self._marks], [e.elapsed_time(last) / 1e3 for _, e in self._marks], done)
        self._marks.clear()
        return sum(lags) / len(lags)


def gpu_lags(marked: list[float], before_last: list[float], done: float) -> list[float]:
    """Host clock times at which steps' launches ended, the GPU's time from each step's end to
    the last one's (CUDA events), and the host time the last one ended on the GPU -> each step's
    lag: when the GPU finished it (done - before_last) minus when the host had launched it."""
    return [done - gap - host for host, gap in zip(marked, before_last)]


def span(timer: SpanTimer | None, name: str):
    """timer.span(name), or nothing without a timer."""
    return timer.span(name) if timer is not None else nullcontext()
