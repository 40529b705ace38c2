"""Pretraining configuration: the model's EaEConfig plus TrainConfig, one YAML file.

    model:            # EaEConfig keys (a preset, then overrides)
      preset: tiny
    train:            # TrainConfig keys
      data: runs/wiki-sample
      max_steps: 200

Command-line overrides name the section: `--set train.lr=3e-4 --set model.k_train=100`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eae_model.config import EaEConfig, coerce_fields, config_from_values, parse_override

# torch.compile's modes (torch._inductor.list_mode_options); the "reduce-overhead" and
# "max-autotune" ones run the compiled graphs as CUDA graphs on GPUs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# Ray's placement-group strategies, for the workers' group (ray.train.ScalingConfig)
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
GRAD_SYNCS = ("buckets", "ddp")


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """"FIRST-LAST" (1-based, inclusive; not FIRST:LAST, which YAML 1.1 reads as a base-60 number) -> (first, last); None or "" -> None."""
    if not text:
        return None
    try:
        first, last = (int(x) for x in str(text).split("-"))
    except ValueError:
        raise ValueError(f"train.profile_steps must be FIRST-LAST (steps, 1-based), got {text!r}") from None
    if not 1 <= first <= last:
        raise ValueError(f"train.profile_steps must have 1 <= FIRST <= LAST, got {text!r}")
    return first, last


@dataclass
class TrainConfig:
    data: str = "runs/wiki-sample"  # an `eae data build` output directory
    batch_size: int = 4096  # global: summed over workers (paper 4096)
    max_steps: int = 1_000_000  # paper 1M
    lr: float = 1e-4  # Adam (paper)
    warmup_fraction: float = 0.05  # linear warmup over the first 5% of steps, then linear decay
    # Adam's lr for the entity table and the memory layer (W_f, W_b and its LayerNorm) as a
    # multiple of lr (No-EaE: its table, which the EntityPred head reads). Adam moves a weight by
    # at most ~lr a step, so at lr 1e-4 a memory started at N(0, 0.02) grows too slowly to matter
    # beside layers that start pretrained (train.init_encoder); 1.0: one lr for everything.
    memory_lr_scale: float = 1.0
    grad_clip: float = 1.0  # global gradient norm (<= 0: no clipping)
    mask_rate: float = 0.2  # share of mentions masked, redrawn every epoch
    seed: int = 0
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    use_gpu: bool = False
    # GPUs per worker: below 1, several small runs share a GPU (Ray places fractional GPUs)
    gpus_per_worker: float = 1.0
    shard_entity_table: bool = True  # rows of E partitioned over workers (parameter-server style)
    # How Ray places the workers over the cluster's nodes: PACK (as few nodes as hold them),
    # SPREAD (as many as it can), STRICT_PACK (one node), STRICT_SPREAD (one worker per node;
    # the run waits until the cluster has num_workers nodes with room for one)
    placement_strategy: str = "PACK"
    # How the replicated gradients are averaged over workers: "buckets" (GradientSync, all-reduces
    # launched during the backward) or "ddp" (torch's DistributedDataParallel with the table's
    # rows left out); docs/performance.md measures the two on two GPUs
    grad_sync: str = "buckets"
    log_every: int = 10
    prefetch_batches: int = 2  # batches read and collated ahead by a background thread (0: none)
    # keep each worker's training rows in memory after their first read, so later epochs start
    # no Ray Data pipeline (data.cached_batches); None: when the training files are small
    cache_data: bool | None = None
    # each epoch, a cached split's rows (cache_data) in an order drawn from (seed, epoch, rank)
    # rather than its shards' order (articles in order, often one source to a shard: a small
    # batch trained on one source for many steps); a streamed split keeps its shards' row order
    shuffle_rows: bool = True
    # every batch padded to model.max_length (one shape for all steps: cuDNN attention and Triton
    # plan per shape) or to its longest context; None: fixed on GPUs, longest on CPUs
    pad_to_max_length: bool | None = None
    # instead, each batch padded to its longest context rounded up to this multiple (at most
    # model.max_length): a few shapes rather than one, for contexts much shorter than max_length
    # (the synthetic worlds': 22 wordpieces on average, at most 80-88, against 128); 0: off
    pad_multiple: int = 0
    # torch.compile the embeddings and both transformer stacks (the memory and heads, whose
    # shapes follow the mention count, stay eager); None: on GPUs
    compile: bool | None = None
    # torch.compile's mode for them: "reduce-overhead" also captures each stack's forward and
    # backward as CUDA graphs (one launch each instead of hundreds; on CPUs it compiles as "default")
    compile_mode: str = "default"
    profile_steps: str | None = None  # "FIRST-LAST": torch.profiler over those steps -> profile-rank<r>.txt
    checkpoint_every: int = 100
    eval_batches: int = 20  # dev batches per evaluation, read once and kept (0: the whole dev split, read each time)
    max_failures: int = 0  # worker crashes survived by restarting from the last checkpoint (-1: any number)
    # Stop after this many seconds of training in this launch (checked every log_every steps,
    # the same step on every worker): checkpoint, end the MLflow run as KILLED with the step in
    # its tag eae.paused_at_step, and exit; relaunching with the same name continues exactly
    # (for time-limited allocations). None: no limit.
    time_budget_s: float | None = None
    # The same pause at a wall-clock time (UNIX seconds, e.g. `$(( $(date +%s) + 540 ))`): the
    # first log window at or after it. A time-limited allocation ends at a time, and workers
    # that took long to start (many runs sharing one machine) would overrun it with a budget
    # counted from their first step. None: no deadline.
    deadline: float | None = None
    # When no step has finished for this many seconds, every thread's stack to the log
    # (pretrain/stall.py: a worker that stopped stepping said nothing of where it waited).
    # None: no watchdog.
    stall_report_s: float | None = 300.0
    # A pretrained BERT encoder's weights for the embeddings and the l0 + l1 layers at step 0
    # (eae_model/pretrained.py): "minilm" (the shipped MiniLM, with --preset minilm) or a
    # directory with config.json and model.safetensors. None: every weight newly initialised.
    init_encoder: str | None = None
    # Ray Train run name: relaunching with the same name resumes; "" gives each launch a fresh
    # name (pretrain-<date>-<time>), so that a new run never picks up another's checkpoint
    name: str = ""
    storage_path: str = "runs/ray"  # Ray Train storage (checkpoints)
    out: str | None = None  # where the final model directory goes
    experiment: str = "eae-pretrain"  # MLflow experiment
    mlflow_uri: str | None = None  # default: MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    # MLflow registered model name (None: do not register): only when asked, so that a new run
    # never silently moves the alias (models:/<name>@pretrained) that other commands load
    register_as: str | None = None
    alias: str = "pretrained"  # MLflow registry alias ("latest" is reserved by MLflow)

    def __post_init__(self) -> None:
        problems = []
        if self.batch_size % max(self.num_workers, 1):
            problems.append(f"batch_size {self.batch_size} is not divisible by num_workers {self.num_workers}")
        if not self.memory_lr_scale > 0:
            problems.append(f"memory_lr_scale must be positive, got {self.memory_lr_scale}")
        # Checked here, on the driver: torch refused a negative lr only once Ray had started
        if not self.lr >= 0:
            problems.append(f"lr must be >= 0, got {self.lr}")
        # A negative count read no dev batch at all: a run without dev metrics, and no word of it
        if self.eval_batches < 0:
            problems.append(f"eval_batches must be >= 0 (0: the whole dev split), got {self.eval_batches}")
        # Ray's FailureConfig reads -1 as any number of restarts and takes -2 without a word
        # (Ray 2.60), a meaning it does not document
        if self.max_failures < -1:
            problems.append(f"max_failures must be >= -1 (-1: any number), got {self.max_failures}")
        # A worker of no resources at all is a bundle Ray refuses ("Bundles cannot be an empty
        # dictionary"), after the run has started; a GPU worker may ask no CPU
        if self.cpus_per_worker < 0 or (self.cpus_per_worker == 0 and not self.use_gpu):
            problems.append(f"cpus_per_worker must be positive (or 0 with use_gpu), got {self.cpus_per_worker}")
        for name in ("batch_size", "max_steps", "num_workers", "log_every", "checkpoint_every"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        g = self.gpus_per_worker
        if not (0 < g <= 1 or (g > 1 and g == int(g))):
            problems.append(f"gpus_per_worker must be a fraction in (0, 1] or a whole number, got {self.gpus_per_worker}")
        if self.stall_report_s is not None and self.stall_report_s <= 0:
            problems.append(f"stall_report_s must be positive or null, got {self.stall_report_s}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            problems.append(f"time_budget_s must be positive or null, got {self.time_budget_s}")
        if self.deadline is not None and self.deadline <= 0:
            problems.append(f"deadline must be a UNIX time in seconds or null, got {self.deadline}")
        try:
            steps = parse_steps(self.profile_steps)
        except ValueError as error:
            problems.append(str(error))
        else:  # the summary is written after step LAST: a range past the run's end wrote nothing, silently
            if steps and steps[1] > self.max_steps:
                problems.append(f"train.profile_steps {self.profile_steps!r} ends after max_steps {self.max_steps}: "
                                "no profile would be written")
        if self.compile_mode not in COMPILE_MODES:
            problems.append(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            problems.append(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                            f"got {self.placement_strategy!r}")
        if self.grad_sync not in GRAD_SYNCS:
            problems.append(f"grad_sync must be one of {', '.join(GRAD_SYNCS)}, got {self.grad_sync!r}")
        # The final model directory is what is registered: without one, the run ended with no
        # model registered and no word of it
        if self.register_as and not self.out:
            problems.append(f"register_as {self.register_as!r} needs out, the final model directory it registers "
                            "(--out DIR)")
        if self.pad_multiple < 0:
            problems.append(f"pad_multiple must be >= 0 (0: off), got {self.pad_multiple}")
        if self.prefetch_batches < 0:
            problems.append(f"prefetch_batches must be >= 0, got {self.prefetch_batches}")
        if not 0 <= self.mask_rate <= 1 or not 0 <= self.warmup_fraction < 1:
            problems.append("mask_rate must be in [0, 1] and warmup_fraction in [0, 1)")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))

    @property
    def batch_per_worker(self) -> int:
        return self.batch_size // self.num_workers


@dataclass
class PretrainConfig:
    model: EaEConfig
    train: TrainConfig

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PretrainConfig":
        return cls(EaEConfig.from_dict(data["model"]), TrainConfig(**coerce_fields(TrainConfig, data["train"])))


# The batch a preset's run gets when neither the config nor an override sets one: the paper's
# 4,096 contexts would exceed the few thousand a laptop-sized dataset (a synthetic world, the
# embedded sample) holds per epoch.
PRESET_BATCH_SIZE = {"tiny": 32, "small": 64}


def load_pretrain_config(
    path: str | Path | None = None, overrides: list[str] | None = None, preset: str | None = None
) -> PretrainConfig:
    """YAML file (sections `model:` and `train:`), then `section.key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict) or set(data) - {"model", "train"}:
            raise ValueError(f"{path}: expected top-level sections `model:` and `train:` only")
    model, train = dict(data.get("model") or {}), dict(data.get("train") or {})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for text in overrides or []:
        key, value = parse_override(text)
        section, _, name = key.partition(".")
        if section == "model" and name:
            model[name] = value
        elif section == "train" and name in known:
            train[name] = value
        elif section not in ("model", "train"):  # `modle.x`: the section named, not train's keys listed
            raise ValueError(f"override {key!r}: unknown section {section!r}; the sections are model and train "
                             "(model.<key>, train.<key>)")
        elif not name:
            raise ValueError(f"override {key!r} names no key: model.<key> or train.<key>")
        else:
            raise ValueError(f"override {key!r}: train has no key {name!r} (its keys: {', '.join(sorted(known))})")
    if "batch_size" not in train and (preset or model.get("preset")) in PRESET_BATCH_SIZE:
        train["batch_size"] = PRESET_BATCH_SIZE[preset or model["preset"]]
    return PretrainConfig(config_from_values(preset, model), TrainConfig(**coerce_fields(TrainConfig, train)))
