"""Shared fixtures: a real local Ray cluster, started once per test session."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster whose jobs get the repository as their working dir, as
    `ray job submit --working-dir .` gives them. It never binds 6379 (Redis is there)."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"working_dir": str(REPO), "excludes": [".venv", ".git", "*.db", "mlruns"]},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()
