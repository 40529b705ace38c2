"""The `eae` console script, run as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

EAE = Path(sys.executable).parent / "eae"


def run(*args):
    return subprocess.run([str(EAE), *args], capture_output=True, text=True, timeout=120)


def test_model_summary_json_for_every_paper_model():
    result = run("model", "summary", "--preset", "paper", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["preset"] == "paper" and data["config"]["num_entities"] == 1_000_000
    assert abs(data["parameters"]["total"] - 367e6) < 1e6


def test_model_summary_table_with_yaml_and_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\nentity_dim: 16\n")
    result = run("model", "summary", "--config", str(path), "--set", "num_entities=1000")
    assert result.returncode == 0, result.stderr
    assert "preset 'tiny'" in result.stdout and "1,000 x 16" in result.stdout
    assert "entity_table" in result.stdout and "16,000" in result.stdout


def test_bad_input_is_a_clear_error_not_a_traceback():
    result = run("model", "summary", "--preset", "huge")
    assert result.returncode == 2
    assert "unknown preset 'huge'" in result.stderr and "Traceback" not in result.stderr
    result = run("model", "summary", "--set", "k_train=-3")
    assert result.returncode == 2 and "k_train must be positive" in result.stderr
