"""Driver side of pretraining: a TorchTrainer over the workers, then the MLflow bookkeeping
that needs the finished run (checkpoint artifacts, the registered model).

Relaunching with the same `train.name` and `train.storage_path` resumes from the last
checkpoint (Ray Train V2 restores it into `ray.train.get_checkpoint()`); a worker crash
restarts the workers from the last checkpoint up to `train.max_failures` times.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

from eae_platform.preprocess.build import read_manifest
from eae_platform.pretrain import storage
from eae_platform.pretrain.checks import check_data, gpu_note, ray_data_cpu_note
from eae_platform.pretrain.config import PretrainConfig
from eae_platform.pretrain.loop import MLFLOW_CLOSE_WAIT_S, train_loop_per_worker
from eae_platform.progress import relay
from eae_platform.ray_session import noting_sigint
from eae_platform.tracking import Tracker, alias_version, tracking_uri


def vocabulary_note(config: PretrainConfig, manifest: dict | None = None) -> str | None:
    """What a table smaller than the data's entity vocabulary does to the data (`data.collate`
    makes those mentions unlinked), or None when the table holds every entity. manifest: the
    data's, if already read."""
    manifest = manifest if manifest is not None else read_manifest(config.train.data)
    entities = manifest.get("counts", {}).get("entities")
    n = config.model.num_entities
    if entities is None or entities <= n:
        return None
    return (f"note: {config.train.data} has {entities:,} entities, the model's table {n:,}: mentions of entity ids "
            f">= {n:,} are trained as unlinked")


# Settings a relaunch may change and still continue its run exactly: how long and how it is
# run, logged and kept, not what it computes.
RESUMABLE_CHANGES = {"max_steps", "time_budget_s", "deadline", "out", "register_as", "alias", "log_every", "checkpoint_every",
                     "eval_batches", "profile_steps", "mlflow_uri", "experiment", "max_failures", "cpus_per_worker",
                     "gpus_per_worker", "prefetch_batches", "cache_data", "placement_strategy", "stall_report_s"}


def last_checkpoint_state(storage_path: str, name: str) -> tuple[Path, dict] | None:
    """The checkpoint a relaunch of run `name` resumes and its state.json, or None: the latest
    one Ray Train registered (its checkpoint_manager_snapshot.json, rewritten at each
    registration). Not the newest checkpoint_* folder on disk: Ray registers a checkpoint only
    after the workers have written it and the controller has taken their reports (one per
    health check, 2 s), so a run killed in between leaves a newer folder that Ray does not resume."""
    run_dir = Path(storage_path) / name
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    latest = None
    for _ in range(50):  # a read that meets Ray's rewrite of a live run's snapshot is retried
        try:
            latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result") if snapshot.is_file() else None
            break
        except ValueError:
            time.sleep(0.01)
    state = run_dir / latest["checkpoint_dir_name"] / "state.json" if latest else None
    return (state.parent, json.loads(state.read_text())) if state and state.is_file() else None


def config_changes(saved: dict, config: PretrainConfig) -> list[str]:
    """`section.key: saved -> now` for every setting that differs from a checkpoint's config,
    except those a relaunch may change (RESUMABLE_CHANGES)."""
    now = config.to_dict()
    changes = []
    for section in ("model", "train"):
        for key in sorted(set(saved.get(section, {})) | set(now[section])):
            if section == "train" and key in RESUMABLE_CHANGES | {"name"}:
                continue
            before, after = saved.get(section, {}).get(key), now[section].get(key)
            if before != after:
                changes.append(f"{section}.{key}: {before!r} -> {after!r}")
    return changes


def check_resume(config: PretrainConfig, must_exist: bool = False) -> int | None:
    """The step run `train.name` resumes from (None: a new run). A checkpoint made with other
    settings is a clear error that lists them; must_exist (`--resume`): no checkpoint is one."""
    t = config.train
    last = last_checkpoint_state(t.storage_path, t.name)
    if last is None:
        if must_exist:
            raise ValueError(f"run {t.name!r} has no checkpoint under {Path(t.storage_path) / t.name} to resume")
        return None
    path, state = last
    changes = config_changes(state.get("config", {}), config)
    if changes:
        raise ValueError(f"run {t.name!r} has a checkpoint at step {state.get('step')} ({path}) made with other "
                         f"settings: {'; '.join(changes)}. Resume with those settings, or start a new run (leave "
                         "out --name for a fresh one)")
    return state.get("step")


def name_run(config: PretrainConfig, resume: bool = False) -> None:
    """A fresh train.name when none is given; else the check that its checkpoint, if any, was
    made with these settings (`check_resume`). Says which, once."""
    t = config.train
    if not t.name:
        t.name = datetime.now().strftime("pretrain-%Y%m%d-%H%M%S")
        print(f"run name {t.name} (relaunch with --name {t.name} to continue it)", flush=True)
        return
    step = check_resume(config, must_exist=resume)
    if step is not None:
        print(f"resuming run {t.name} from its checkpoint at step {step}", flush=True)


def absolute_paths(config: PretrainConfig) -> None:
    """train.data, train.storage_path and train.out made absolute, in place: every worker reads
    or writes them, in a directory of its own (a job's copy of the tree), and a checkpoint keeps
    them so; a relaunch compares its settings with those (`check_resume`) only once its own are."""
    t = config.train
    t.data = str(Path(t.data).resolve())
    t.storage_path = str(Path(t.storage_path).resolve())
    if t.out:
        t.out = str(Path(t.out).resolve())


def run(config: PretrainConfig, resume: bool = False) -> dict:
    note = vocabulary_note(config, check_data(config))
    if note:
        print(note, flush=True)
    t = config.train
    absolute_paths(config)
    # Resolved here: workers run in other directories, where the default would name another store.
    t.mlflow_uri = tracking_uri(t.mlflow_uri)
    name_run(config, resume)
    storage.check_writable(Path(t.storage_path) / t.name)  # before an MLflow run is opened or Ray Train started
    tracker = open_run(config)
    with tracker:  # an exception ends the MLflow run FAILED, an interrupt or SIGTERM KILLED
        with relay() as channel:  # rank 0's progress lines, printed here (eae_platform.progress)
            try:
                result = _fit(config, channel, tracker.run_id)
            except Exception as error:
                _raise_if_storage_refused(error, config, tracker)
                raise
        step = (result.metrics or {}).get("step")
        paused = step is not None and step < t.max_steps  # train.time_budget_s ran out
        summary = {"checkpoint": result.checkpoint.path if result.checkpoint else None, "metrics": result.metrics,
                   "model": None if paused else t.out, "storage": str(Path(t.storage_path) / t.name),
                   "paused_at_step": step if paused else None}
        if paused:
            tracker.close("KILLED")  # as rank 0 ended it, with the tag eae.paused_at_step
        elif result.checkpoint is not None:
            summary.update(_finish_mlflow(config, tracker, Path(result.checkpoint.path)))
    return summary


def _raise_if_storage_refused(error: Exception, config: PretrainConfig, tracker: Tracker) -> None:
    """When a worker's write under the run's storage was refused (storage.StorageUnwritable),
    a CheckpointStorageError that says so in one paragraph, instead of Ray's traceback; the
    MLflow run gets it and the count of lost steps as tags (it ends FAILED, as every failure)."""
    failure = storage.refused_write(error)
    if failure is None:
        return
    t = config.train
    last = last_checkpoint_state(t.storage_path, t.name)
    message = storage.explain(failure, Path(t.storage_path) / t.name, t.name, last)
    tracker.set_tags({"eae.error": message, "eae.steps_lost": storage.steps_lost(failure, last)})
    raise storage.CheckpointStorageError(message) from error


def open_run(config: PretrainConfig) -> Tracker:
    """The MLflow run of `train.name`, held by the driver (rank 0 logs to it): when a worker
    fails or the job is stopped, Ray kills the workers without any cleanup, and only the driver
    is left to end the run FAILED or KILLED. A relaunch continues the MLflow run of the
    checkpoint it resumes; otherwise a new run, with the config logged."""
    t = config.train
    last = last_checkpoint_state(t.storage_path, t.name)
    run_id = last[1].get("mlflow_run_id") if last else None
    tracker = Tracker(t.experiment, run_name=t.name, run_id=run_id, uri=t.mlflow_uri, close_wait_s=MLFLOW_CLOSE_WAIT_S)
    if run_id is None:
        tracker.log_config(config.to_dict())
    return tracker


def _fit(config: PretrainConfig, channel, mlflow_run_id: str):
    """The TorchTrainer's run; rank 0 sends its progress lines to `channel` (a relay queue) and
    logs to MLflow run `mlflow_run_id`."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = config.train
    resources = ray.cluster_resources()
    for note in (gpu_note(config, resources.get("GPU", 0)), ray_data_cpu_note(config, resources.get("CPU", 0))):
        if note:
            print(note, flush=True)
    trainer = _trainer_class(TorchTrainer)(
        train_loop_per_worker,
        train_loop_config={**config.to_dict(), "progress": channel, "mlflow_run_id": mlflow_run_id},
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker={"CPU": t.cpus_per_worker, **({"GPU": t.gpus_per_worker} if t.use_gpu else {})},
            placement_strategy=t.placement_strategy,
        ),
        torch_config=TorchConfig(backend="nccl" if t.use_gpu else "gloo"),
        run_config=RunConfig(name=t.name, storage_path=t.storage_path, failure_config=FailureConfig(max_failures=t.max_failures)),
    )
    return trainer.fit()


def _trainer_class(torch_trainer: type) -> type:
    """TorchTrainer without two of the actors Ray Train 2.60 starts for every run, which
    pretraining does not use: the DatasetManager (Ray Data's shards, made even for a trainer
    given no datasets; our workers read their own shards, eae_platform.pretrain.data) and the
    detached PlacementGroupCleaner (it frees the run's placement group if the controller dies
    while its driver lives on; the placement group is the job's, and `eae pretrain` is a job of
    its own that ends with the run, so Ray frees it then). Each is a process importing ray.train,
    ~3 CPU-seconds a launch on a 2-core machine (docs/perf/test-durations-cpu-2026-12-05.txt).
    Ray Train has no switch for either: this filters its default callbacks, a private method,
    so tests/eae_platform/test_multinode.py (which lists a run's actors) fails if a Ray upgrade
    renames what it relies on."""
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class PretrainTrainer(torch_trainer):
        def _create_default_callbacks(self):
            unused = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
            return [c for c in super()._create_default_callbacks() if not isinstance(c, unused)]

        def _register_sigint_handler(self, controller):
            # Ray Train's Ctrl-C handler (abort the run, sys.exit) ends fit() as a failure does,
            # with Ray's SystemExit(1); Ray has no hook to tell it apart. Chained behind one that
            # notes the signal, so that `eae` says it was interrupted and exits 130 (cli.main).
            super()._register_sigint_handler(controller)
            signal.signal(signal.SIGINT, noting_sigint(signal.getsignal(signal.SIGINT)))

        def fit(self):
            # Ray Train leaves its handler in place after fit(): a Ctrl-C while the model is
            # logged to MLflow and registered would "abort" a run already over (a call to its
            # dead controller, then sys.exit). The handler before fit() comes back.
            previous = signal.getsignal(signal.SIGINT)
            try:
                return super().fit()
            finally:
                if previous is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGINT, previous)

    return PretrainTrainer


def _finish_mlflow(config: PretrainConfig, tracker: Tracker, checkpoint: Path) -> dict:
    t = config.train
    tracker.log_artifacts(str(checkpoint), f"checkpoints/{checkpoint.name}")
    model_uri = None
    moved = {}
    if t.out and t.register_as:
        before = alias_version(t.mlflow_uri, t.register_as, t.alias)
        model_uri = tracker.register_model(t.out, t.register_as, t.alias)
    report = tracker.close()
    if model_uri:
        moved = {"alias_version": alias_version(t.mlflow_uri, t.register_as, t.alias), "alias_was": before}
    return {"mlflow_run_id": tracker.run_id, "mlflow_uri": t.mlflow_uri, "model_uri": model_uri,
            "mlflow_unsent": report, **moved}

