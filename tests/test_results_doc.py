"""docs/results.md's headline is what experiments/results_tables.py prints from the committed
stores, not figures typed by hand: the best-recipe section's command, run as written (its figure
to a temporary file), prints that section's tables line for line and draws the committed figure
byte for byte, and the summary table at the top quotes the gaps of its second table; the claims
table's real-text row quotes its stores' gaps.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "results.md"
FIGURE = "$R/regime-best-recipe.svg"
WORLDS = {"5k": "5,000", "20k": "20,000", "100k": "100,000"}
# the summary's columns: the best-recipe gap table's
COLUMNS = ("QA test EM", "fact recall, facts pretraining read", "masked entity acc (test articles)")
GAP = re.compile(r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\](?: ([✓~✗]))?")


def _tables(text: str) -> list[str]:
    """The markdown tables in text, each as its lines joined."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            tables.append("\n".join(rows))
            rows = []
    return tables


def _gap(cell: str) -> tuple[str, ...]:
    """'**+4.4 [+1.6, +7.2]** ✓ (...)' -> ('+4.4', '+1.6', '+7.2', '✓') (None: no sign), the
    doc's minus signs read as the script's."""
    match = GAP.search(cell.replace("**", "").replace("−", "-"))
    assert match, cell
    return match.groups()


def test_the_best_recipe_section_and_the_summary_are_printed_from_the_committed_stores(tmp_path):
    text = DOC.read_text()
    [command] = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "--best-recipe $R/regime-round3" in b]
    assert command.count(".venv/bin/python") == 1 and command.count(FIGURE) == 1, command
    figure = tmp_path / "regime-best-recipe.svg"
    command = command.replace(".venv/bin/python", sys.executable).replace(FIGURE, str(figure))
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    printed = _tables(run.stdout)

    section = text[text.index("\n## Each model at its best recipe"):]
    section = section[:section.index("\n## ", 1)]
    shown = _tables(section)
    assert len(shown) == 3, shown
    for table in shown:  # the first line of each that the script did not print
        assert table in printed, next(line for line in table.splitlines() if line not in run.stdout)
    assert figure.read_bytes() == (REPO / "docs" / "results" / "regime-best-recipe.svg").read_bytes()

    # the summary's 10x rows: each model at its pick, EaE − No-EaE (the gap table's 5 points)
    [gaps] = [t for t in shown if "| No-EaE's recipe |" in t.splitlines()[0]]
    head, _, *rows = [line.strip(" |").split(" | ") for line in gaps.splitlines()]
    by_point = {(r[0], r[1]): dict(zip(head, r)) for r in rows}
    summary = text[:text.index("\n## The status in detail")]
    points = [line.strip(" |").split(" | ") for line in summary.splitlines() if line.startswith("| 10x: ")]
    assert len(points) == len(by_point) == 5, (points, sorted(by_point))
    for point, *cells in points:
        size, ratio = re.fullmatch(r"10x: \d+k, `(\w+)` \((\d\.\d+)\)", point).groups()
        world = WORLDS[point.split()[1].rstrip(",")]
        row = by_point[(f"{world}, facts stated 4x", size)]
        assert row["facts / param"] == ratio, (point, row["facts / param"])
        for column, cell in zip(COLUMNS, cells, strict=True):
            assert _gap(cell) == _gap(row[column]), (point, column, cell, row[column])
            # 5 seeds unless the summary's cell names another count
            seeds = re.search(r"\((\d+)\)", cell)
            assert f"(seeds={seeds.group(1) if seeds else 5})" in row[column], (point, column, row[column])


# the summary's real-text row quotes, in order, EaE − No-EaE on masked entity acc of these stores
REAL_TEXT = ("real-text-vital-minilm-gpu-3600-memlr10-2026-11-30", "real-text-vital-minilm-gpu-7200-memlr10-2026-11-30",
             "real-text-vital2000-minilm-gpu-7200-memlr10-2026-12-05")


def test_the_summary_s_real_text_gaps_are_printed_from_their_stores():
    text = DOC.read_text()
    summary = text[:text.index("\n## The status in detail")]
    [row] = [line for line in summary.splitlines() if line.startswith("| EaE > No-EaE on real text")]
    quoted = [_gap(iv) for iv in re.findall(r"[+−-]\d+\.\d \[[+−-]\d+\.\d, [+−-]\d+\.\d\]", row)]
    assert len(quoted) == len(REAL_TEXT), row
    for store, gap in zip(REAL_TEXT, quoted, strict=True):
        run = subprocess.run([sys.executable, "experiments/results_tables.py", f"docs/results/{store}.mlruns.tar.xz"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        paired = run.stdout.split("### Paired by seed")[1].splitlines()
        head = next(line for line in paired if line.startswith("| world |")).strip(" |").split(" | ")
        pair = next(dict(zip(head, line.strip(" |").split(" | "))) for line in paired if "| EaE − No-EaE |" in line)
        printed = pair["masked entity acc (test articles)"]
        assert _gap(printed)[:3] == gap[:3], (store, printed, gap)
