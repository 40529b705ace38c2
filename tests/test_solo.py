"""tests/solo.py: under two pytest workers, a module marked solo runs with no test beside it,
and the other modules still run side by side."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODULE = '''
import json, os, time
import pytest
{mark}

@pytest.mark.parametrize("i", range({n}))
def test_sleep(i):
    start = time.monotonic()
    time.sleep(0.6)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps(["{name}", start, time.monotonic()]) + "\\n")
'''


def test_a_solo_module_runs_alone_and_the_others_side_by_side(tmp_path):
    # loadfile hands the modules out in this order: "solo" is due on left's worker while right's
    # is still busy, so only the lock keeps them apart
    for name, mark, n in (("left", "", 3), ("right", "", 8), ("solo", "pytestmark = pytest.mark.solo", 3)):
        (tmp_path / f"test_{name}.py").write_text(MODULE.format(mark=mark, n=n, name=name))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    spans = tmp_path / "spans.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "tests.solo",
                           "-p", "no:cacheprovider", "-q", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          cwd=REPO, env={**__import__("os").environ, "SPANS": str(spans)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "14 passed" in done.stdout, done.stdout + done.stderr
    rows = [json.loads(x) for x in spans.read_text().splitlines()]
    solo = [(a, b) for name, a, b in rows if name == "solo"]
    others = {name: [(a, b) for n, a, b in rows if n == name] for name in ("left", "right")}
    first, last = min(a for a, _ in solo), max(b for _, b in solo)
    beside = [(n, a, b) for n, spans_ in others.items() for a, b in spans_ if a < last and b > first]
    assert not beside, (solo, beside)  # nothing ran while the solo module did
    left, right = others["left"], others["right"]
    assert any(a < d and c < b for a, b in left for c, d in right), (left, right)  # the others side by side
