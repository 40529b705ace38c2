"""When a run's checkpoint storage (train.storage_path/<name>) stops taking writes mid-run: a
full disk, a read-only remount, permissions taken away.

The workers write two things there: their example traces (a line per step) and, through
`ray.train.report`, their parts of each checkpoint (Ray Train copies them into a new
checkpoint_* folder and registers it only once every worker's copy succeeded, so a failed copy
leaves the last registered checkpoint as it was). A worker whose write is refused raises
`StorageUnwritable` (`writing`): what it was writing, the errno and the last step it trained.
The driver turns that into `CheckpointStorageError` (`explain`): one paragraph naming the
storage, the cause, the last good checkpoint and the steps lost since, and how to resume.
"""

from __future__ import annotations

import errno
import json
import os
from contextlib import contextmanager
import shutil
from pathlib import Path

# The errnos that say the storage refuses writes (as opposed to a bug or a missing file): a
# full disk or quota, a read-only filesystem, permissions (EPERM: some filesystems' EACCES).
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class StorageUnwritable(Exception):
    """A worker's write under the run's storage was refused. Its fields are its args, so that
    it crosses from the worker to the driver (pickled) whole."""

    def __init__(self, what: str, code: int, detail: str, step: int, rank: int):
        super().__init__(what, code, detail, step, rank)
        self.what, self.code, self.detail, self.step, self.rank = what, code, detail, step, rank

    def __str__(self) -> str:
        return f"rank {self.rank} could not write {self.what} at step {self.step}: {self.detail}"


class CheckpointStorageError(RuntimeError):
    """A run stopped because its checkpoint storage refused a write; the message says all."""


@contextmanager
def writing(what: str, step: int, rank: int):
    """Inside: a write of `what` by `rank`, which has trained `step` steps. An OSError that says
    the storage refuses writes (UNWRITABLE) leaves as StorageUnwritable; any other as it is."""
    try:
        yield
    except OSError as error:
        if error.errno not in UNWRITABLE:
            raise
        raise StorageUnwritable(what, error.errno, str(error), step, rank) from error


def append_record(path: Path, record: dict) -> None:
    """Append `record` to `path` as one JSON line, whole or not at all: a filling disk takes
    part of a write (a short write), and a partial line would run into the first record a
    relaunch appends, garbling the trace."""
    line = memoryview((json.dumps(record) + "\n").encode())
    with path.open("ab", buffering=0) as f:  # unbuffered: nothing is left to flush after an error
        end = f.seek(0, os.SEEK_END)
        try:
            while line:
                line = line[f.write(line):]  # after a short write, the next one raises ENOSPC
        except OSError:
            f.truncate(end)
            raise


def probe_write(directory: Path) -> None:
    """`directory` made (with its parents) and an empty file written there and removed: the
    OSError a later write would meet, now."""
    probe = directory / ".eae-write-check"
    directory.mkdir(parents=True, exist_ok=True)
    probe.touch()
    probe.unlink()


def check_writable(run_dir: Path) -> None:
    """Before a launch: a CheckpointStorageError if run_dir cannot be created or written to (a
    read-only or forbidden storage), rather than Ray Train's controller dying of it in its
    first write. A full disk still takes this empty file: a run finds that out at a write."""
    try:
        probe_write(run_dir)
    except OSError as error:
        if error.errno not in UNWRITABLE:
            raise
        raise CheckpointStorageError(f"checkpoint storage {run_dir} is not writable ({_cause(error.errno)}): "
                                     "nothing was started, and nothing there changed. Make it writable, then run "
                                     "the same command again.") from error


def check_output_dir(path: str | Path, setting: str, what: str) -> None:
    """`path` made a directory now and written to once, on the driver before Ray starts: a
    command's output place that cannot be one (under a file, under /proc, read-only) failed the
    command only where it was first written, after Ray had started or after training. A
    ValueError naming `setting` (`--out (train.out)`) and `what` is written there. What the
    check made is removed after it: a command refused by a later check leaves nothing behind."""
    path = Path(path)
    try:
        with made_for_now(path):
            probe_write(path)
    except OSError as error:
        raise ValueError(f"{setting} {path}: {what} cannot be written there ({error.strerror}: "
                         f"{error.filename}); give a directory that can be") from None


@contextmanager
def made_for_now(path: Path):
    """Inside: a check that may make `path` (and its missing parents). After it, whether it
    passed or not, the directories it made are removed: a driver-side check's directory is made
    again where the command writes, and a command refused by a later check leaves nothing behind."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    try:
        yield
    finally:
        if existing != path:  # the first directory made here, and what is under it
            shutil.rmtree(existing / path.relative_to(existing).parts[0], ignore_errors=True)


def refused_write(error: BaseException) -> StorageUnwritable | None:
    """The StorageUnwritable of the worker that had trained the most steps, among those a
    failed Ray Train run (ray.train.WorkerGroupError) reports; None if no worker raised one."""
    failures = getattr(error, "worker_failures", None) or {}
    found = [f for f in failures.values() if isinstance(f, StorageUnwritable)]
    return max(found, key=lambda f: f.step) if found else None


def steps_lost(failure: StorageUnwritable, last: tuple[Path, dict] | None) -> int:
    """The steps trained after the checkpoint `last` (None: after step 0), which a relaunch redoes."""
    return failure.step - (last[1]["step"] if last else 0)


def explain(failure: StorageUnwritable, storage: Path, name: str, last: tuple[Path, dict] | None) -> str:
    """The paragraph a run stopped by `failure` ends with. last: the checkpoint a relaunch
    resumes and its state (job.last_checkpoint_state), or None."""
    start, lost = last[1]["step"] if last else 0, steps_lost(failure, last)
    steps = f"{lost} step{'s' if lost != 1 else ''}" + (f" ({start + 1}-{failure.step})" if lost > 1 else "")
    kept = (f"its last good checkpoint, step {start} ({last[0]}), is intact; lost: the {steps} trained after it"
            if last else f"it had written no checkpoint yet; lost: the {steps} trained")
    return (f"checkpoint storage {storage} stopped taking writes ({_cause(failure.code)}): rank {failure.rank} "
            f"could not write {failure.what} after training step {failure.step}, and the run stopped (its MLflow run "
            "ends FAILED); "
            f"{kept}, which a relaunch trains again. Free space or make {storage} writable, then run the same "
            f"command with --name {name} to resume from step {start}.")


def _cause(code: int) -> str:
    """`ENOSPC: No space left on device`: the errno's name, which a search finds, and its text."""
    return f"{errno.errorcode.get(code, code)}: {os.strerror(code)}"
