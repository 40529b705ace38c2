"""Where a command's pretrained model is: fine-tuning's `init`, an evaluation's `--model`.

    resolve_init("models:/eae@pretrained")   # a registered MLflow model, downloaded
    resolve_init("runs/models/eae")          # a model directory (`eae pretrain --out`: config.json)
    resolve_init("runs/ray/eae/checkpoint_000003")  # a Ray Train checkpoint of `eae pretrain` (state.json)

Light (no torch, no MLflow for a local path), so that the `eae` driver can check a local path
before it starts Ray; the Ray task that loads the model resolves it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eae_model.config import EaEConfig

MLFLOW_URIS = ("models:/", "runs:/")  # a model MLflow downloads, not a local path


def is_mlflow_uri(spec: str) -> bool:
    return spec.startswith(MLFLOW_URIS)


@dataclass
class InitModel:
    model_dir: Path
    vocab_dir: Path | None
    config: EaEConfig | None = None  # set for a pretraining checkpoint (its config is in state.json)


def resolve_init(init: str, mlflow_uri: str | None = None) -> InitModel:
    """Where the pretrained weights and their entity vocabulary are, for any `init` form."""
    if not init:
        raise ValueError("finetune.init is empty: give a model (models:/<name>@<alias>, a model directory "
                         "or a pretraining checkpoint)")
    if is_mlflow_uri(init):
        from eae_platform.tracking import download_model_dir

        model_dir = download_model_dir(init, uri=mlflow_uri)
        return InitModel(model_dir, model_dir)
    path = Path(init)
    if (path / "config.json").is_file():
        return InitModel(path, path)
    if (path / "state.json").is_file():  # a Ray Train checkpoint of `eae pretrain`
        saved = json.loads((path / "state.json").read_text())["config"]
        return InitModel(path, Path(saved["train"]["data"]), EaEConfig.from_dict(saved["model"]))
    raise FileNotFoundError(f"{init}: neither an MLflow model URI nor a model directory (config.json) nor a "
                            "pretraining checkpoint (state.json)")
