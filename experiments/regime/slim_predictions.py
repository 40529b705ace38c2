"""Slim the QA runs' per-question predictions in MLflow stores to what
experiments/results_tables.py reads (the answer entity and whether the prediction was right, for
accuracy by answer frequency, Figure 3), plus the question and predicted ids:

    python experiments/regime/slim_predictions.py DIR   # every */artifacts/predictions/test.jsonl under DIR, in place

A full line (the question, its answers, the prediction's title and its top-5 with scores) is
~340 bytes; 21,675 test questions of the 100k world made a 5.0 MB store of 6 cells, 0.47 MB slim.
collect.sh slims its archive's copies (the study's own stores keep every field); the committed
stores in docs/results were slimmed once, on 2026-12-05 (their full predictions are in git
history: `git show b15cceb:docs/results/STORE`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP = ("id", "answer_id", "prediction_id", "correct")


def slim(root: Path) -> tuple[int, list[str]]:
    """Rewrites each predictions/test.jsonl under root with KEEP's fields. Returns how many it
    slimmed and, for each it left whole (a line without answer_id or correct, or not JSON), why."""
    slimmed, whole = 0, []
    for path in sorted(root.glob("**/artifacts/predictions/test.jsonl")):
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        except ValueError as exc:
            whole.append(f"{path}: not JSON lines ({exc})")
            continue
        if not all("answer_id" in r and "correct" in r for r in rows):
            whole.append(f"{path}: a line without answer_id or correct")
            continue
        path.write_text("".join(json.dumps({k: r[k] for k in KEEP if k in r}) + "\n" for r in rows))
        slimmed += 1
    return slimmed, whole


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: slim_predictions.py DIR (a directory of MLflow stores)")
    slimmed, whole = slim(Path(sys.argv[1]))
    print(f"slimmed {slimmed} predictions files under {sys.argv[1]}; {len(whole)} left whole")
    for reason in whole:
        print(f"  left whole: {reason}")
