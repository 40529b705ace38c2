"""A stopped `eae finetune` / `eae eval` stops its Ray task, and its driver ends in bounded time
(eae_platform.task_stop, progress.relay): the task's loop stops at a step once the driver says
stop on its progress channel, even where the process ignores SIGINT (which Ray's cancel relies
on); Ray's cancel is sent again when one is lost; the driver's relay prints the lines in order
and stops once its block has ended even while a task keeps sending lines."""

import signal
import threading
import time

from eae_platform import progress, task_stop


def _wait_for(path, timeout_s: float = 60) -> None:
    """Until the task has written `path`, once its SIGINT handler is in place: a cancel sent
    sooner finds it not yet running (a worker can take seconds to start on a busy machine; a
    run with two test processes on 2 cores: more than the 2 s this test once slept)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"the task never started: no {path}"
        time.sleep(0.1)


def test_a_task_stops_at_a_step_once_its_driver_says_stop_even_ignoring_sigint(ray_cluster, tmp_path):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def training(channel, started):
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ray's cancel cannot reach it
        try:
            started.touch()
            with task_stop.watching(channel, every_s=0.1):
                for step in range(1200):  # a minute of steps unless stopped
                    task_stop.check()
                    time.sleep(0.05)
            return f"trained {step + 1} steps"
        except KeyboardInterrupt:
            return "stopped"
        finally:
            signal.signal(signal.SIGINT, previous)  # the worker process is reused

    with progress.relay() as channel:
        ref = training.remote(channel, tmp_path / "started")
        _wait_for(tmp_path / "started")
        time.sleep(0.5)  # training
        ray.cancel(ref)  # lost: the task ignores SIGINT
        assert not ray.wait([ref], timeout=2)[0]
        channel.stop.remote()
        assert ray.get(ref, timeout=20) == "stopped"
    task_stop.check()  # this process was never told to stop


def test_a_cancel_the_task_lost_is_sent_again(ray_cluster, tmp_path):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    def loses_its_first_interrupt(started):
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
            started.touch()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
            return "finished"
        finally:
            signal.signal(signal.SIGINT, previous)  # the worker process is reused

    ref = loses_its_first_interrupt.remote(tmp_path / "started")
    _wait_for(tmp_path / "started")
    started = time.monotonic()
    assert task_stop.cancel(ray, ref, wait_s=30, every_s=1)
    assert time.monotonic() - started < 15
    try:
        ray.get(ref)
        raise AssertionError("the task finished instead of being cancelled")
    except (ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError):
        pass


def test_the_relay_prints_every_line_in_order_and_ends_while_a_task_still_sends_lines(ray_cluster, capsys):
    stop, sent = threading.Event(), []

    def chatty(channel):  # a task that outlives the block: never cancelled
        try:
            while not stop.is_set():
                ray_cluster.get(channel.put.remote(f"line {len(sent)}"))
                sent.append(1)
        except Exception:  # noqa: BLE001 - the channel's actor is gone once the relay ended
            pass

    # each phase bounded on its own, so that a failure says which one hung: the channel's actor
    # starts in a worker process of its own (seconds on a loaded 2-core machine: not what this
    # test bounds); the relay then ends within 30 s of its block's end, where with a task still
    # sending it ran on until the driver's DRAIN_S cut it off
    said, block_ended, ended = threading.Event(), threading.Event(), threading.Event()

    def command():
        with progress.relay() as channel:
            progress.attach(channel)
            try:
                for i in range(5):
                    progress.say(f"said {i}")
            finally:
                progress.attach(None)
            said.set()
            threading.Thread(target=chatty, args=(channel,), daemon=True).start()
            time.sleep(1)
            block_ended.set()
        ended.set()

    threading.Thread(target=command, daemon=True).start()
    try:
        assert said.wait(timeout=120), "the relay's channel never took a line"
        assert block_ended.wait(timeout=30), "the block never ended"
        assert ended.wait(timeout=30), "the relay never ended"
        assert sent, "the task sent no line"  # the relay ended while a task was sending lines
    finally:
        stop.set()
    out = capsys.readouterr().out.splitlines()
    assert out[:6] == [f"said {i}" for i in range(5)] + ["line 0"], out[:10]  # in order, before the end
