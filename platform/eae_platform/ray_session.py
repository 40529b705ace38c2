"""Connecting to Ray the way every command does: the cluster named by --address or
RAY_ADDRESS (as `ray job submit` sets for its jobs), else a new local cluster.

Ray 2.60 enables token authentication on the local clusters it starts; we keep that default.
To reach a cluster started with `ray start --head`, set RAY_ADDRESS (and RAY_AUTH_TOKEN or the
token file Ray wrote, as Ray's token-auth docs describe)."""

from __future__ import annotations

import json
import os

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
        mlflow_env = {k: v for k, v in os.environ.items()
                      if k.startswith("MLFLOW_") and k not in (job_env.get("env_vars") or {})}
        ray.init(address=address, runtime_env={"env_vars": mlflow_env} if mlflow_env else None, **_quiet())
    else:
        # address="local": a new cluster, not one a stale /tmp/ray/ray_current_cluster names.
        # With the dashboard (Ray's default where its packages are installed, as with ray[serve]),
        # whose State API Ray Train's placement-group cleaner polls: without it a pretraining run
        # logged "Failed to query Ray Train Controller actor state" every few seconds (~300
        # lines in a 5-minute GPU run) and the cleaner could never clean up. On 127.0.0.1:8265,
        # or a free port if that one is taken.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=None, **_quiet())
    if not verbose():
        print(f"Ray's own output (workers, Ray Train, Ray Data): {logs_dir()} (--verbose shows it here)", flush=True)
    return ray


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
