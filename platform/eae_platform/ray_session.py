"""Connecting to Ray the way every command does: the cluster named by --address or
RAY_ADDRESS (as `ray job submit` sets for its jobs), else a new local cluster.

Ray 2.60 enables token authentication on the local clusters it starts; we keep that default.
To reach a cluster started with `ray start --head`, set RAY_ADDRESS (and RAY_AUTH_TOKEN or the
token file Ray wrote, as Ray's token-auth docs describe)."""

from __future__ import annotations

import os


def connect(address: str | None = None, num_cpus: int | None = None):
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        # Workers of a running cluster inherit its raylet's environment, not this process's:
        # the MLflow settings given to the command (e.g. MLFLOW_ALLOW_FILE_STORE, without which
        # MLflow 3 refuses a file store) reach them as the job's runtime environment.
        mlflow_env = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
        ray.init(address=address, log_to_driver=True, runtime_env={"env_vars": mlflow_env} if mlflow_env else None)
    else:
        # address="local": a new cluster, not one a stale /tmp/ray/ray_current_cluster names.
        # With the dashboard (Ray's default where its packages are installed, as with ray[serve]),
        # whose State API Ray Train's placement-group cleaner polls: without it a pretraining run
        # logged "Failed to query Ray Train Controller actor state" every few seconds (~300
        # lines in a 5-minute GPU run) and the cleaner could never clean up. On 127.0.0.1:8265,
        # or a free port if that one is taken.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=None)
    return ray
