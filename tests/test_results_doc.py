"""docs/results.md's headline is what experiments/results_tables.py prints from the committed
stores, not figures typed by hand: the commands of the best-recipe section and of the first
grid's tables, run as written (figures to a temporary file), print those sections' tables line
for line and draw the committed figures byte for byte; the summary table at the top quotes
their gaps, and the claims table's real-text row its stores'; every interval of the real-text
section's tables is printed by that section's commands.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.experiments import experiment

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "results.md"
FIGURE = "$R/regime-best-recipe.svg"
WORLDS = {"5k": "5,000", "20k": "20,000", "100k": "100,000"}
# the summary's columns: the best-recipe gap table's
COLUMNS = ("QA test EM", "fact recall, facts pretraining read", "masked entity acc (test articles)")
GAP = re.compile(r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\](?: ([✓~✗]))?")
# experiments/check_results_doc.py, which checks any section of the doc (minutes for all of it)
CHECKER = experiment("check_results_doc")
_tables = CHECKER.tables  # the markdown tables in a text, each as its lines joined


def _gap(cell: str) -> tuple[str, ...]:
    """'**+4.4 [+1.6, +7.2]** ✓ (...)' -> ('+4.4', '+1.6', '+7.2', '✓') (None: no sign), the
    doc's minus signs read as the script's."""
    match = GAP.search(cell.replace("**", "").replace("−", "-"))
    assert match, cell
    return match.groups()


def _cells(line: str) -> list[str]:
    """A markdown table row's cells."""
    return line.strip(" |").split(" | ")


def _gap_rows(table: str) -> dict[tuple[str, str], dict[str, str]]:
    """A gap table's rows by (world, transformer), each {column: cell}."""
    head, _, *rows = [_cells(line) for line in table.splitlines()]
    return {(r[0], r[1]): dict(zip(head, r)) for r in rows}


def _section(text: str, heading: str) -> str:
    """The "## " section whose heading starts so, as the checker splits the doc."""
    [body] = [body for title, body in CHECKER.sections(text) if title.startswith(heading)]
    return body


def _summary(text: str) -> str:
    """The one screen at the top of docs/results.md."""
    return text[:text.index("\n## The status in detail")]


def _run(command: str) -> str:
    """A doc's command, run from the repository root with this interpreter for .venv/bin/python;
    its stdout."""
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command.replace(".venv/bin/python", sys.executable)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_the_best_recipe_section_and_the_summary_are_printed_from_the_committed_stores(tmp_path):
    text = DOC.read_text()
    [command] = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "--best-recipe $R/regime-round3" in b]
    assert command.count(".venv/bin/python") == 1 and command.count(FIGURE) == 1, command
    figure = tmp_path / "regime-best-recipe.svg"
    out = _run(command.replace(FIGURE, str(figure)))
    printed = _tables(out)

    shown = _tables(_section(text, "Each model at its best recipe"))
    assert len(shown) == 4, shown  # the picks, EaE − No-EaE, its growth with the world, EaE − EaE-unsup
    for table in shown:  # the first line of each that the script did not print
        assert table in printed, next(line for line in table.splitlines() if line not in out)
    assert figure.read_bytes() == (REPO / "docs" / "results" / "regime-best-recipe.svg").read_bytes()

    # the summary's 10x rows: each model at its pick, EaE − No-EaE (the gap table's 8 points)
    [gaps] = [t for t in shown if "| No-EaE's recipe |" in t.splitlines()[0]]
    by_point = _gap_rows(gaps)
    points = [_cells(line) for line in _summary(text).splitlines() if line.startswith("| 10x: ")]
    assert len(points) == len(by_point) == 8, (points, sorted(by_point))
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
# (several: merged, a later store's cells winning, as the real-text section's commands pass them)
R41 = "real-text-vital2000-minilm-gpu-7200-memlr10-seeds10-14-2026-12-05"
REAL_TEXT = (("real-text-vital-minilm-gpu-3600-memlr10-2026-11-30",), ("real-text-vital-minilm-gpu-7200-memlr10-2026-11-30",),
             (R41,), *((R41, f"real-text-vital2000-minilm-gpu-7200-memlr10-{w}-seeds10-14-2026-12-05") for w in ("el003", "el01", "el03")))


def test_the_summary_s_real_text_gaps_are_printed_from_their_stores():
    text = DOC.read_text()
    [row] = [line for line in _summary(text).splitlines() if line.startswith("| EaE > No-EaE on real text")]
    quoted = [_gap(iv) for iv in re.findall(r"[+−-]\d+\.\d \[[+−-]\d+\.\d, [+−-]\d+\.\d\]", row)]
    assert len(quoted) == len(REAL_TEXT), row
    for stores, gap in zip(REAL_TEXT, quoted, strict=True):
        out = _run(".venv/bin/python experiments/results_tables.py " + " ".join(f"docs/results/{s}.mlruns.tar.xz" for s in stores))
        head, _, *rows = _tables(out.split("### Paired by seed")[1])[0].splitlines()
        pair = next(dict(zip(_cells(head), _cells(row))) for row in rows if "| EaE − No-EaE |" in row)
        printed = pair["masked entity acc (test articles)"]
        assert _gap(printed)[:3] == gap[:3], (stores, printed, gap)


def test_the_real_text_section_s_intervals_are_printed_by_its_commands():
    """Every "x [lo, hi]" in the real-text section's tables is printed from the committed stores
    by the section's results_tables.py commands (a table's columns may quote another round's
    block; the tables put metrics as rows, so they are checked cell by cell, not line for line);
    a model's mean may drop its "± sd". The one command that cannot run reads the store of the
    CPU MiniLM run, which the reader makes (the block names the committed one after it)."""
    check = CHECKER.check_section("Real text", _section(DOC.read_text(), "Real text (2026-11-28)"))
    assert len(check.intervals) > 200, check.intervals  # the section's tables, found
    assert not check.missing, check.missing
    # (where the reader ran that block, its store is there and the command runs)
    assert all(p.endswith("no such store: runs/vital-minilm.mlruns.tar.xz") for p in check.problems), check.problems


def test_the_first_grid_s_tables_figure_and_the_summary_s_1x_row_are_printed_from_the_committed_stores(tmp_path):
    """"The tables, as printed from the stores": its command, as written but for Figure 3's data
    (--answer-frequency reads the 5k world's shards, which a rebuild of minutes would make),
    prints the section's other tables line for line and draws docs/results/regime.svg byte for
    byte. The summary's 1x row quotes the masked gap of that section (18 seeds at lr 1e-3 x
    2,000) and QA and fact recall at each model's pick then, round 10's command (10 seeds)."""
    text = DOC.read_text()
    section = _section(text, "The tables, as printed from the stores")
    [command] = re.findall(r"`(\.venv/bin/python experiments/results_tables\.py docs/results/regime-pilot[^`]*)`", section)
    figure = tmp_path / "regime.svg"
    command, n = re.subn(r" --answer-frequency \S+", "", command.replace("--figure docs/results/regime.svg", f"--figure {figure}"))
    assert n == 1 and str(figure) in command, command
    out = _run(command)
    shown = [t for t in _tables(section) if not t.startswith("| transformer | answer's mentions |")]
    assert len(shown) == 10, len(shown)
    for table in shown:
        assert table in out, next(line for line in table.splitlines() if line not in out)
    assert figure.read_bytes() == (REPO / "docs" / "results" / "regime.svg").read_bytes()

    [round10] = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if b.startswith("export STUDY=/tmp/r10 ")]
    picks = _run(re.sub(r"--figure \S+", f"--figure {tmp_path / 'r10.svg'}", round10[round10.index("R=docs/results"):]))
    point = ("5,000, facts stated 4x", "medium")
    first = _gap_rows(next(t for t in _tables(out) if t.startswith("| world | transformer | facts / param |")))[point]
    picked = _gap_rows(next(t for t in _tables(picks) if t.startswith("| world | transformer | facts / param |")))[point]
    [row] = [_cells(line) for line in _summary(text).splitlines() if line.startswith("| 1x: 5k, `medium`")]
    qa, recall, masked = row[1:]
    assert _gap(qa) == _gap(picked["QA test EM"]) and "(10)" in qa and "(seeds=10)" in picked["QA test EM"], (qa, picked)
    assert _gap(recall) == _gap(picked["fact recall, facts pretraining read"]) and "(10)" in recall, (recall, picked)
    masked_printed = first["masked entity acc (test articles)"]
    assert _gap(masked) == _gap(masked_printed) and "(seeds=18)" in masked_printed, (masked, masked_printed)
