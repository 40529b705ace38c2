"""`ray_session.connect`: how every `eae` command reaches Ray."""

import os
import subprocess
import sys

from tests.conftest import REPO, free_port

PROBE = """
import urllib.error
import urllib.request

import ray.util.state
from eae_platform.ray_session import connect
ray = connect(num_cpus=1)
# this cluster's address: another one may be running (this session's, tests/conftest.py)
print("nodes", len(ray.util.state.list_nodes(address=ray.get_runtime_context().gcs_address)))
dashboard = ray._private.worker.get_dashboard_url()  # no public API names it
print("dashboard", dashboard)

@ray.remote(num_cpus=0)
def in_a_worker():  # where Ray Data's and Ray Train's State API clients run
    import os
    return os.environ.get("RAY_API_SERVER_ADDRESS")
print("workers-state-api", ray.get(in_a_worker.remote()))
try:  # the State API above sent the token; this request sends none
    with urllib.request.urlopen(f"http://{dashboard}/api/v0/nodes", timeout=30) as r:
        print("without-token", r.status)
except urllib.error.HTTPError as exc:
    print("without-token", exc.code)
"""


def test_a_new_local_cluster_answers_the_state_api_and_refuses_a_client_without_its_token():
    """Without an address, connect() starts a local cluster with the dashboard, whose State API
    the workers ask (Ray Data's hanging-task detector; Ray Train's placement-group cleaner, which
    logged a warning every few seconds without it). Token authentication is on and the dashboard
    listens on 127.0.0.1 only: its HTTP API answers the token's holder (the State
    API call) and refuses a request without it (401). The Ray settings of the environment are
    left out, so that the defaults are what is tested. In a process of its own: this session's
    cluster (tests/conftest.py) is already connected here."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines()[-4:])
    assert said["nodes"] == "1", done.stdout
    assert said["dashboard"].startswith("127.0.0.1:"), done.stdout
    # the workers' State API is this cluster's, never the one /tmp/ray/ray_current_cluster
    # names (ray_session._STATE_API)
    assert said["workers-state-api"] == f"http://{said['dashboard']}", done.stdout
    assert said["without-token"] == "401", done.stdout


ADDRESS_PROBE = """
import os, sys
from eae_platform.ray_session import connect
ray = connect(sys.argv[1])
print(ray.get(ray.remote(num_cpus=0)(lambda: os.environ.get("RAY_ADDRESS")).remote()))
"""


def test_the_workers_of_a_cluster_named_by_its_address_are_told_that_address(ray_cluster):
    """connect(address): the job's workers get RAY_ADDRESS, so that their State API clients
    (ray_session._STATE_API) ask this cluster, not whichever cluster
    /tmp/ray/ray_current_cluster names (a `ray start` head, a stale file): asked there, Ray
    Train's placement-group cleaner hung 15 s at each run's end, and its answer "no such actor"
    would remove a live run's workers."""
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-c", ADDRESS_PROBE, address], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == address, done.stdout


def test_an_address_where_no_cluster_listens_is_a_clear_error_at_once(tmp_path):
    """`--address` naming a port where nothing listens (here `eae data build`'s; every command
    connects through ray_session.connect): one `eae: error:` line in seconds. Ray's own connect
    retried it 20 times, a minute or two each (past 150 s here)."""
    address = f"127.0.0.1:{free_port()}"  # free: nothing listens there
    eae = os.path.join(os.path.dirname(sys.executable), "eae")
    result = subprocess.run([eae, "data", "build", "--out", str(tmp_path / "data"), "--address", address],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "RAY_ADDRESS": ""})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"eae: error: no Ray cluster answers at {address} (--address or RAY_ADDRESS)")
