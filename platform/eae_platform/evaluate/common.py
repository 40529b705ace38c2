"""What every evaluation shares: the model (any `init` form of fine-tuning), the device, and
one MLflow run per evaluation."""

from __future__ import annotations

from pathlib import Path

import torch

from eae_model.checkpoint import load_model
from eae_model.model import EaEModel
from eae_platform.evaluate.config import EvalConfig


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load(spec: str, mlflow_uri: str | None, dev: torch.device | None = None) -> tuple[EaEModel, Path | None]:
    """(model in eval mode, its entity vocabulary directory) for an MLflow model URI, a model
    directory or a pretraining checkpoint."""
    from eae_platform.finetune.qa import resolve_init

    init = resolve_init(spec, mlflow_uri)
    model = load_model(init.model_dir, config=init.config).to(dev or device())
    model.eval()
    return model, init.vocab_dir


def tracker(config: EvalConfig, extra_tags: dict | None = None, model_config=None):
    """The evaluation's MLflow run, tagged eae.task=eval/<task>, with the whole config logged."""
    from eae_platform.tracking import Tracker

    t = Tracker(config.experiment, run_name=config.run_name or f"eval-{config.task}", uri=config.mlflow_uri,
                tags={"eae.task": f"eval/{config.task}", **(extra_tags or {})})
    t.log_config({**config.to_dict(), **({"model": model_config.to_dict()} if model_config else {})})
    return t

