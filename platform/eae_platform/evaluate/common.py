"""What every evaluation shares: the model (any `init` form of fine-tuning), the device, and
one MLflow run per evaluation."""

from __future__ import annotations

from pathlib import Path

import torch

from eae_model.checkpoint import load_model
from eae_model.model import EaEModel
from eae_platform.evaluate.config import EvalConfig
from eae_platform.model_init import resolve_init


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load(spec: str, mlflow_uri: str | None, dev: torch.device | None = None,
         memory_off: bool = False) -> tuple[EaEModel, Path | None]:
    """(model in eval mode, its entity vocabulary directory) for an MLflow model URI, a model
    directory or a pretraining checkpoint; memory_off: see silence_memory."""
    init = resolve_init(spec, mlflow_uri)
    model = load_model(init.model_dir, config=init.config).to(dev or device())
    model.eval()
    if memory_off:
        silence_memory(model, spec)
    return model, init.vocab_dir


def silence_memory(model: EaEModel, name: str = "the model") -> torch.utils.hooks.RemovableHandle:
    """Zero EaE's memory output: W_b E_m becomes 0, so X3 = LayerNorm(X1) at every position. The
    retrieval still runs (its reads and EL scores are unchanged); only what it adds to the
    sequence is gone. An ablation for evaluation, not a model variant (the layers after the
    memory were trained with its output). Returns the hook's handle: `.remove()` gives the output back."""
    if model.entity_memory is None:
        raise ValueError(f"eval.memory_off: {name} has no entity memory (model.use_entity_memory=false)")
    return model.entity_memory.project_value.register_forward_hook(lambda module, args, out: torch.zeros_like(out))


# the trackers tracker() opened in this process since unsent() last read them
_opened: list = []


def tracker(config: EvalConfig, extra_tags: dict | None = None, model_config=None):
    """The evaluation's MLflow run, tagged eae.task=eval/<task>, with the whole config logged."""
    from eae_platform.tracking import Tracker

    t = Tracker(config.experiment, run_name=config.run_name or f"eval-{config.task}", uri=config.mlflow_uri,
                tags={"eae.task": f"eval/{config.task}", **(extra_tags or {})})
    _opened.append(t)
    t.log_config({**config.to_dict(), **({"model": model_config.to_dict()} if model_config else {})})
    return t


def unsent() -> list[str]:
    """What the runs tracker() opened since the last call could not log, each as its tracker's
    CloseReport says it (what, and the journal that holds it); [] when the store took everything.
    The tracker prints it in the Ray task, whose output the command does not show: `eae eval`
    said nothing of metrics lost to a tracking server that went away."""
    reports = [t.close() for t in _opened]  # each closed by its `with` already: close() gives its report
    _opened.clear()
    return [str(r) for r in reports if not r.ok]

