"""A stopped `eae finetune` / `eae eval` ends in bounded time (cli._cancel, progress.relay):
the task's cancel is sent again when the task did not stop (Ray's cancel is one
KeyboardInterrupt, which Python drops where it meets a finalizer), and the driver's progress
relay stops printing once its block has ended even while a task keeps sending lines."""

import signal
import threading
import time

from eae_platform import progress
from eae_platform.cli import _cancel


def test_a_cancel_the_task_lost_is_sent_again(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def loses_its_first_interrupt():
        """Trains on through the first KeyboardInterrupt (as one raised in a finalizer is lost),
        stops at the next; 'finished' if no second one comes within 60 s."""
        lost = []

        def on_interrupt(signum, frame):
            if not lost:
                lost.append(time.monotonic())
                return
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_interrupt)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
            return "finished"
        finally:
            signal.signal(signal.SIGINT, previous)  # the worker process is reused

    ref = loses_its_first_interrupt.remote()
    time.sleep(3)  # running: a worker took it
    started = time.monotonic()
    assert _cancel(ray, ref, wait_s=30, every_s=1)
    assert time.monotonic() - started < 15
    try:
        ray.get(ref)
        raise AssertionError("the task finished instead of being cancelled")
    except (ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError):
        pass


def test_the_relay_ends_while_a_task_still_sends_lines(ray_cluster, monkeypatch, capsys):
    monkeypatch.setattr(progress, "DRAIN_S", 1.0)
    stop, sent = threading.Event(), []

    def chatty(channel):  # a task that outlives the block: never cancelled
        try:
            while not stop.is_set():
                channel.put(f"line {len(sent)}")
                sent.append(1)
        except Exception:  # noqa: BLE001 - the queue's actor is gone once the relay ended
            pass

    ended = threading.Event()

    def command():
        with progress.relay() as channel:
            threading.Thread(target=chatty, args=(channel,), daemon=True).start()
            time.sleep(1)
        ended.set()

    threading.Thread(target=command, daemon=True).start()
    try:
        assert ended.wait(timeout=30), "the relay never ended"
    finally:
        stop.set()
    assert "line 0" in capsys.readouterr().out  # what came before the end was printed
