"""Evaluation configuration, one YAML section shared by every `eae eval TASK`:

    eval:
      model: models:/eae@pretrained   # or a model directory, or a pretraining checkpoint
      data: runs/data                 # what the task reads (see each task)
      split: test

Command-line overrides: `--set eval.ks=1,10`. Tasks read the keys they need; the whole config
is logged to MLflow as params of the task's run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from eae_model.config import coerce_fields, section_values

TASKS = ("masked", "topk", "lama", "typing", "relations", "analysis", "overlap")
SPLITS = ("train", "dev", "test")
# the tasks that read one split (--split, eval.split): lama reads every probe, typing and relations
# train on train, choose their threshold on dev and report dev and test
SPLIT_TASKS = ("masked", "topk", "analysis", "overlap")


@dataclass
class EvalConfig:
    task: str = "masked"
    model: str = ""  # models:/<name>@<alias>, a model directory or a pretraining checkpoint
    data: str = ""  # masked/topk/analysis: an `eae data build` directory; lama: probe sources; typing/relations: a dataset spec
    split: str = "test"
    # Masked hyperlink prediction (Table 2) and top-K (Table 7).
    mask_rate: float = 0.2  # pretraining's: 20% of mentions
    seed: int = 0  # the masking seed (the same masks for every model and K)
    mask_draws: int = 1  # maskings of the split pooled (seeds seed, seed + 1, ...)
    max_batches: int = 0  # 0: the whole split
    batch_size: int = 32
    ks: str = "1,10,100,all"  # top-K: the memory's k at inference; "all" = every entity
    qa_model: str = ""  # top-K: the QA fine-tuned model scored on qa_data (default: model)
    qa_data: str = ""  # top-K: a QA dataset spec (eae finetune qa --data); empty: no QA EM
    # LAMA probes (Table 3).
    max_per_relation: int = 200  # probes kept per relation (the first ones, deterministic)
    # synth probes and QA: the `eae data build` directory pretraining read; facts whose subject's
    # article is in its training split are "stated", the others "unstated" (metrics per group)
    stated_in: str = ""
    # masked / lama: EaE's memory output X2 set to zero at every mention (the memory still reads,
    # and its reads are still scored), to measure what the predictions take from the memory
    memory_off: bool = False
    # lama: the same probes scored a second time with the memory's output zeroed, logged as a run
    # of this name (its config says memory_off=true): one process and one model load for both,
    # where eval.memory_off takes a second `eae eval` (experiments/regime/eval.sh's EaE cells)
    memory_off_run: str = ""
    # Entity typing / relation extraction fine-tuning (appendix; Table 9).
    lr: float = 3e-5
    steps: int = 700
    label_smoothing: float = 0.1  # typing (paper: 0.1)
    max_examples: int = 2000  # typing / relations: examples kept per split
    # Analysis (Figure 3) and overlap (Table 8).
    runs: str = ""  # QA runs (ids or names), comma-separated: analysis one, overlap two
    bootstrap: int = 1000  # resamples for the error bars
    # Tracking.
    experiment: str = "eae-eval"
    mlflow_uri: str | None = None  # default: MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    run_name: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.task not in TASKS:
            problems.append(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.split not in SPLITS:
            problems.append(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        for name in ("batch_size", "steps", "max_per_relation", "bootstrap", "max_examples", "mask_draws"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.mask_rate <= 1 or not self.lr > 0 or not 0 <= self.label_smoothing < 1:
            problems.append("need 0 < mask_rate <= 1, lr > 0 and 0 <= label_smoothing < 1")
        if self.memory_off_run and (self.task != "lama" or self.memory_off):
            problems.append("memory_off_run is for task lama with its memory on (memory_off=false)")
        if self.qa_model and not self.qa_data:
            # without a QA dataset topk scores no QA EM, and the model named would go unused silently
            problems.append("qa_model is scored on qa_data: give qa_data too (--qa-data, as eae finetune qa --data)")
        if self.max_batches < 0:
            problems.append(f"max_batches must be >= 0, got {self.max_batches}")
        try:
            self.k_values()
        except ValueError as error:
            problems.append(str(error))
        if problems:
            raise ValueError("invalid EvalConfig: " + "; ".join(problems))

    def k_values(self) -> list[tuple[str, int | None]]:
        """(label, k) for every K of `ks`: ("all", None) is every entity."""
        out = []
        for part in str(self.ks).split(","):
            part = part.strip()
            if part == "all":
                out.append(("all", None))
            elif part.isdigit() and int(part) > 0:
                out.append((part, int(part)))
            else:
                raise ValueError(f"ks must be positive integers or 'all', comma-separated; got {self.ks!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"eval": dataclasses.asdict(self)}


def load_eval_config(path: str | Path | None = None, overrides: list[str] | None = None, **values: Any) -> EvalConfig:
    """YAML file (section `eval:`), then keyword values (command-line flags), then
    `eval.key=value` overrides."""
    data = section_values(EvalConfig, "eval", path, overrides, **values)
    if isinstance(data.get("ks"), (list, tuple)):
        data["ks"] = ",".join(str(k) for k in data["ks"])
    elif data.get("ks") is not None:
        data["ks"] = str(data["ks"])
    return EvalConfig(**coerce_fields(EvalConfig, data))
