"""pretrain/stall.py: a loop that stops taking steps gets every thread's stack in its log (the
user's, through `say`, and the worker's stderr), naming the call it waits in; a loop that keeps
stepping gets nothing. Real threads and a real clock, at a short `after_s`."""

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eae_platform.pretrain.config import TrainConfig
from eae_platform.pretrain.stall import StallWatch

REPO = Path(__file__).resolve().parents[2]


def wait_in_the_relay(release: threading.Event) -> None:
    """Stands for the call a stalled loop waits in."""
    release.wait(5)


def test_a_stalled_loop_says_where_it_waits_and_a_stepping_one_says_nothing():
    lines = []
    with StallWatch(0.4, lines.append) as watch:
        for step in range(1, 9):  # 0.8 s of steps 0.1 s apart: never 0.4 s without one
            time.sleep(0.1)
            watch.beat(step)
        assert lines == []
        release = threading.Event()
        stalled = threading.Thread(target=wait_in_the_relay, args=(release,))
        stalled.start()
        time.sleep(1.3)  # a stall of ~3 after_s: reported once every after_s, not at every poll
        release.set()
        stalled.join()
    assert 2 <= len(lines) <= 3, lines
    assert "no step has finished for" in lines[0] and "after step 8" in lines[0]
    assert "wait_in_the_relay" in lines[0]  # the waiting thread's stack, by function name
    count = len(lines)
    time.sleep(0.6)  # the watch ended with its `with`: no report after it
    assert len(lines) == count


def test_the_faulthandler_dump_reaches_the_process_stderr():
    """A Ray worker's stderr is its log file: the dump is written there without the GIL."""
    code = textwrap.dedent("""
        import time
        from eae_platform.pretrain.stall import StallWatch
        with StallWatch(0.3, lambda line: None) as watch:
            watch.beat(41)
            time.sleep(1.0)
    """)
    env_path = f"{REPO}:{REPO / 'platform'}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "after step 41" in done.stderr
    assert "Thread 0x" in done.stderr or "Current thread 0x" in done.stderr  # faulthandler's format


def test_off_and_bad_settings():
    lines = []
    with StallWatch(None, lines.append) as watch:  # off: no thread at all
        assert watch._thread is None
        time.sleep(0.1)
    assert lines == []
    with pytest.raises(ValueError, match="stall_report_s must be positive or null"):
        TrainConfig(stall_report_s=0)
