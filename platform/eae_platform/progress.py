"""What a command prints while it runs.

At the default verbosity a command's driver does not stream the output of its Ray workers
(`ray_session.connect`: `ray.init(log_to_driver=False)`): every rank's prints, Ray Train's
reports, Ray Data's execution plans and Ray's own warnings stay in the session's log files,
whose directory the command names once. The lines meant for the user (one per logging window,
from rank 0 of a pretraining or from the task that fine-tunes or evaluates) come to the driver
through a Ray queue (`relay`) and are printed there once. `--verbose` (EAE_VERBOSE=1) streams
everything, as Ray does by default.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

VERBOSE_ENV = "EAE_VERBOSE"

_channel = None  # this process's relay queue, set by `attach`


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


@contextmanager
def relay():
    """A queue whose lines (`say` in a process that `attach`ed it) the driver prints as they
    come, until the block ends; then the rest, and the queue's actor stops."""
    from queue import Empty

    from ray.util.queue import Queue

    queue = Queue(actor_options={"num_cpus": 0})  # holds no CPU that training or Ray Data needs
    done = threading.Event()

    def pump():
        while True:
            try:
                print(queue.get(timeout=0.5), flush=True)
            except Empty:
                if done.is_set():  # every line was put before the block ended (put waits)
                    return

    thread = threading.Thread(target=pump, name="eae-progress", daemon=True)
    thread.start()
    try:
        yield queue
    finally:
        done.set()
        thread.join()
        queue.shutdown()


def attach(channel) -> None:
    """Send this process's `say` lines to `channel` (a `relay` queue; None: print them)."""
    global _channel
    _channel = channel


def say(line: str) -> None:
    """Show `line` to the user: through the driver's relay when attached, else on stdout."""
    if _channel is not None:
        _channel.put(line)
    else:
        print(line, flush=True)


def root_cause(error: BaseException) -> str:
    """`Type: message` of what failed inside the exceptions Ray wraps it in: the lowest failed
    rank's exception (ray.train.WorkerGroupError), the controller's (ControllerError), a task's
    own (RayTaskError)."""
    while True:
        failures = getattr(error, "worker_failures", None)
        inner = (failures[min(failures)] if failures else getattr(error, "controller_failure", None)
                 or getattr(error, "cause", None))
        if not isinstance(inner, BaseException) or inner is error:
            break
        error = inner
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def save_traceback(error: BaseException) -> str:
    """The error's full traceback in a new file; returns its path."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="eae-error-", suffix=".txt", delete=False) as f:
        f.write("".join(traceback.format_exception(error)))
    return f.name
