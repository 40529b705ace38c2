"""benchmarks/bench_padding.py: one copy's table, N copies side by side with their medians, and
a clear refusal without a built dataset (the figures themselves are timings: not asserted)."""

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_padding.py"


@pytest.fixture(scope="module")
def world(synth_world):
    """The tests' built 300-entity world (conftest's synth_world)."""
    return synth_world / "data"


def bench(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)


def test_side_by_side_copies_each_print_their_table_and_the_medians_are_theirs(world):
    done = bench(world, "--preset", "small", "--batch", 4, "--steps", 2, "--rounds", 1, "--processes", 2)
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert [int(n) for n in re.findall(r"^## process (\d) of 2$", out, re.M)] == [1, 2], out
    # each copy its share of the cores, as the study gives each cell its own
    threads = max(1, os.cpu_count() // 2)
    assert re.findall(r", (\d+) CPU thread\(s\), ", out) == [str(threads)] * 2, out
    base = [float(m) for m in re.findall(r"^\s+max_length\s+[\d,]+\s+128\s+([\d.]+)\s+1\.00x$", out, re.M)]
    padded = [float(m) for m in re.findall(r"^\s+multiple of 16\s+[\d,]+\s+[\d,]+\s+([\d.]+)\s+[\d.]+x$", out, re.M)]
    assert len(base) == len(padded) == 2, out
    summary = re.search(r"^2 processes side by side, medians \(range\): max_length ([\d.]+) ms \(([\d.]+)-([\d.]+)\), "
                        r"multiple of 16 ([\d.]+) ms .*, ([\d.]+)x \(([\d.]+)-([\d.]+)x\)$", out, re.M)
    assert summary, out
    assert float(summary[1]) == pytest.approx(statistics.median(base), abs=0.06)
    assert (float(summary[2]), float(summary[3])) == (min(base), max(base))
    assert float(summary[4]) == pytest.approx(statistics.median(padded), abs=0.06)
    ratios = sorted(p / b for p, b in zip(padded, base))
    assert float(summary[5]) == pytest.approx(statistics.median(ratios), abs=0.006)


def test_without_a_built_dataset_it_says_so_in_a_line(tmp_path):
    for extra in ([], ["--processes", "2"]):
        done = bench(tmp_path / "nothing", "--preset", "small", *extra)
        assert done.returncode != 0
        assert "no train shards under" in done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr


def test_the_copies_are_given_every_argument_but_processes_and_at_least_one_copy_is_asked_for(capsys):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from bench_padding import parse_args, without_processes
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with pytest.raises(SystemExit) as stopped:
        parse_args(["data", "--processes", "0"])
    assert stopped.value.code == 2 and "--processes must be >= 1, got 0" in capsys.readouterr().err
    assert without_processes(["d", "--rounds", "2", "--processes", "2", "--steps", "2"]) == ["d", "--rounds", "2", "--steps", "2"]
    assert without_processes(["d", "--processes=3", "--compile"]) == ["d", "--compile"]
