"""Shared fixtures: a real local Ray cluster, started once per test session."""

import itertools
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

# Without a GPU (CI), the Triton kernels of memory_impl=triton run in Triton's interpreter on
# CPU tensors (tests/eae_model/test_triton_kernels.py). Triton reads TRITON_INTERPRET when it
# is first imported, so it is set here, before any test module imports it; with a GPU the
# compiled kernels are tested. torch.cuda.is_available() creates no CUDA context.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# tests/gpu: kernels with no interpreter (Gluon), checked on a GPU only (scripts/gpu/kernels).
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") != "1" else ["gpu"]


REPO = Path(__file__).resolve().parents[1]
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": "test"}
# Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s): a
# worker's second report of a log window waits for that poll (its result queue holds one),
# and so do a run's start and end. The tests' runs report every few steps of well under a
# second, so a 2-worker run of 16 steps took 49 s, 26 s with 0.2 s polls (same machine, same
# run); 0.1 s here. Set before Ray starts; the `eae` commands the tests start inherit it, and
# Ray Train passes it from the driver to its controller.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
# Ray Train's PreemptionWatcher (an actor of every run, watching for nodes that a cloud drains
# before reclaiming them; a process that imports ray.train, ~2.7 CPU-seconds on the 2-core CI
# machine) has nothing to watch on the tests' clusters, whose nodes are killed, never drained.
# Off for every run the tests start, passed on as the setting above.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster whose jobs get the repository as their working dir, as
    `ray job submit --working-dir .` gives them. It never binds 6379 (Redis is there)."""
    import ray

    if ray.is_initialized():  # else every test of this process fails with Ray's "ray.init twice"
        pytest.fail("Ray was started in this test process before the tests' cluster: a test or fixture ran Ray "
                    "(Ray Data, a build) without taking the ray_cluster fixture")
    ray.init(
        address="local",  # always a new cluster, never one a stale /tmp/ray file points at
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"working_dir": str(REPO), "excludes": [".venv", ".git", "*.db", "mlruns"]},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def new_mlflow_store(tmp_path_factory):
    """new(path) -> its URI, sqlite:///path: a new, empty MLflow store there (the directory made
    if need be), a copy of one made once per test session. MLflow makes a new SQLite store's
    tables through its schema migrations, ~2 s (4-5 s on the loaded 2-core CI machine), in each
    process that opens one; a copy is the same empty store (the experiments eae makes in it
    later put their artifacts next to the copy, not the original)."""
    import shutil

    from mlflow.tracking import MlflowClient

    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{template}").search_experiments()  # creates the tables

    def new(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"

    return new


@pytest.fixture(scope="session")
def synth_world(ray_cluster, tmp_path_factory):
    """A dir holding a 300-entity synthetic world, world/ (its dump and questions), built into
    data/ (shards and entity vocabulary). The build runs Ray Data: on the tests' cluster, or it
    would start one of its own in this process and every later test's cluster would fail."""
    from eae_data.synth import write_world
    from eae_platform.preprocess.build import BuildSettings, build

    tmp = tmp_path_factory.mktemp("qa")
    write_world(tmp / "world", 300, seed=0)
    build(BuildSettings(dumps=[str(tmp / "world" / "world.xml")], out=str(tmp / "data"), dev_fraction=0.1,
                        test_fraction=0.05, shard_rows=100))
    return tmp


@pytest.fixture(scope="session")
def synth_pretrained(synth_world, new_mlflow_store):
    """(dir, pretraining summary, sqlite URI): tiny EaE pretrained with Ray Train (1 worker,
    150 steps) on synth_world, whose dir it adds model/ (the model directory) and mlflow.db to,
    where the model is registered as models:/eae-world@pretrained. Shared by the QA and
    evaluation tests."""
    import json

    from eae_platform.pretrain.config import load_pretrain_config
    from eae_platform.pretrain.job import run

    tmp = synth_world
    num_entities = json.loads((tmp / "data" / "manifest.json").read_text())["counts"]["entities"]
    uri = new_mlflow_store(tmp / "mlflow.db")
    config = load_pretrain_config(None, [
        f"model.num_entities={num_entities}", "model.max_length=128", f"train.data={tmp / 'data'}",
        f"train.storage_path={tmp / 'ray'}", "train.name=world", "train.batch_size=32", "train.max_steps=150",
        "train.lr=0.002", "train.num_workers=1", "train.cpus_per_worker=1", "train.log_every=50",
        "train.checkpoint_every=150", "train.eval_batches=2", f"train.mlflow_uri={uri}", f"train.out={tmp / 'model'}",
        "train.register_as=eae-world",
    ], preset="tiny")
    summary = run(config)
    return tmp, summary, uri


# --- a real MLflow server on PostgreSQL ----------------------------------------------------


# Ports above Ray's worker ports (10002-19999 by default) and below the kernel's ephemeral range
# (32768-60999 here): a port the kernel gave to a bind(0) could be given again, before its server
# bound it, as the source port of any outgoing connection (Ray opens many) or to the other test
# process's bind(0); `eae serve` once failed so to bind its port in CI. Each pytest-xdist worker
# takes every n-th port, so the two test processes never hand out the same one; from a random
# place in that list, so that another test session at the same time starts elsewhere.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_MINE = range(20000 + _WORKER, 32768, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
_START = random.randrange(len(_MINE))
_PORTS = itertools.chain(_MINE[_START:], _MINE[:_START])


def descendants(pid: int) -> list[int]:
    """The PIDs of a process's descendants, from /proc (Ray starts its workers in process groups
    of their own, so a signal to the node's group misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def stop_node(proc: subprocess.Popen) -> None:
    """SIGTERM to the node's process group (`ray start --block`, GCS, raylet, dashboard, agents),
    SIGKILL after 5 s (the head's took longer than 15 s at times); then SIGKILL to any of its
    workers still there, by PID."""
    workers = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    """A TCP port free now on 127.0.0.1, outside the kernel's ephemeral range, that no test
    process has handed out before (a caller that asks for several before using them, as a Ray
    head's GCS, client server and dashboard ports, needs them distinct: `ray start` refuses a
    port given to two components)."""
    for port in _PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or lingering after a close
                continue
        return port
    raise RuntimeError("free_port: every port of 20000-32767 handed out or in use")


class MlflowServer:
    """`mlflow server` on a PostgreSQL database, in its own process group."""

    def __init__(self, backend_uri: str, workdir: Path):
        self.backend_uri, self.workdir = backend_uri, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> float:
        t0 = time.monotonic()
        cmd = [
            str(Path(sys.executable).parent / "mlflow"), "server",
            "--backend-store-uri", self.backend_uri,
            "--artifacts-destination", str(self.workdir / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        # MLflow's job execution (its GenAI jobs; EaE runs none) starts a job runner and huey
        # consumers beside the server: 10 processes where 2 serve, and ~16 s more CPU a start
        # (measured on this 2-core machine; the suite starts a server a dozen times)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    @contextmanager
    def outage(self, kill_then_restart, done: threading.Event, join_s: float):
        """kill_then_restart() (which kills this server and starts it again) in a thread beside
        the block; after the block: done set, the thread awaited, and the server started again
        if the restart failed, for the module's next tests."""
        thread = threading.Thread(target=kill_then_restart, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=join_s)
            if self.proc is None:
                self.start()

    def kill(self) -> None:
        """Crash it: SIGKILL to its process group (the server and its uvicorn worker)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)  # uvicorn waits for open keep-alive connections
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import psycopg2

    try:
        admin = psycopg2.connect(**PG, connect_timeout=5)
    except psycopg2.OperationalError as exc:  # a failure, never a skip: CI has PostgreSQL
        pytest.fail(f"PostgreSQL not reachable at {PG['host']}:{PG['port']}: {exc}")
    admin.autocommit = True
    db = f"mlflow_test_{secrets.token_hex(6)}"
    admin.cursor().execute(f"CREATE DATABASE {db}")
    srv = None
    try:
        # postgresql+psycopg2: SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3 (not installed)
        backend = f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{db}"
        srv = MlflowServer(backend, tmp_path_factory.mktemp("mlflow-server"))
        srv.start()
        yield srv
    finally:
        if srv is not None:
            srv.stop()
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.close()
