"""A watchdog for a training loop that stops taking steps (train.stall_report_s).

Why: on a shared GPU machine a pretraining worker sometimes logged one window and then nothing
until its pause, minutes later (docs/results.md, round 19), and the step loop said nothing of
where it waited. A thread beside the loop notices when no step has finished for `after_s`
seconds and writes every thread's stack twice: with `faulthandler` to the worker's stderr
(Ray's worker log; needs no GIL, so it shows a loop stuck in C too) and as a progress line,
which reaches the user's log through the driver's relay (progress.say) unless the relay is
what blocks. It reports again every further `after_s` while the stall lasts. Its cost to the
loop: one clock read a step (`beat`).
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
import traceback
from typing import Callable


def thread_stacks() -> str:
    """Every Python thread's stack, innermost call last (as traceback prints it)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)


class StallWatch:
    """Use as `with StallWatch(after_s, say) as watch:` around the loop, `watch.beat(step)` after
    each step. `after_s`: None or 0 disables it."""

    def __init__(self, after_s: float | None, say: Callable[[str], None], clock=time.monotonic):
        self.after_s, self.say, self.clock = after_s, say, clock
        self.step, self.last = 0, clock()
        self._stop = threading.Event()
        self._thread = None

    def beat(self, step: int) -> None:
        self.step, self.last = step, self.clock()

    def __enter__(self) -> "StallWatch":
        if self.after_s:
            self.last = self.clock()
            self._thread = threading.Thread(target=self._watch, name="eae-stall-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        reported = None  # when it last reported: a stall reports once every after_s
        while not self._stop.wait(min(self.after_s / 4, 10.0)):
            now = self.clock()
            idle = now - self.last
            if idle < self.after_s or (reported is not None and now - reported < self.after_s):
                continue
            reported = now
            line = (f"no step has finished for {idle:.0f} s (train.stall_report_s={self.after_s:g}) "
                    f"after step {self.step}: every thread's stack")
            print(line, file=sys.stderr, flush=True)
            try:
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            except (OSError, ValueError, AttributeError):  # a stderr with no file descriptor (captured)
                pass
            self.say(f"{line} (also in Ray's worker log):\n{thread_stacks()}")
