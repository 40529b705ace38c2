"""Two pytest workers, and the modules that need the machine to themselves (a pytest plugin,
loaded by tests/conftest.py).

scripts/test runs two pytest-xdist workers (--dist loadfile): with one, the suite left one of
CI's 2 cores idle a fifth of the time. Tests that time a fault against Ray's or Serve's own
deadlines (a node killed, a replacement node's `ray start`) failed under the other worker's
load, so a module marked `pytest.mark.solo` runs alone: its worker takes an exclusive flock,
every other test a shared one, from the module's first test's setup to its last one's teardown
(its module fixtures included). The gate lock keeps a waiting solo module from being starved
by the other worker's next shared locks. Without xdist (`scripts/test -n 0`) nothing is locked."""

import fcntl
import os
from pathlib import Path

import pytest

_LOCKS: dict[str, int] = {}
SOLO = "solo: the module runs with no other test beside it (tests/solo.py)"


def pytest_configure(config):
    config.addinivalue_line("markers", SOLO)

_SOLO_HELD: list[bool] = [False]


def _lock(name: str, how: int) -> None:
    if name not in _LOCKS:  # one lock file per xdist run, shared by its workers
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"eae-pytest-{os.environ['PYTEST_XDIST_TESTRUNUID']}.{name}"
        _LOCKS[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(_LOCKS[name], how)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return (yield)
    solo = item.get_closest_marker("solo") is not None
    if solo and not _SOLO_HELD[0]:
        _lock("gate", fcntl.LOCK_EX)
        _lock("machine", fcntl.LOCK_EX)
        _SOLO_HELD[0] = True
    elif not solo:
        _lock("gate", fcntl.LOCK_SH)  # waits while a solo module waits or runs
        _lock("gate", fcntl.LOCK_UN)
        _lock("machine", fcntl.LOCK_SH)
    try:
        return (yield)
    finally:
        if not solo:
            _lock("machine", fcntl.LOCK_UN)
        elif nextitem is None or nextitem.module is not item.module:
            _lock("machine", fcntl.LOCK_UN)
            _lock("gate", fcntl.LOCK_UN)
            _SOLO_HELD[0] = False
