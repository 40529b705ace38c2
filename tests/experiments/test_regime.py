"""The regime study's stage scripts (experiments/regime/) end to end on CPUs, on the session's
Ray cluster: a 300-entity world stating its facts twice (`300r2`: --renderings 2,
--paragraph-contexts), EaE and No-EaE for one seed; pretraining (a paused run's
relaunch is tested on the job itself, test_pretrain.py), QA fine-tuning, the evaluations, the
stores' archive and the tables printed from it (experiments/results_tables.py)."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _stage(name, env, *args):
    return subprocess.run([str(REPO / "experiments" / "regime" / f"{name}.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_regime_study_runs_its_stages_and_prints_its_tables(ray_cluster, tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address, "STUDY": str(tmp_path / "study"),
           "WORLDS": "300r2", "SEEDS": "0", "STEPS": "100", "BATCH": "16", "QA_STEPS": "10", "QA_BATCH": "16",
           "PROBES": "20", "DEVICE": "cpu", "EAE_CMD": f"{sys.executable} -m eae_platform.cli"}
    assert _stage("data", env).returncode == 0
    done = _stage("pretrain", env)
    assert done.returncode == 0 and done.stdout.count("finished at step 100") == 2, done.stdout + done.stderr
    built = json.loads((tmp_path / "study" / "data" / "w300r2" / "manifest.json").read_text())["settings"]
    assert built["paragraph_contexts"] and built["dev_fraction"] == 0.05
    assert "== Overview ==" in (tmp_path / "study" / "worlds" / "w300r2" / "world.xml").read_text()
    for cell in ("w300r2-small-eae-s0", "w300r2-small-no_eae-s0"):
        assert (tmp_path / "study" / "models" / cell / "config.json").is_file()
    qa = _stage("finetune", env)
    assert qa.returncode == 0 and qa.stdout.count("test: EM") == 2, qa.stdout + qa.stderr
    evaluated = _stage("eval", env)
    assert evaluated.returncode == 0 and evaluated.stdout.count("lama/synth/stated/entity_accuracy") == 2, evaluated.stdout
    archive = tmp_path / "stores.tar.xz"
    assert _stage("collect", env, str(archive)).returncode == 0
    tables = subprocess.run([sys.executable, str(REPO / "experiments" / "results_tables.py"), str(archive), "--figure",
                             str(tmp_path / "regime.svg")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert tables.returncode == 0, tables.stderr
    out = tables.stdout
    # settings from the runs: 300 entities, the small transformer's 396,544 layer parameters
    assert "| 300, facts stated 2x | small |" in out and "396,544" in out and "100 x 16" in out
    rows = [line for line in out.splitlines() if line.startswith("| 300, facts stated 2x | small | ")]
    # settings, one row per model, the gap, EaE with its memory output zeroed against No-EaE and
    # against itself, EaE against K
    assert len(rows) == 7, out
    head = next(line for line in out.splitlines() if line.startswith("| world | transformer | model |"))
    columns = head.strip(" |").split(" | ")
    eae = dict(zip(columns, next(r for r in rows if "| eae |" in r).strip(" |").split(" | ")))
    no_eae = dict(zip(columns, next(r for r in rows if "| no_eae |" in r).strip(" |").split(" | ")))
    eae_only = ["EaE memory reads the subject", "EaE memory reads the answer", "EaE fact recall, memory output zeroed",
                "EaE QA test EM, memory output zeroed", "EaE masked entity acc, K=1", "EaE masked entity acc, K=all"]
    assert all(float(eae[c]) >= 0 for c in eae_only), eae  # one seed: a bare figure
    assert all(no_eae[c] == "–" for c in eae_only), no_eae
    assert "### EaE, memory output zeroed at evaluation" in out and "### EaE, K at inference" in out
    with tarfile.open(archive) as tar:  # the QA runs' predictions travel for accuracy by answer frequency
        kept = [n for n in tar.getnames() if "/artifacts/" in n]
    assert kept and all(n.endswith("/artifacts/predictions/test.jsonl") for n in kept), kept
    assert len(kept) == 2
    gap = out.split("### EaE − No-EaE")[1]
    assert "| 300, facts stated 2x | small |" in gap and "(n=1)" in gap  # one seed: a gap without an interval
    assert (tmp_path / "regime.svg").stat().st_size > 1000
