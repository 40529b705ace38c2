"""QA fine-tuning configuration, one YAML section:

    finetune:
      init: models:/eae@pretrained   # or a model directory (eae pretrain --out), or a checkpoint
      data: synth:runs/world
      lr: 3.0e-5
      batch_size: 32
      max_steps: 700

Command-line overrides: `--set finetune.lr=1e-5`. The paper's settings (appendix "Open Domain
Question Answering"): TriviaQA lr 5e-6, batch 64, 50,000 steps; WebQuestions lr 3e-5, batch 32,
700 steps; both selected from lr {5e-5, 3e-5, 1e-5, 5e-6, 3e-6} x batch {32, 64, 128}.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from eae_model.config import coerce_fields, section_values
from eae_platform.model_init import is_mlflow_uri

MENTION_SOURCES = ("alias", "none")


@dataclass
class FinetuneConfig:
    init: str = ""  # models:/<name>@<alias>, a model directory, or a pretraining checkpoint
    data: str = ""  # a QA dataset spec (eae_data.qa.examples.load_dataset)
    vocab: str | None = None  # entity vocabulary directory (default: the model's own)
    lr: float = 3e-5
    batch_size: int = 32
    max_steps: int = 700
    step_scale: float = 1.0  # max_steps is multiplied by this (the paper's counts on small data)
    warmup_fraction: float = 0.05
    grad_clip: float = 1.0  # global gradient norm (<= 0: no clipping)
    eval_every: int = 0  # dev evaluation every N steps (0: only at the end)
    eval_batch_size: int = 128
    mentions: str = "alias"  # the question's proper-name mentions: alias-table matching, or none
    answer_token: str = "[MASK]"  # appended answer-position token (see eae_model.qa.encode)
    dev_fraction: float = 0.1  # carved from train when a dataset has no dev file
    top_k: int = 5  # ranked predictions kept per question
    evaluate_test: bool = True  # False in sweeps: test is evaluated once, for the selected trial
    # synth:DIR only: the `eae data build` directory pretraining read; EM is also reported for
    # questions whose fact pretraining read (`<split>/em_stated`) and the others (`_unstated`)
    stated_in: str | None = None
    # EaE: test is evaluated a second time with the memory's output zeroed (eval.memory_off's
    # ablation), logged as `test/em_memory_off` (and `_stated`/`_unstated` with stated_in)
    memory_off_eval: bool = False  # (its predictions: predictions/test_memory_off.jsonl)
    seed: int = 0
    log_every: int = 10
    experiment: str = "eae-qa"
    mlflow_uri: str | None = None  # default: MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    run_name: str | None = None
    parent_run_id: str | None = None  # MLflow parent (a sweep's run)
    out: str | None = None  # where the fine-tuned model directory goes
    # The fine-tuned model is registered in MLflow: with register_as, as a new version of that
    # name with `alias` moved to it; without, as a new version of eae-qa, no alias moved (an
    # alias that other commands load moves only when asked)
    register_as: str | None = None
    alias: str = "qa"
    register: bool = True  # False in sweep trials: the sweep registers the model it selects
    crash_once_file: str | None = None  # testing aid: the first run without this file creates it and fails

    def __post_init__(self) -> None:
        problems = []
        for name in ("batch_size", "max_steps", "eval_batch_size", "top_k", "log_every"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if not self.lr > 0 or self.step_scale <= 0:
            problems.append(f"lr and step_scale must be positive, got {self.lr} and {self.step_scale}")
        if self.eval_every < 0 or not 0 <= self.warmup_fraction < 1 or not 0 <= self.dev_fraction < 1:
            problems.append("need eval_every >= 0, warmup_fraction and dev_fraction in [0, 1)")
        if self.mentions not in MENTION_SOURCES:
            problems.append(f"mentions must be one of {', '.join(MENTION_SOURCES)}, got {self.mentions!r}")
        if problems:
            raise ValueError("invalid FinetuneConfig: " + "; ".join(problems))

    @property
    def steps(self) -> int:
        return max(1, round(self.max_steps * self.step_scale))

    def to_dict(self) -> dict[str, Any]:
        return {"finetune": dataclasses.asdict(self)}


def finetune_config_from(values: dict[str, Any]) -> FinetuneConfig:
    return FinetuneConfig(**coerce_fields(FinetuneConfig, values))


def load_finetune_config(path: str | Path | None = None, overrides: list[str] | None = None,
                         **values: Any) -> FinetuneConfig:
    """YAML file (section `finetune:`), then keyword values (command-line flags), then
    `finetune.key=value` overrides."""
    data = section_values(FinetuneConfig, "finetune", path, overrides, **values)
    return finetune_config_from(data)


def absolute_paths(config: FinetuneConfig) -> FinetuneConfig:
    """The config with its local paths made absolute (Ray tasks and Tune trials run in other
    directories). MLflow URIs and fanoutqa's packaged default are left as they are."""
    def local(path: str) -> str:
        return str(Path(path).resolve())

    values = dataclasses.asdict(config)
    if config.init and not is_mlflow_uri(config.init):
        values["init"] = local(config.init)
    fmt, sep, rest = config.data.partition(":")
    if sep and rest:
        values["data"] = f"{fmt}:" + ",".join(local(p) for p in rest.split(","))
    for key in ("vocab", "out", "crash_once_file", "stated_in"):
        if values[key]:
            values[key] = local(values[key])
    return FinetuneConfig(**values)
