"""The shared test helpers of tests/conftest.py."""

from tests.conftest import free_port


def test_free_port_never_hands_out_a_port_twice():
    """A Ray head asks for its GCS, client-server and dashboard ports before it binds any of
    them; the kernel reuses closed ephemeral ports often enough that 500 plain bind-to-0 draws
    repeat one every time this was tried (a CI run lost the multi-node tests to such a pair)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports), sorted(p for p in set(ports) if ports.count(p) > 1)


def test_the_tests_of_a_minute_long_fixture_are_grouped_for_one_xdist_process():
    """Every test that takes a session pretraining (synth_pretrained, uninterrupted: even through
    another fixture) or is in test_serve.py carries an xdist_group mark, which scripts/test's
    --dist loadgroup runs in one process; others carry none. Listed as pytest collects them
    (`-m xdist_group`: the tests so marked)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    modules = ["tests/eae_platform/test_main_report.py", "tests/eae_platform/test_evaluate.py",
               "tests/eae_platform/test_pretrain_storage.py", "tests/eae_platform/test_serve.py", "tests/eae_platform/test_log.py"]

    def collected(*args):
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-n", "0",
                               *args, *modules], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return {line for line in done.stdout.splitlines() if "::" in line}

    every, grouped = collected(), collected("-m", "xdist_group")
    by_module = {m: {t for t in grouped if t.startswith(m)} for m in modules}
    assert by_module["tests/eae_platform/test_main_report.py"] == {t for t in every if "test_main_report" in t} != set()
    assert by_module["tests/eae_platform/test_serve.py"] == {t for t in every if "test_serve.py" in t}
    # test_evaluate: its tests of synth_pretrained's model (some through `untrained`), not the others
    assert "tests/eae_platform/test_evaluate.py::test_memory_off_removes_what_the_memory_adds_and_nothing_else" in grouped
    assert set() != by_module["tests/eae_platform/test_evaluate.py"] != {t for t in every if "test_evaluate" in t}
    assert any("test_storage_full_mid_run" in t for t in grouped)  # uninterrupted
    assert "tests/eae_platform/test_pretrain_storage.py::test_a_trace_record_is_appended_whole_or_not_at_all" not in grouped
    assert by_module["tests/eae_platform/test_log.py"] == set()
