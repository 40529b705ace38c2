"""The per-worker training loop that Ray Train runs (`train_loop_per_worker`).

Every worker holds the replicated weights (transformer, heads, projections) and its own rows of
the entity table. A step: forward on the worker's batch (the table's collectives exchange
mention queries and partial results; their sizes, the mention counts, were exchanged between
the hosts ahead of the step, `with_table_counts`), backward, average the replicated gradients
over workers (bucketed all-reduces that start during the backward, `grad_sync`; the table's row
gradients are already complete on their owner), clip the global gradient norm (replicated part
+ every shard's part), Adam step, scheduler step.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict
from contextlib import closing
from pathlib import Path

import torch
import torch.distributed as dist

from eae_data.constants import VOCAB_FILES
from eae_data.shards import shard_files
from eae_model.metrics import SUM_KEYS, add_masked_prediction, masked_prediction_metrics
from eae_model.model import EaEModel
from eae_model.summary import COMPONENTS
from eae_platform.progress import attach, progress_line, say
from eae_platform.pretrain import data, state, storage
from eae_platform.pretrain.grad_sync import GradientSync, averaged
from eae_platform.pretrain.profiling import GcTimer, GpuLag, SpanTimer, StepProfiler
from eae_platform.pretrain.stall import StallWatch
from eae_platform.pretrain.config import CUDA_GRAPH_MODES, PretrainConfig, parse_steps

# How long a run that ends while its MLflow store is unreachable keeps trying before it writes
# what is unsent to a file: a pretraining run is long, and a server restarted near its end
# (tests/eae_platform/test_pretrain.py: up to ~40 s on a loaded 2-core machine) should
# still get every metric and the final status. Costs nothing while the store answers.
MLFLOW_CLOSE_WAIT_S = 120.0

# The entity table's and the memory layer's parameters, by name (train.memory_lr_scale)
MEMORY_PREFIXES = COMPONENTS["entity_table"] + COMPONENTS["entity_memory"]


def lr_lambda(total_steps: int, warmup_fraction: float):
    """Linear warmup over the first warmup_fraction of steps, then linear decay to 0 (paper)."""
    warmup = max(1, int(total_steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


def pad_to(config: PretrainConfig) -> int | None:
    """The fixed sequence length of every batch (train.pad_to_max_length; default: on GPUs),
    with train.pad_multiple the most a batch is padded to, or None: each batch as long as its
    longest context."""
    fixed = config.train.pad_to_max_length
    on = config.train.use_gpu if fixed is None else fixed
    return config.model.max_length if on or config.train.pad_multiple else None


def compile_stacks(model: EaEModel, config: PretrainConfig) -> EaEModel:
    """torch.compile the embeddings and both transformer stacks (train.compile; default: on
    GPUs), in place (nn.Module.compile): parameter names, checkpoints and the state dict stay
    as they are. The memory and heads stay eager (their shapes follow the mention count);
    batches of one length (pad_to_max_length) keep the compiled graphs static. On an H100
    this took the paper-size step from 98.9 to 80.8 ms (docs/performance.md)."""
    t = config.train
    if _compiled(t):
        compile_modules(model, t.compile_mode)
    return model


def compile_modules(model: EaEModel, mode: str = "default") -> None:
    """torch.compile, in torch.compile's `mode`, the parts of the model whose shapes do not
    follow the mention count: the embeddings and both transformer stacks."""
    for module in (model.token_embed, model.transformer_l0, model.transformer_l1):
        module.compile(mode=mode)


def _compiled(t) -> bool:
    return t.use_gpu if t.compile is None else t.compile


def step_marker(config: PretrainConfig, device: torch.device):
    """cuda_graph_marker for the job's config: its compile mode, if it compiles."""
    t = config.train
    return cuda_graph_marker(t.compile_mode if _compiled(t) else None, device)


def cuda_graph_marker(mode: str | None, device: torch.device):
    """A function to call as each step (and each evaluation batch) begins. With modules
    compiled as CUDA graphs (mode reduce-overhead or max-autotune, on a GPU) it tells
    torch.compile's CUDA-graph trees that a new iteration starts, so each replay may reuse the
    last one's output memory (the step keeps none of it: its losses and norms are eager
    tensors); otherwise (mode None: not compiled) it does nothing."""
    if mode in CUDA_GRAPH_MODES and device.type == "cuda":
        return torch.compiler.cudagraph_mark_step_begin
    return lambda: None


def build_model(config: PretrainConfig) -> EaEModel:
    from eae_model.sharded_table import ShardedEntityTable

    c = config.model
    torch.manual_seed(config.train.seed)  # the same replicated initialisation on every rank
    table = None
    if c.has_entity_table:
        table = ShardedEntityTable(c.num_entities, c.entity_dim, init_std=c.entity_init_std,
                                   trainable=c.entity_trainable, seed=config.train.seed,
                                   chunk_rows=c.memory_chunk_rows, memory_impl=c.memory_impl,
                                   pretune_margin=c.memory_pretune_margin)
    model = EaEModel(c, entity_table=table)
    if config.train.init_encoder:  # every rank reads the same file: the same replicated weights
        from eae_model.pretrained import load_bert_encoder

        load_bert_encoder(model, config.train.init_encoder)
    return model


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sync_and_clip(sync: GradientSync, replicated: list[torch.nn.Parameter], table: list[torch.nn.Parameter],
                  max_norm: float, timer: SpanTimer | None = None) -> torch.Tensor:
    """Finish averaging the replicated gradients over workers (`sync`, launched during the
    backward), then clip the global norm. Returns the norm, a 0-d tensor: nothing here waits
    for the GPU (as torch.nn.utils.clip_grad_norm_, every gradient is multiplied by
    min(1, max_norm / norm)), so the host can prepare the next batch while this step runs.
    timer: times the wait for the all-reduces (GradientSync.wait)."""
    sync.wait(timer)
    grads = [p.grad for p in replicated if p.grad is not None]
    sq = _sum_of_squares(grads, grads[0].device if grads else "cpu")
    shard_sq = _sum_of_squares([p.grad for p in table if p.grad is not None], sq.device)
    if _distributed():
        dist.all_reduce(shard_sq)  # each rank owns different rows: sum their squares
    norm = (sq + shard_sq).sqrt()
    every = [p.grad for p in [*replicated, *table] if p.grad is not None]
    if max_norm > 0 and every:
        torch._foreach_mul_(every, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def _sum_of_squares(tensors: list[torch.Tensor], device) -> torch.Tensor:
    """0-d float32 sum of squares of every element, in a few fused kernels (one pow and one
    sum per tensor were ~600 kernel launches a step for BERT-base's 200 tensors)."""
    if not tensors:
        return torch.zeros((), device=device)
    norms = torch._foreach_norm(tensors, 2.0)
    return torch.stack([n.float() for n in norms]).pow(2).sum()


def _collective_device() -> torch.device:
    """Where a tensor for a collective must live: NCCL (the GPU backend) reduces CUDA tensors
    only; gloo takes CPU tensors."""
    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce_over_workers(values: dict[str, float], op=None) -> dict[str, float]:
    """Each value reduced over the workers (default: summed); unchanged with one worker."""
    if not _distributed():
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op)
    return dict(zip(keys, t.tolist()))


def _sum_over_workers(values: dict[str, float]) -> dict[str, float]:
    return _reduce_over_workers(values)


def _max_over_workers(values: dict[str, float]) -> dict[str, float]:
    return _reduce_over_workers(values, dist.ReduceOp.MAX if _distributed() else None)


def build_optimizer(model: torch.nn.Module, t, device: torch.device):
    """Adam and its schedule (lr_lambda, for every group alike). Every trainable weight learns
    at train.lr, except, when train.memory_lr_scale is not 1, the entity table and the memory
    layer: a second group at lr x memory_lr_scale. The first group's lr is the one logged."""
    prefixes = MEMORY_PREFIXES if t.memory_lr_scale != 1 else ()
    rest, memory = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (memory if name.startswith(prefixes) else rest).append(p)
    groups = [{"params": ps, "lr": t.lr * scale} for ps, scale in ((rest, 1.0), (memory, t.memory_lr_scale)) if ps]
    # One fused kernel per step on GPUs: the foreach version's passes over the 1M x 256 table
    # took ~9 ms of a ~90 ms step (H100 profile, docs/performance.md).
    optimizer = torch.optim.Adam(groups, lr=t.lr, fused=device.type == "cuda")
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.max_steps, t.warmup_fraction))


def table_memory_bytes(table: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Bytes this worker holds for its rows of the entity table: the rows themselves, their
    gradients (where allocated) and the optimizer's state for them (Adam: two moments and a
    step count). Measured on the tensors, so after the first optimizer step it is the steady
    footprint (4 x rows x dim x 4 bytes for float32 rows under Adam)."""
    total = 0
    for p in table:
        total += p.numel() * p.element_size()
        if p.grad is not None:
            total += p.grad.numel() * p.grad.element_size()
        for value in optimizer.state.get(p, {}).values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


def memory_metrics(table: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, device) -> dict[str, float]:
    """`table_gib_per_worker`: the largest table footprint (table_memory_bytes) of any worker;
    on GPUs also `peak_gpu_gib` / `peak_gpu_gib_min`: the largest / smallest peak of memory
    allocated by torch on any worker's GPU so far (torch.cuda.max_memory_allocated)."""
    mine = {"table_gib_per_worker": table_memory_bytes(table, optimizer) / 2**30}
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        mine.update(peak_gpu_gib=peak, peak_gpu_gib_min_neg=-peak)
    out = _max_over_workers(mine)
    if "peak_gpu_gib_min_neg" in out:
        out["peak_gpu_gib_min"] = -out.pop("peak_gpu_gib_min_neg")
    return out


def with_table_counts(items, model: EaEModel, group, steps: int):
    """(epoch, step, batch) items -> (epoch, step, batch, counts), for at most `steps` items.
    counts: the mention counts of the batch's entity-table calls on every worker (the sharded
    table's R0, `exchange_counts` over `group`, a gloo group used by nothing else), for the
    table's `expect`; None when group is None. Run ahead of the step in a thread of its own,
    it spares the step the two waits for the other hosts that R0 took inside the forward.
    Every worker makes exactly `steps` exchanges, one per step it takes."""
    from eae_model.sharded_table import exchange_counts

    try:
        for _, (epoch, step, batch) in zip(range(steps), items):
            counts = None
            if group is not None:
                counts = exchange_counts(model.table_call_sizes(batch.mentions, batch.indices), group)
            yield epoch, step, batch, counts
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # the epochs' prefetch threads and Ray Data pipelines


def dev_batches(config: PretrainConfig, rank: int, world_size: int) -> data.DevBatches:
    """This rank's dev batches for `evaluate`, kept after the first evaluation unless
    train.eval_batches is 0 (the whole dev split, read at every evaluation)."""
    t = config.train
    files = shard_files(t.data, "dev")
    return data.DevBatches(lambda: data.iter_eval(files, t.seed, rank, world_size, t.batch_per_worker, t.mask_rate,
                                                  config.model.num_entities, t.eval_batches, pad_to(config),
                                                  t.pad_multiple),
                           keep=t.eval_batches > 0)


@torch.no_grad()
def evaluate(model: EaEModel, dev: data.DevBatches, device, new_step=lambda: None) -> dict[str, float]:
    """The paper's Table 2 metrics on the dev split, with the pretraining masking (seeded, so
    every evaluation sees the same masks): entity accuracy of EntityPred on masked linked
    mentions, token accuracy and perplexity of TokenPred on masked tokens. new_step:
    `step_marker`'s, called before each batch."""
    sums = defaultdict(float)
    model.eval()
    for batch in dev:
        new_step()
        batch = batch.to(device)
        # The spans without their entity ids, as `eae eval masked` (evaluate/masked.py): the
        # metrics need no loss, and the linking losses are softmaxes over all N entities (the
        # memory's and EntityPred's: ~90% of an evaluation batch's time on an H200 at 100k
        # entities, docs/performance.md). With the sharded table every worker drops them alike,
        # so the workers make the same table calls. The metrics read the ids from batch.mentions.
        out = model(batch.input_ids, batch.attention_mask, mentions=batch.mentions.spans(),
                    mlm_labels=batch.mlm_labels, validate=False, indices=batch.indices)  # checked by data.collate
        add_masked_prediction(sums, model, out, batch.input_ids, batch.mentions, batch.mlm_labels)
    model.train()
    metrics = masked_prediction_metrics(_sum_over_workers({k: sums[k] for k in SUM_KEYS}))
    return {f"dev/{k}": v for k, v in metrics.items()}  # dev/entity_accuracy, dev/token_accuracy, dev/perplexity


def train_loop_per_worker(config_dict: dict) -> None:
    """What Ray Train runs on every worker: set up (resuming from Ray Train's last checkpoint),
    train until train.max_steps, then write the final model (train.out) and end the MLflow run;
    or, where train.time_budget_s runs out first, pause at a checkpoint."""
    trainer = Trainer(config_dict)
    if trainer.fit():
        trainer.pause()
    else:
        trainer.finish()


class Trainer:
    """One worker's pretraining. `__init__` sets up: the model and its optimizer, this worker's
    rows of the entity table, the data stream, the state of a resumed run. `fit` then takes
    the steps: `train_step`, every train.log_every steps `log_window`, every
    train.checkpoint_every steps `evaluate_dev` and `save_checkpoint`. Every worker runs the
    same collectives in the same order; rank 0 alone holds the MLflow tracker and says the
    progress lines."""

    def __init__(self, config_dict: dict):
        import ray.train
        import ray.train.torch

        self.config = config = PretrainConfig.from_dict(config_dict)
        t = config.train
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        if self.rank == 0:  # the one rank whose lines the user sees (job.run's relay)
            attach(config_dict.get("progress"))
        self.device = device = ray.train.torch.get_device()
        if device.type == "cuda":
            # the current device is where the loop's reductions put their tensors (NCCL: one GPU
            # per rank); with several GPUs visible to each worker it must be this rank's
            torch.cuda.set_device(device)

        self._build_model()
        self.progress = self._resume()
        self.tracker = self._open_tracker(config_dict)

        files = shard_files(t.data, "train")  # at least one: checks.check_data ran on the driver
        # the ids of the examples each step consumed (tests, audits): record_examples
        self.trace = Path(t.storage_path) / t.name / f"examples-rank{self.rank}.jsonl"
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                         else torch.autocast("cpu", enabled=False))
        self.profiler = StepProfiler(parse_steps(t.profile_steps), self.trace.parent / f"profile-rank{self.rank}.txt",
                                     device)
        self.new_step = step_marker(config, device)
        self.model.train()
        self.window, self.window_start = defaultdict(float), time.perf_counter()
        self.stream = self._batches(files)
        self.dev = dev_batches(config, self.rank, self.world_size)
        self.gc_timer = GcTimer()
        self.lag = GpuLag(device)  # how far the GPU runs behind the host (gpu_lag_s)
        # With several workers: the step's time in the table's exchanges and in the wait for the
        # gradients' all-reduces, logged per window (exchange_s, grad_sync_wait_s)
        self.spans = SpanTimer(device) if self.world_size > 1 else None
        if self.spans is not None and self.model.entity_table is not None:
            self.model.entity_table.timer = self.spans
        self.started = time.perf_counter()  # train.time_budget_s counts from here

    def _build_model(self) -> None:
        """The model on this worker's device, its replicated and table parameters, the
        gradients' sync over workers, Adam and the learning-rate schedule."""
        t = self.config.train
        self.model = compile_stacks(build_model(self.config).to(self.device), self.config)
        replicated, table = state.split_params(self.model)
        self.replicated, self.table = list(replicated.values()), list(table.values())
        # all-reduces during each backward (train.grad_sync); self.forward is the model or its DDP
        self.forward, self.sync = averaged(self.model, replicated, table, t.grad_sync)
        self.optimizer, self.scheduler = build_optimizer(self.model, t, self.device)

    def _resume(self) -> dict:
        """Where the run stands (step, epoch, step_in_epoch, mlflow_run_id): from Ray Train's last
        checkpoint, whose weights, Adam state and schedule it restores, if there is one."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return {"step": 0, "epoch": 0, "step_in_epoch": 0, "mlflow_run_id": None}
        with checkpoint.as_directory() as d:
            progress = state.load(Path(d), self.rank, self.model, self.optimizer)
        self.scheduler.load_state_dict(progress["scheduler"])
        # The optimizer's lr is only refreshed by scheduler.step(): set the restored one now,
        # or the first step after resuming would use the step-0 warmup lr.
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        return progress

    def _open_tracker(self, config_dict: dict):
        """Rank 0's MLflow Tracker; None on the other ranks."""
        if self.rank != 0:
            return None
        from eae_platform.tracking import Tracker

        t = self.config.train
        # the run job.run opened (and ends FAILED or KILLED if this loop never gets to close it)
        tracker = Tracker(t.experiment, run_id=config_dict["mlflow_run_id"], uri=t.mlflow_uri,
                          close_wait_s=MLFLOW_CLOSE_WAIT_S)
        self.progress["mlflow_run_id"] = tracker.run_id
        return tracker

    def _batches(self, files: list):
        """This worker's (epoch, step_in_epoch, batch, counts) for the steps left, from where the
        run stands: each epoch's batches read and collated in prefetch threads; counts, the
        table's mention counts on every worker, exchanged ahead of the step (with_table_counts)
        when the table is split over several workers, else None."""
        t, rank, world_size = self.config.train, self.rank, self.world_size
        cache = {} if data.caches(files, t.cache_data) else None

        def open_epoch(epoch: int, skip: int):
            return data.prefetch(
                data.iter_epoch(files, t.seed, epoch, rank, world_size, t.batch_per_worker, t.mask_rate,
                                self.config.model.num_entities, skip, pad_to(self.config), cache,
                                shuffle=t.shuffle_rows, pad_multiple=t.pad_multiple),
                t.prefetch_batches, pin_for=self.device if self.device.type == "cuda" else None)

        def steps_in(epoch: int) -> int:
            return data.steps_per_epoch(files, t.seed, epoch, world_size, t.batch_per_worker)

        stream = data.iter_epochs(open_epoch, steps_in, self.progress["epoch"], self.progress["step_in_epoch"])
        ahead = world_size > 1 and self.model.entity_table is not None
        # new_group is a collective: every worker creates it here, after build_model's groups
        stream = with_table_counts(stream, self.model, dist.new_group(backend="gloo") if ahead else None,
                                   t.max_steps - self.progress["step"])
        if ahead:
            stream = data.prefetch(stream, t.prefetch_batches)
        return stream

    def fit(self) -> bool:
        """Train until train.max_steps. Returns True where train.time_budget_s ran out first:
        the run stopped at a step's checkpoint, to be resumed by a relaunch."""
        t = self.config.train
        first = self.progress["step"] + 1  # this process's first step (after a resume too)
        out_of_time = False
        # closing: an early stop or an error ends the prefetch threads
        with closing(self.stream), closing(self.gc_timer), StallWatch(t.stall_report_s, say) as watch:
            while self.progress["step"] < t.max_steps and not out_of_time:
                step = self.progress["step"] + 1
                self.profiler.before(step)
                epoch, step_in_epoch, host, counts = self.next_batch()
                metrics = self.train_step(host, counts)
                self.profiler.after(step)
                self.record_examples(step - 1, epoch, host)
                self.progress.update(step=step, epoch=epoch, step_in_epoch=step_in_epoch + 1)
                watch.beat(step)
                self.add_to_window(metrics)
                if step == first:  # optimizer state now exists: the table's steady footprint
                    self.log_table_memory(step)
                if step % t.log_every == 0 or step == t.max_steps:
                    self.log_window(step)
                    out_of_time = step < t.max_steps and out_of_time_on_any_worker(t, self.started)
                scheduled = step % t.checkpoint_every == 0 or step == t.max_steps
                if scheduled or out_of_time:
                    # a pause's checkpoint skips the evaluation: dev curves keep their schedule
                    self.save_checkpoint(step, self.evaluate_dev(step) if scheduled else {})
                    watch.beat(step)  # an evaluation and a checkpoint are not a stall
        return out_of_time

    def next_batch(self) -> tuple:
        """The stream's next (epoch, step_in_epoch, batch, counts); the wait for it goes to
        the window's data_wait_s."""
        waited = time.perf_counter()
        item = next(self.stream)
        # How long the step waited for its batch: > 0 only when reading and collating (in
        # the prefetch threads) fall behind the GPU.
        self.window["data_wait_s"] += time.perf_counter() - waited
        return item

    def train_step(self, host: data.Batch, counts) -> dict:
        """One step on this worker's batch (`host`, in host memory; `counts`: with_table_counts').
        Returns its metrics: tokens (not padding), loss, loss_<head> and grad_norm, the last
        ones 0-d tensors left on the device until the window's log: a float() here would make
        the host wait for the GPU at every step."""
        # From pinned memory the copy joins the GPU's queue: the host goes on launching.
        batch = host.to(self.device, non_blocking=self.device.type == "cuda")
        # Before the forward: here its host time runs while the GPU finishes the last step.
        self.optimizer.zero_grad(set_to_none=True)
        self.new_step()
        if counts is not None:
            self.model.entity_table.expect(counts)
        with self.autocast:
            # checked on the host by data.collate, which also found the indices: no host sync
            out = self.forward(batch.input_ids, batch.attention_mask, mentions=batch.mentions,
                             mlm_labels=batch.mlm_labels, validate=False, indices=batch.indices)
        out.loss.backward()
        grad_norm = sync_and_clip(self.sync, self.replicated, self.table, self.config.train.grad_clip, self.spans)
        self.optimizer.step()
        self.scheduler.step()
        self.lag.mark()
        return {"tokens": host.num_tokens, "loss": out.loss.detach(),
                **{f"loss_{name}": value.detach() for name, value in out.losses.items()}, "grad_norm": grad_norm}

    def record_examples(self, step: int, epoch: int, host: data.Batch) -> None:
        """Append the ids of the contexts this worker trained on at `step` (0-based) to its trace."""
        with storage.writing(f"its example trace {self.trace}", step + 1, self.rank):  # step + 1 steps trained
            storage.append_record(self.trace, {"step": step, "epoch": epoch, "pid": os.getpid(),
                                               "ids": host.context_ids.tolist()})

    def add_to_window(self, metrics: dict) -> None:
        """Add a step's metrics to the window's sums."""
        self.window["steps"] += 1
        for key, value in metrics.items():
            self.window[key] += value

    def log_table_memory(self, step: int) -> None:
        """Log the entity table's footprint per worker (memory_metrics) and say it."""
        table_gib = memory_metrics(self.table, self.optimizer, self.device)["table_gib_per_worker"]
        if self.tracker is not None:
            self.tracker.log_metrics({"train/table_gib_per_worker": table_gib}, step)
            say(f"entity table per worker (rows + grad + Adam state): {table_gib:.3f} GiB")

    def log_window(self, step: int) -> None:
        """Log the window of steps since the last log (window_metrics) to MLflow as
        train/<name> (<split>/<metric>, as every stage) and to Ray Train, say its progress
        line, and start the next window."""
        import ray.train

        self.window["gc_s"] = self.gc_timer.take()
        metrics = self.window_metrics(memory_metrics(self.table, self.optimizer, self.device))
        if self.tracker is not None:
            self.tracker.log_metrics({f"train/{k}": v for k, v in metrics.items()}, step)
            say(progress_line(step, metrics))
        ray.train.report({"step": step, **metrics})
        self.window, self.window_start = defaultdict(float), time.perf_counter()

    def window_metrics(self, extra: dict[str, float]) -> dict[str, float]:
        """The window's metrics over all workers: its mean losses and gradient norm, throughput
        (tokens/s counts the non-padding tokens of all workers; the first window includes
        start-up: kernel autotuning, the first reads), the slowest worker's waits, the GPU's
        lag, the lr, plus `extra` (memory_metrics).

        The window's clock stops when the GPU has finished its steps (lag.take() waits for that),
        not when the host has launched them: a host running ahead of its GPU would otherwise leave
        the GPU's last lag out of the window. `launch_time_s` is the figure earlier runs reported:
        until the host had launched the steps, which with several workers came after `extra`'s
        all-reduce had waited for the GPU, and with one did not (its step read ~6% fast on an H100)."""
        window = self.window
        launched = time.perf_counter() - self.window_start
        gpu_lag = self.lag.take()
        seconds = time.perf_counter() - self.window_start
        n = max(window["steps"], 1)
        if self.spans is not None:  # after lag.take(): the stream has passed every span
            timed = self.spans.take()
            window["exchange_s"], window["grad_sync_wait_s"] = timed.get("exchange", 0.0), timed.get("grad_sync_wait", 0.0)
        metrics = {k: float(v) / n for k, v in window.items() if k.startswith("loss") or k == "grad_norm"}
        tokens = _sum_over_workers({"tokens": window["tokens"]})["tokens"]
        # the slowest worker's waits set the pace of every step (the collectives wait for it): for
        # its batch, in Python's garbage collections (GcTimer) and in collectives (SpanTimer)
        waits = ("data_wait_s", "gc_s") + (("exchange_s", "grad_sync_wait_s") if self.spans is not None else ())
        metrics.update(_max_over_workers({key: window[key] / n for key in waits}))
        if gpu_lag is not None:  # the least of the workers': the most host-bound one
            metrics.update(_reduce_over_workers({"gpu_lag_s": gpu_lag}, dist.ReduceOp.MIN if _distributed() else None))
        metrics.update(tokens_per_s=tokens / seconds, step_time_s=seconds / n, launch_time_s=launched / n,
                       lr=self.scheduler.get_last_lr()[0])
        metrics.update(extra)
        return metrics

    def evaluate_dev(self, step: int) -> dict[str, float]:
        """The dev metrics (`evaluate`), logged to MLflow and said."""
        metrics = evaluate(self.model, self.dev, self.device, self.new_step)
        if self.spans is not None:
            self.spans.take()  # the evaluation's exchanges are no step's
        if self.tracker is not None and metrics:
            self.tracker.log_metrics(metrics, step)
            say(progress_line(step, metrics))
        return metrics

    def save_checkpoint(self, step: int, metrics: dict[str, float]) -> None:
        """Report this worker's part of a checkpoint (state.save: its rows of the table and their
        Adam state; rank 0 also the replicated weights, their Adam state and where the run
        stands) to Ray Train, with the step's dev metrics."""
        import ray.train
        from ray.train import Checkpoint

        with tempfile.TemporaryDirectory() as d:
            state.save(Path(d), self.rank, self.model, self.optimizer,
                       {**self.progress, "scheduler": self.scheduler.state_dict(), "config": self.config.to_dict()})
            # Ray Train copies the files into the run's storage here: a refused copy stops the run
            with storage.writing(f"its part of the checkpoint of step {step}", step, self.rank):
                ray.train.report({"step": step, **metrics}, checkpoint=Checkpoint.from_directory(d))

    def pause(self) -> None:
        """End a run whose time budget or deadline came: its MLflow run KILLED, tagged with the step."""
        t = self.config.train
        if self.tracker is not None:
            limits = []
            if t.time_budget_s is not None:
                limits.append(f"time budget of {t.time_budget_s:g} s")
            if t.deadline is not None:
                limits.append(f"deadline {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t.deadline))}")
            say(f"out of time ({' / '.join(limits)}): paused at step {self.progress['step']} of {t.max_steps}; "
                f"relaunch with the same name ({t.name}) to continue")
            self.tracker.set_tags({"eae.paused_at_step": self.progress["step"]})
            self.tracker.close("KILLED")

    def finish(self) -> None:
        """End a run that took all its steps: the final model (train.out), the MLflow run closed."""
        if self.config.train.out:
            _save_final(self.model, self.config, self.rank, Path(self.config.train.out))
        if self.tracker is not None:
            self.tracker.close()


def out_of_time_on_any_worker(train, started: float) -> bool:
    """Whether train.time_budget_s has run out since `started` (perf_counter), or the clock has
    reached train.deadline, on any worker: every worker gets the same answer (a max over
    workers: their clocks may differ), so all stop at the same step."""
    if train.time_budget_s is None and train.deadline is None:
        return False  # no collective: the answer is the same everywhere
    over = (train.time_budget_s is not None and time.perf_counter() - started >= train.time_budget_s) or \
        (train.deadline is not None and time.time() >= train.deadline)
    return _max_over_workers({"out_of_time": float(over)})["out_of_time"] > 0


def _save_final(model: EaEModel, config: PretrainConfig, rank: int, out: Path) -> None:
    """The model directory that serving and evaluation load (eae_model.checkpoint.load_model):
    replicated weights and config from rank 0, each rank's entity rows in its own file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    replicated, table = state.split_params(model)
    if table:
        save_file({n: p.detach().cpu().contiguous() for n, p in table.items()},
                  str(out / f"entities-{rank:05d}.safetensors"))
    if rank == 0:
        save_file({n: p.detach().cpu().contiguous() for n, p in replicated.items()}, str(out / "model.safetensors"))
        (out / "config.json").write_text(config.model.to_json() + "\n")
        # The entity vocabulary travels with the model (and so with a registered MLflow model):
        # ids -> titles for serving, answer strings -> ids for QA fine-tuning.
        for name in VOCAB_FILES:
            if (Path(config.train.data) / name).is_file():
                shutil.copyfile(Path(config.train.data) / name, out / name)
