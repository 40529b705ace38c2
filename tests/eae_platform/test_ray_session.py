"""`ray_session.connect`: how every `eae` command reaches Ray."""

import os
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import ray.util.state
from eae_platform.ray_session import connect
ray = connect(num_cpus=1)
# this cluster's address: another one may be running (this session's, tests/conftest.py)
print("nodes", len(ray.util.state.list_nodes(address=ray.get_runtime_context().gcs_address)))
"""


def test_a_new_local_cluster_answers_the_state_api():
    """Without an address, connect() starts a local cluster with the dashboard, whose State API
    Ray Train's placement-group cleaner polls during every run (without it the cleaner logged a
    warning every few seconds and could never clean up). In a process of its own: this session's
    cluster (tests/conftest.py) is already connected here."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "nodes 1", done.stdout
