"""experiments/regime/slim_predictions.py: each QA run's predictions cut to the fields
results_tables.py reads, in place; a file it cannot read is left whole, and said so."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "regime" / "slim_predictions.py"


def _predictions(root: Path, run: str) -> Path:
    path = root / "mlruns" / "w300r2-small-eae-s0" / "1" / run / "artifacts" / "predictions" / "test.jsonl"
    path.parent.mkdir(parents=True)
    return path


def test_keeps_the_ids_and_correct_and_leaves_what_it_cannot_read_whole(tmp_path):
    full = [{"id": f"q{i}", "question": "Which country?", "answers": ["Traland"], "answer_id": 7 + i, "prediction": "X",
             "prediction_id": 3, "correct": i % 2 == 0, "top_k": [["X", 1.5], ["Traland", 1.2]]} for i in range(3)]
    qa = _predictions(tmp_path, "a")
    qa.write_text("".join(json.dumps(r) + "\n" for r in full))
    broken = _predictions(tmp_path, "b")
    broken.write_text('{"id": "q0", "answer_id": 1, "correct": true}\nnot json\n')
    other = _predictions(tmp_path, "c")
    other.write_text('{"id": "q0", "prediction": "X"}\n')  # no answer_id: not what the tables read
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"slimmed 1 predictions files under {tmp_path}; 2 left whole" in done.stdout, done.stdout
    assert f"left whole: {broken}: not JSON lines" in done.stdout and f"left whole: {other}: a line without" in done.stdout
    assert [json.loads(line) for line in qa.read_text().splitlines()] == [
        {"id": r["id"], "answer_id": r["answer_id"], "prediction_id": 3, "correct": r["correct"]} for r in full]
    assert broken.read_text().endswith("not json\n") and other.read_text() == '{"id": "q0", "prediction": "X"}\n'


def test_a_missing_directory_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nowhere")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("usage: slim_predictions.py DIR") and "Traceback" not in done.stderr
