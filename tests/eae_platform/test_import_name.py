"""`platform/` must never shadow the standard library's `platform`, even in a Ray worker,
whose sys.path starts with the job's working directory (this repository)."""

import sys

from tests.conftest import REPO


def _probe():
    import os
    import platform
    import sys

    import eae_platform

    return {
        "system": platform.system(),
        "platform_file": platform.__file__,
        "cwd_has_platform_dir": os.path.isdir(os.path.join(os.getcwd(), "platform")),
        "cwd_on_path": any(os.path.abspath(p or ".") == os.getcwd() for p in sys.path),
        "eae_platform": eae_platform.__name__,
    }


def test_platform_system_works_in_a_ray_worker(ray_cluster):
    result = ray_cluster.get(ray_cluster.remote(_probe).remote(), timeout=300)
    # The worker runs inside the uploaded working dir, which holds the platform/ folder and
    # is on sys.path: the precondition for the shadowing bug.
    assert result["cwd_has_platform_dir"] and result["cwd_on_path"], result
    assert result["system"] == "Linux"
    assert "/platform.py" in result["platform_file"] and "/platform/" not in result["platform_file"]
    assert result["eae_platform"] == "eae_platform"


def test_platform_not_shadowed_with_repo_first_on_sys_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    saved = sys.modules.pop("platform")
    try:
        import platform

        assert platform.system() == "Linux"
        assert platform.__file__.endswith("platform.py")
    finally:
        sys.modules["platform"] = saved
