"""scripts/ray-head, the Ray head of scripts/main: with Ray's default dashboard-agent port
(52365) taken by another Ray node on the machine, its head still takes `ray job submit`.
Before, scripts/main's head started without its job agent's HTTP server and the submit of the
pretraining failed ("No available agent to submit job"). A command given another token than the
head's is told so (Ray's own error said only "Failed to connect to Ray cluster")."""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import free_port, stop_node

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"
AGENT_DEFAULT_PORT = 52365  # Ray's --dashboard-agent-listen-port when none is given


def test_head_takes_jobs_with_the_default_agent_port_taken():
    held = socket.socket()  # another node's agent; already taken if one runs here
    try:
        held.bind(("", AGENT_DEFAULT_PORT))
        held.listen()
    except OSError:
        pass
    # a short root: Ray's Unix sockets live under it (at most 107 bytes a path)
    root = Path(tempfile.mkdtemp(prefix="eae-rh-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    port, dashboard = free_port(), free_port()
    url = f"http://127.0.0.1:{dashboard}"
    with open(root / "head.log", "wb") as log:
        head = subprocess.Popen([REPO / "scripts/ray-head", str(port), str(dashboard), "--num-cpus=1",
                                 f"--object-store-memory={100 * 2**20}", f"--temp-dir={root / 'ray'}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait = subprocess.run([REPO / "scripts/wait-for-job-api", url, "120", str(head.pid)], env=env,
                              capture_output=True, text=True, timeout=150)
        assert wait.returncode == 0, wait.stderr + (root / "head.log").read_text(errors="replace")[-3000:]
        submit = subprocess.run([RAY, "job", "submit", "--address", url, "--no-wait", "--", "true"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
        # ~20 s: Ray retries the refused token before it gives up
        eae = subprocess.run([Path(sys.executable).parent / "eae", "data", "build", "--out", str(root / "data"),
                              "--address", f"127.0.0.1:{port}"], env={**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)},
                             capture_output=True, text=True, timeout=120)
        assert eae.returncode == 2, eae.stderr[-2000:]
        assert f"eae: error: the Ray cluster at 127.0.0.1:{port} refused this command's token" in eae.stderr
    finally:
        held.close()
        stop_node(head)
        shutil.rmtree(root, ignore_errors=True)
