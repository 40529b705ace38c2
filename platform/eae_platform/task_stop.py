"""Stopping a command's Ray task at a clean point, and cancelling it where that fails.

`eae finetune` and `eae eval` run their work as one Ray task (cli._run_in_ray_task). When the
command is stopped (Ctrl-C; SIGTERM from `ray job stop` or a scheduler) the task must stop too,
and end its MLflow run KILLED. Ray's own cancel is a KeyboardInterrupt that a signal handler
raises in the task's process, and CI saw it lost again and again (a stopped fine-tuning went on
training for a minute through twelve cancels, in a full test session; never in 30 runs alone).
So the driver says stop on its progress channel (progress.relay, an actor), a thread in the
task copies that into the task's process (`watching`), and the task's loop calls `check()` at
each step: the KeyboardInterrupt comes from the loop itself. `cancel` (Ray's cancel, sent
again until the task ends, then forced) remains for loops that do not check.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

_stopped = threading.Event()  # set in a task's process once its driver said stop (`watching`)


def check() -> None:
    """Raise KeyboardInterrupt where the command running this task was stopped (`watching`)."""
    if _stopped.is_set():
        raise KeyboardInterrupt("the command was stopped")


@contextmanager
def watching(channel, every_s: float = 0.5):
    """In a task: while the block runs, a thread asks the driver's `channel` (progress.relay's)
    every `every_s` seconds whether the command was stopped and, once it was, makes `check()`
    raise. The process is reused for other tasks: cleared after."""
    import ray

    _stopped.clear()
    done = threading.Event()

    def watch():
        while not done.wait(every_s):
            try:
                if ray.get(channel.is_stopped.remote(), timeout=30):
                    _stopped.set()
                    return
            except Exception:  # noqa: BLE001 - the driver's channel is gone: nothing will stop it
                return

    thread = threading.Thread(target=watch, name="eae-stop", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        _stopped.clear()


def cancel(ray, ref, wait_s: float = 60.0, every_s: float = 5.0) -> bool:
    """Ray's cancel of the task of `ref`, sent again every `every_s` until the task ends (one
    KeyboardInterrupt can be lost), for up to `wait_s`; then a forced cancel (no cleanup in the
    task, but the driver can exit). True if the task ended before the force."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ray.cancel(ref)
        except Exception:  # noqa: BLE001 - the task ended meanwhile
            pass
        ready, _ = ray.wait([ref], timeout=max(0.0, min(every_s, deadline - time.monotonic())))
        if ready:
            return True
        if time.monotonic() >= deadline:
            print(f"eae: the task did not stop within {wait_s:.0f} s of its cancel: killing it", file=sys.stderr,
                  flush=True)
            try:
                ray.cancel(ref, force=True)
                ray.wait([ref], timeout=10)
            except Exception:  # noqa: BLE001 - best effort: relay's bounded drain ends the driver anyway
                pass
            return False
