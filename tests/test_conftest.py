"""The shared test helpers of tests/conftest.py."""

from tests.conftest import free_port


def test_free_port_never_hands_out_a_port_twice():
    """A Ray head asks for its GCS, client-server and dashboard ports before it binds any of
    them; the kernel reuses closed ephemeral ports often enough that 500 plain bind-to-0 draws
    repeat one every time this was tried (a CI run lost the multi-node tests to such a pair)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports), sorted(p for p in set(ports) if ports.count(p) > 1)


def test_the_modules_of_a_minute_long_fixture_run_in_one_xdist_process():
    """tests/conftest.py's xdist scheduler: the tests of the modules sharing a session
    pretraining (SHARED_FIXTURE_MODULES) run in one of scripts/test's two processes, which then
    builds it once; these, quick ones that do not take it, show where each ran."""
    import re
    import subprocess
    import sys

    from tests.conftest import REPO, SHARED_FIXTURE_MODULES

    grouped = ["tests/eae_platform/test_evaluate.py::test_lama_groups_and_prior_baseline_are_counted_per_group",
               "tests/eae_platform/test_evaluate.py::test_a_task_without_its_model_or_data_names_the_flag",
               "tests/eae_platform/test_finetune.py::test_a_qa_run_is_named_after_its_out_directory_unless_named",
               "tests/eae_platform/test_finetune.py::test_grad_clip_zero_is_no_clipping_as_in_pretraining"]
    assert {SHARED_FIXTURE_MODULES[t.split("::")[0]] for t in grouped} == {"synth_pretrained"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", *grouped],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {test: worker for worker, test in re.findall(r"\[(gw\d)\] .*?PASSED (\S+)", done.stdout)}
    assert sorted(ran) == sorted(grouped) and len(set(ran.values())) == 1, done.stdout
