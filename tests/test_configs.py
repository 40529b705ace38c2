"""The YAML configs under configs/ against what they claim to be."""

import tarfile
from pathlib import Path

from eae_platform.pretrain.config import load_pretrain_config

REPO = Path(__file__).resolve().parents[1]
ROUND_20 = REPO / "docs" / "results" / "regime-r20-small-20k-memlr10-12000-2026-12-01.mlruns.tar.xz"


def _logged_params(archive: Path, cell: str, tmp_path: Path, monkeypatch) -> dict[str, str]:
    """The params a cell's pretraining run logged, from a committed study store (collect.sh)."""
    from mlflow.tracking import MlflowClient

    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file://{tmp_path / 'mlruns' / cell}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], f"attributes.run_name = '{cell}'")
    assert len(runs) == 1, runs
    return runs[0].data.params


def test_the_synth_20k_small_config_is_the_recipe_round_20_ran(tmp_path, monkeypatch):
    """configs/pretrain-synth-20k-small.yaml says it is docs/results.md's round 20 recipe (EaE
    beating No-EaE): every model setting and the training recipe that round's EaE run logged
    (seed 10, the committed store) equal the config's, but the two the data sets (its entity
    count and longest context, which `eae pretrain` reads from the manifest: 128 for this world)
    and the study's own bookkeeping (paths, names, logging, resources)."""
    config = load_pretrain_config(REPO / "configs" / "pretrain-synth-20k-small.yaml")
    logged = _logged_params(ROUND_20, "w20000r4-small-eae-s10", tmp_path, monkeypatch)
    recipe = ("lr", "max_steps", "batch_size", "warmup_fraction", "memory_lr_scale", "shuffle_rows", "seed",
              "mask_rate", "grad_clip", "num_workers", "use_gpu", "shard_entity_table", "init_encoder")
    # the logged strings read back as `--set` reads them
    ran = load_pretrain_config(preset=logged["model.preset"], overrides=[
        f"{k}={v}" for k, v in logged.items()
        if k.startswith("model.") and k not in ("model.preset", "model.num_entities", "model.max_length")
        or k.removeprefix("train.") in recipe])
    assert logged["model.preset"] == config.model.preset == "small"
    differ = {k: (getattr(ran.model, k), v) for k, v in vars(config.model).items()
              if k not in ("num_entities", "max_length") and getattr(ran.model, k) != v}
    differ |= {k: (getattr(ran.train, k), getattr(config.train, k)) for k in recipe if getattr(ran.train, k) != getattr(config.train, k)}
    assert not differ, differ
    assert config.train.memory_lr_scale == 10 and config.model.use_entity_memory
