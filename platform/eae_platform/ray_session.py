"""Connecting to Ray the way every command does: the cluster named by --address or
RAY_ADDRESS (as `ray job submit` sets for its jobs), else a new local cluster.

A new local cluster has token authentication on (Ray's default, unless RAY_AUTH_MODE=disabled
says otherwise; Ray keeps the token in ~/.ray/auth_token, or takes RAY_AUTH_TOKEN) and its
dashboard on 127.0.0.1 only: a client without the token is refused
(tests/eae_platform/test_ray_session.py). To reach a cluster started with `ray start --head`,
set RAY_ADDRESS (and RAY_AUTH_TOKEN or the token file Ray wrote, as Ray's token-auth docs
describe)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading

from eae_platform.progress import verbose


def connect(address: str | None = None, num_cpus: int | None = None):
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        # Workers of a running cluster inherit its raylet's environment, not this process's:
        # the MLflow settings given to the command (e.g. MLFLOW_ALLOW_FILE_STORE, without which
        # MLflow 3 refuses a file store) reach them as the job's runtime environment.
        # Inside a `ray job submit` job, those its runtime env already sets are left out: Ray
        # refuses a ray.init that names the same variable again.
        job_env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
        env = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
        if address != "auto" and "://" not in address:  # host:port of the cluster's GCS
            _check_reachable(address)
            env["RAY_ADDRESS"] = address  # see _STATE_API below
        for taken in job_env.get("env_vars") or {}:
            env.pop(taken, None)
        try:
            ray.init(address=address, runtime_env={"env_vars": env} if env else None, **_quiet())
        except ConnectionError as error:
            if _token_refused(error):  # Ray's own error said only "Failed to connect to Ray cluster"
                raise ValueError(f"the Ray cluster at {address} refused this command's token: set RAY_AUTH_TOKEN "
                                 "(or RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token) to the token its head was "
                                 "started with (`ray get-auth-token` on the head prints it)") from None
            raise
    else:
        # address="local": a new cluster, not one a stale /tmp/ray/ray_current_cluster names.
        # With the dashboard (Ray's default where its packages are installed, as with ray[serve]),
        # whose State API the workers ask (see _STATE_API below): without it Ray Train's
        # placement-group cleaner logged "Failed to query Ray Train Controller actor state" every
        # few seconds (~300 lines in a 5-minute GPU run). On a free port of 127.0.0.1 that the
        # workers are told.
        # Token authentication: Ray 2.60's default for a new local cluster (RAY_AUTH_MODE
        # unset). Not set here: RAY_AUTH_MODE written into os.environ after Ray has read its
        # config turns the cluster's check on but not this driver's token (tested: it cannot
        # connect). tests/eae_platform/test_ray_session.py fails if a Ray upgrade turns it off.
        port = _free_port()
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=None, dashboard_host="127.0.0.1",
                 dashboard_port=port, runtime_env={"env_vars": {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}},
                 **_quiet())
    if threading.current_thread() is threading.main_thread():  # (signal handlers: the main thread's only)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if not verbose():
        print(f"Ray's own output (workers, Ray Train, Ray Data): {logs_dir()} (--verbose shows it here)", flush=True)
    return ray


# The signal that stopped this command inside Ray, for `eae` to say so (cli.main): a SystemExit
# raised inside the driver's ray.get (most of a command's time) comes out as Ray's own
# SystemExit(1), and `eae` exited 1 in silence, as a failure would. Two handlers note it:
# - SIGTERM (`ray job stop`, a scheduler): Ray's driver's answer, sys.exit, which ends the
#   command's MLflow run KILLED and lets `eae` cancel its Ray task (_exit_on_sigterm);
# - Ctrl-C inside Ray Train's fit(): Ray Train 2.60's own handler, installed in fit() and not
#   chained to the one before (DataParallelTrainer._register_sigint_handler), aborts the run and
#   calls sys.exit(0); `eae pretrain` puts one in front of it (noting_sigint).
_stopped_by: list[signal.Signals] = []


def _exit_on_sigterm(signum, frame):
    _stopped_by.append(signal.Signals(signum))
    sys.exit(signum)


def noting_sigint(handler):
    """`handler` (a Python SIGINT handler someone else installed: Ray Train's) behind one that
    first notes the signal, for `stopped_by`."""
    def noting(signum, frame):
        _stopped_by.append(signal.Signals(signum))
        return handler(signum, frame)
    return noting


def stopped_by() -> signal.Signals | None:
    """The first signal that `_exit_on_sigterm` or a `noting_sigint` handler took in this process."""
    return _stopped_by[0] if _stopped_by else None


# _STATE_API: Ray's State API clients in the workers (Ray Data's hanging-task detector, in the
# Train workers that stream shards; Ray Train's placement-group cleaner, in every run of a
# trainer other than `eae pretrain`'s, job._trainer_class) find the cluster on their own:
# RAY_ADDRESS or RAY_API_SERVER_ADDRESS in their environment, else /tmp/ray/ray_current_cluster,
# the cluster `ray start` last wrote there. With another cluster on the machine (a `ray start`
# head, a stale file, the test suite's) they asked that one: the cleaner's checks hung up to
# 10 s, every run's end waited 15 s for it, and a cleaner answered "no such actor" by a live
# cluster would remove the run's placement group. Both variables name this process's own cluster.


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a GCS address where nothing listens: ray.init retries a dead address 20 times,
    a minute or two each (a typo'd --address looked like a hang of half an hour)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return  # not host:port: Ray says what is wrong with it
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ValueError(f"no Ray cluster answers at {address} (--address or RAY_ADDRESS): {error.strerror or error}; "
                         "start its head there (`ray start --head --port=PORT`), or leave both unset for a new local "
                         "cluster") from None


def _token_refused(error: BaseException) -> bool:
    """Whether ray.init's ConnectionError comes from the cluster refusing the token: Ray 2.60
    wraps its AuthenticationError in a RuntimeError's message, and that in the ConnectionError."""
    from ray.exceptions import AuthenticationError

    while error is not None:
        if isinstance(error, AuthenticationError) or "InvalidAuthToken" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet() -> dict:
    """ray.init's settings for the verbosity (eae_platform.progress): by default the workers'
    output stays in the session's log files and the driver logs only Ray's warnings."""
    import ray

    return {"log_to_driver": verbose(), "logging_config": ray.LoggingConfig(log_level="INFO" if verbose() else "WARNING")}


def logs_dir() -> str:
    """The log directory of the Ray session this process is connected to (on the head node)."""
    import ray

    # No public API names it; Ray Train and Ray Data find it the same way.
    return ray._private.worker._global_node.get_logs_dir_path()
