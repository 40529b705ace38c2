"""What a command prints while it runs.

At the default verbosity a command's driver does not stream the output of its Ray workers
(`ray_session.connect`: `ray.init(log_to_driver=False)`): every rank's prints, Ray Train's
reports, Ray Data's execution plans and Ray's own warnings stay in the session's log files,
whose directory the command names once. The lines meant for the user (one per logging window,
from rank 0 of a pretraining or from the task that fine-tunes or evaluates) come to the driver
through an actor (`relay`) and are printed there once. `--verbose` (EAE_VERBOSE=1) streams
everything, as Ray does by default. A pretraining's line, of a log window or of a dev
evaluation, is `progress_line`'s, from the metrics it logs.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

VERBOSE_ENV = "EAE_VERBOSE"

_channel = None  # this process's relay channel, set by `attach`
# the most `relay` waits for its last lines once its block has ended (a take's 60 s timeout and more)
DRAIN_S = 70.0


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


class Channel:
    """The actor behind `relay`: the lines a task or rank 0 says (`put`), which the driver takes
    and prints, and the driver's stop (`stop`), which a task watches (task_stop.watching). One
    actor for both: an actor is a process of its own, ~0.5 s to start (2 idle cores)."""

    def __init__(self):
        self.lines: list[tuple[str, bool]] = []  # (line, for stderr)
        self.stopped = False

    def put(self, line: str, err: bool = False) -> None:
        self.lines.append((line, err))

    def take(self) -> list[tuple[str, bool]]:
        lines, self.lines = self.lines, []
        return lines

    def stop(self) -> None:
        self.stopped = True

    def is_stopped(self) -> bool:
        return self.stopped


@contextmanager
def relay(poll_s: float = 0.2):
    """A `Channel` whose lines (`say` in a process that `attach`ed it) the driver prints as they
    come, until the block ends; then the rest, and the channel's actor stops."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # No CPU held that training or Ray Data needs; on the driver's node, which the run cannot
    # outlive: anywhere else, a node lost mid-run (a worker's, which Ray Train replaces) took the
    # channel with it, and the next line a worker said failed the run (test_multinode.py).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    channel = ray.remote(num_cpus=0)(Channel).options(scheduling_strategy=here).remote()
    done = threading.Event()

    def pump():
        while True:
            last = done.is_set()  # every line was put before the block ended (put waits)
            try:
                lines = ray.get(channel.take.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - the actor is gone (killed below, or its node died)
                return
            for line, err in lines:
                print(line, file=sys.stderr if err else sys.stdout, flush=True)
            if last:  # one take after the end: a task that outlives the block cannot hold it open
                return
            if not lines:
                done.wait(poll_s)

    thread = threading.Thread(target=pump, name="eae-progress", daemon=True)
    thread.start()
    try:
        yield channel
    finally:
        done.set()
        thread.join(timeout=DRAIN_S)
        ray.kill(channel)


def attach(channel) -> None:
    """Send this process's `say` lines to `channel` (a `relay`'s; None: print them)."""
    global _channel
    _channel = channel


def say(line: str, err: bool = False) -> None:
    """Show `line` to the user: through the driver's relay when attached, else here; on stdout,
    or with `err` on stderr (a warning)."""
    if _channel is not None:
        import ray

        ray.get(_channel.put.remote(line, err))
    else:
        print(line, file=sys.stderr if err else sys.stdout, flush=True)


def relayed() -> bool:
    """Whether this process's `say` lines go through a relay that the driver alone shows: its
    other output then stays in Ray's logs (not --verbose), where a warning would go unseen."""
    return _channel is not None and not verbose()


def progress_line(step: int, metrics: dict[str, float]) -> str:
    """The line a pretraining shows for `step`: its log window's metrics (the names logged as
    train/<name>: loss, loss_<head>, tokens_per_s, ...), each piece there when its metrics are,
    e.g. `step 8: loss 25.183 mention 1.009 mlm 10.355 | 2,997 tokens/s, 0.543 s/step (waiting
    for data 0.000, in gc 0.000) | exchanges 73.3 ms, all-reduce wait 153.4 ms`; or the dev
    split's (dev/<name>) `step 8 dev: dev/token_accuracy 0.5, dev/perplexity 2.958e+04`; with
    both, the two lines."""
    lines = []
    if "loss" in metrics:
        lines.append(f"step {step}: " + " | ".join(_window_pieces(metrics)))
    dev = {k: v for k, v in metrics.items() if k.startswith("dev/")}
    if dev:
        lines.append(f"step {step} dev: " + ", ".join(f"{k} {v:.4g}" for k, v in dev.items()))
    return "\n".join(lines)


def _window_pieces(m: dict[str, float]) -> list[str]:
    """The pieces of a log window's line: the losses, then those of the throughput, the
    collectives (several workers), the GPU's lag and its peak memory (GPUs)."""
    losses = [f"loss {m['loss']:.3f}"] + [f"{k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("loss_")]
    pieces = [" ".join(losses)]
    if "tokens_per_s" in m:
        pieces.append(f"{m['tokens_per_s']:,.0f} tokens/s, {m['step_time_s']:.3f} s/step "
                      f"(waiting for data {m['data_wait_s']:.3f}, in gc {m['gc_s']:.3f})")
    if "exchange_s" in m:
        pieces.append(f"exchanges {m['exchange_s'] * 1e3:.1f} ms, all-reduce wait {m['grad_sync_wait_s'] * 1e3:.1f} ms")
    if "gpu_lag_s" in m:
        pieces.append(f"GPU lag {m['gpu_lag_s'] * 1e3:.1f} ms, launched in {m['launch_time_s']:.4f} s/step")
    if "peak_gpu_gib" in m:
        pieces.append(f"peak {m['peak_gpu_gib']:.1f} GiB")
    return pieces


def innermost(error: BaseException) -> BaseException:
    """What failed inside the exceptions Ray wraps it in: the lowest failed rank's exception
    (ray.train.WorkerGroupError), the controller's (ControllerError), a task's own (RayTaskError)."""
    while True:
        failures = getattr(error, "worker_failures", None)
        inner = (failures[min(failures)] if failures else getattr(error, "controller_failure", None)
                 or getattr(error, "cause", None))
        if not isinstance(inner, BaseException) or inner is error:
            return error
        error = inner


# What Ray's memory monitor writes, deep in the message of the error it leaves (a failed health
# check, a dead actor), when it killed workers: the one line that says why they died.
RAY_OOM_MARK = "running low on memory"


def root_cause(error: BaseException) -> str:
    """`Type: message` of what failed inside the exceptions Ray wraps it in (innermost); where
    Ray killed workers for memory, its line saying so as well (alone, "A worker health check
    failed." said nothing of why)."""
    error = innermost(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    oom = next((line for line in lines[1:] if RAY_OOM_MARK in line), None)
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ") + (f" ({oom})" if oom else "")


def save_traceback(error: BaseException) -> str:
    """The error's full traceback in a new file; returns its path."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="eae-error-", suffix=".txt", delete=False) as f:
        f.write("".join(traceback.format_exception(error)))
    return f.name
