"""experiments/check_results_doc.py: a section's results_tables.py commands run as written on
committed stores, and each "x [lo, hi]" of its tables looked up in what they print."""

from __future__ import annotations

from pathlib import Path

from tests.experiments import experiment

REPO = Path(__file__).resolve().parents[2]
STORE = "real-text-vital2000-minilm-gpu-7200-memlr10-seeds10-14-2026-12-05.mlruns.tar.xz"


def _checker():
    return experiment("check_results_doc")


def test_a_section_s_intervals_are_found_in_its_commands_output_and_a_changed_one_is_not():
    # round 41's store prints EaE − No-EaE on masked entity acc −3.4 [−4.7, −2.1] and EaE's
    # mean 44.9 ± 1.0 [43.6, 46.1]; the block names the store through a variable, as rounds do
    body = f"""## Round X (a test)

```bash
S=$R/{STORE}   # a store
.venv/bin/python experiments/results_tables.py $S \\
  --figure runs/x.svg
.venv/bin/python experiments/results_tables.py $R/no-such-store.mlruns.tar.xz
```

| masked entity acc | EaE | EaE − No-EaE |
|---|---|---|
| as printed | 44.9 [43.6, 46.1] | **−3.4 [−4.7, −2.1] ✗** |
| a digit lost, a bound moved | 4.9 [43.6, 46.1] | −3.4 [−4.7, −2.2] |
"""
    check = _checker().check_section("Round X (a test)", body)
    assert check.intervals == ["44.9 [43.6, 46.1]", "-3.4 [-4.7, -2.1]", "4.9 [43.6, 46.1]", "-3.4 [-4.7, -2.2]"]
    assert check.missing == ["4.9 [43.6, 46.1]", "-3.4 [-4.7, -2.2]"], check
    assert check.commands == 2 and len(check.problems) == 1 and "no such store" in check.problems[0], check.problems
    assert not (REPO / "runs" / "x.svg").exists()  # --figure went to a scratch directory


def test_sections_split_the_doc_at_its_second_level_headings():
    text = "# Title\n\nintro\n\n## One\n\na\n\n### Sub\n\nb\n\n## Two\n\nc\n"
    assert [h for h, _ in _checker().sections(text)] == ["One", "Two"]


def test_a_figure_quoted_from_another_section_counts_and_one_printed_nowhere_fails(tmp_path, capsys):
    checker = _checker()
    block = f"```bash\n.venv/bin/python experiments/results_tables.py $R/{STORE}\n```\n"
    doc = tmp_path / "results.md"
    # section B has no command of its own that prints round 41's gap; A's prints it
    doc.write_text(f"# Results\n\n## A\n\n{block}\n| gap |\n|---|\n| −3.4 [−4.7, −2.1] |\n\n"
                   f"## B\n\n```bash\n.venv/bin/python experiments/results_tables.py --help\n```\n\n"
                   "| gap |\n|---|\n| −3.4 [−4.7, −2.1] (round A's) |\n")
    checker.DOC = doc
    assert checker.main([]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 found, 1 command(s): A" in out, out
    assert "0 of 1 found, 1 more printed by other sections' commands, 1 command(s): B" in out, out
    doc.write_text(doc.read_text() + "| a gap nobody printed: +9.9 [+1.0, +2.0] |\n")
    assert checker.main([]) == 1
    assert "    not printed: +9.9 [+1.0, +2.0]" in capsys.readouterr().out
    assert checker.main(["A"]) == 0  # B not checked
