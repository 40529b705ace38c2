"""What `eae pretrain` checks on the driver before it starts Ray, and the model sizes it takes
from the data (and the GPU warning that `eae finetune` and `eae eval` share). Light on purpose
(no torch, no MLflow, no Ray: they take ~2 s to import): bad data is a clear error in under a
second."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eae_data.shards import rows_per_rank, shard_files
from eae_platform.preprocess.build import read_manifest
from eae_platform.pretrain.config import PretrainConfig
from eae_platform.pretrain.storage import check_output_dir, check_writable, made_for_now


def check_data(config: PretrainConfig) -> dict:
    """The data directory checked on the driver, before any worker starts: a clear error here
    instead of a worker's traceback through Ray Train minutes later (a context longer than the
    model's positions fails only at the first batch that holds one). Returns its manifest."""
    t, m = config.train, config.model
    if not (Path(t.data) / "manifest.json").is_file():
        raise FileNotFoundError(_not_built(Path(t.data)))
    files = shard_files(t.data, "train")
    if not files:
        raise ValueError(f"{t.data}: no training shards under shards/train; build the data with `eae data build`")
    shard_files(t.data, "dev")  # a dev file that is not Parquet: named here, not by a worker at its first evaluation
    manifest = read_manifest(t.data)
    longest = manifest.get("settings", {}).get("max_length")
    if longest is not None and longest > m.max_length:
        raise ValueError(f"{t.data} was built with contexts of up to {longest} wordpieces (--max-length {longest}), "
                         f"more than model.max_length={m.max_length}: set model.max_length={longest} or rebuild "
                         f"the data with --max-length {m.max_length}")
    if t.init_encoder:  # its shape against the model's, before any worker loads it
        from eae_model.pretrained import check_encoder

        check_encoder(m, t.init_encoder)
    rows = sorted(rows_per_rank(files, t.seed, 0, t.num_workers))
    if rows[0] < t.batch_per_worker:  # data.steps_per_epoch would be 0: the workers' loop refuses it
        fits = rows[0] * t.num_workers
        raise ValueError(
            f"batch_size {t.batch_size} over {t.num_workers} worker(s) needs {t.batch_per_worker:,} training contexts "
            f"per worker, but {t.data} deals its {sum(rows):,} ({len(files)} file(s), whole files per worker) as "
            f"{', '.join(f'{n:,}' for n in rows)}: use " + (f"--batch-size {fits}" if fits else "a smaller --batch-size")
            + (" or fewer workers" if t.num_workers > 1 else "")
            + (" or rebuild with a smaller --shard-rows" if len(files) < t.num_workers else ""))
    return manifest


def _not_built(data: Path) -> str:
    """What to run for a --data directory without shards. `eae data synth` and `eae data vital`
    write a dump (world.xml, vital.xml), not shards: `--data runs/world` right after the quick
    start's `eae data synth` was told to run `eae data synth`, what had made it."""
    dumps = sorted(data.glob("*.xml")) if data.is_dir() else []
    if dumps:
        return (f"{data}: no manifest.json; it holds a dump ({dumps[0].name}), not shards: build them with "
                f"`eae data build --dump {dumps[0]} --out DIR`, then give --data DIR")
    return f"{data}: no manifest.json; build the data with `eae data build`"


def check_out(config: PretrainConfig) -> None:
    """`train.out` made a directory and written to once (what was made, removed again): the
    workers write the final model there after the last step, and a path that cannot be one (a
    file, under a file, a read-only place) failed the whole run there, with Ray's traceback."""
    if config.train.out:
        check_output_dir(config.train.out, "--out (train.out)", "the final model")


def check_storage(config: PretrainConfig) -> None:
    """`train.storage_path` (the run's directory under it, when the run is named) made and
    written to now, and what was made removed again (job.run makes it before Ray Train starts):
    a path that cannot be a directory (under /proc, under a file) was a bare `[Errno 2] No such
    file or directory` after the local Ray cluster had started. A storage that refuses writes
    (read-only, permissions) stays check_writable's CheckpointStorageError, its own paragraph."""
    t = config.train
    run_dir = Path(t.storage_path) / t.name if t.name else Path(t.storage_path)
    try:
        with made_for_now(run_dir):
            check_writable(run_dir)
    except OSError as error:
        raise ValueError(f"train.storage_path {t.storage_path}: checkpoints cannot be written there "
                         f"({error.strerror}: {error.filename}); give a directory that can be") from None


def check_job_paths(config: PretrainConfig) -> None:
    """Inside a `ray job submit --working-dir` job, relative paths refused: the job runs in a
    copy of the tree without what git ignores, deleted with the cluster's session, so relative
    data named nothing there and the model, the checkpoints and a SQLite store (the default
    `mlflow.db` too) went into that copy, printed but lost."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
    if not job.get("working_dir"):
        return
    t = config.train
    uri = t.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    given = {"train.data (--data)": t.data, "train.out (--out)": t.out, "train.storage_path": t.storage_path,
             "train.mlflow_uri (else MLFLOW_TRACKING_URI)": uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None}
    relative = [f"{key} {value}" for key, value in given.items() if value and not Path(value).is_absolute()]
    if relative:
        raise ValueError(f"a job runs in a copy of the tree without runs/ and mlflow.db, deleted with it: give "
                         f"{', '.join(relative)} as absolute paths (e.g. $PWD/...)")


def data_fitted_overrides(config: PretrainConfig, config_file: str | None, overrides: list[str]) -> list[str]:
    """`model.max_length` and `model.num_entities` set to what the data was built with (its
    contexts' longest length, its entity vocabulary), for those that neither the config file's
    `model:` section nor an override sets: a preset's own sizes rarely match a user's data."""
    import yaml

    from eae_platform.pretrain.config import parse_override

    if not config.train.data or not (Path(config.train.data) / "manifest.json").is_file():
        return []
    given = {parse_override(o)[0] for o in overrides}
    if config_file:
        given |= {f"model.{k}" for k in (yaml.safe_load(Path(config_file).read_text()) or {}).get("model") or {}}
    manifest = read_manifest(config.train.data)
    built = {"model.max_length": manifest.get("settings", {}).get("max_length"),
             "model.num_entities": manifest.get("counts", {}).get("entities")}
    return [f"{k}={v}" for k, v in built.items() if v and k not in given and v != getattr(config.model, k.removeprefix("model."))]


def ray_data_cpu_note(config: PretrainConfig, cluster_cpus: float) -> str | None:
    """A warning when the workers would hold every CPU of the cluster while Ray Data still has
    tasks to run (training data streamed from Parquet: train.cache_data off, or a split over
    data.CACHE_MAX_BYTES; an unbounded evaluation, train.eval_batches=0): each of its read tasks
    needs a CPU of its own and would wait for one forever. None when there is no such task or a
    CPU is left (an autoscaling cluster may still add one: a warning, not an error)."""
    from eae_platform.pretrain.data import caches

    t = config.train
    cached = caches(shard_files(t.data, "train"), t.cache_data)
    taken = t.cpus_per_worker * t.num_workers
    if (cached and t.eval_batches > 0) or cluster_cpus - taken >= 1:
        return None
    return (f"warning: {t.num_workers} worker(s) x train.cpus_per_worker={t.cpus_per_worker:g} take {taken:g} of the "
            f"cluster's {cluster_cpus:g} CPUs, and Ray Data's read tasks ("
            + ("training data streamed from Parquet" if not cached else "the whole dev split, train.eval_batches=0")
            + ") each need one: they would wait for a CPU forever. Lower train.cpus_per_worker or add a node.")


def gpu_wait_note(asked: str, needed: float, cluster_gpus: float, fix: str) -> str | None:
    """A warning when a run asks for more GPUs than the Ray cluster has (a GPU setting on a
    machine without one): Ray waits for them without a word, forever where no node with GPUs
    will join. A warning, not an error: an autoscaling cluster adds GPU nodes when asked (Ray's
    resources show only the nodes up now). None when they fit."""
    if cluster_gpus >= needed:
        return None
    return (f"warning: {asked} need {needed:g} GPU(s) and this Ray cluster has {cluster_gpus:g}: the run waits until "
            f"nodes with GPUs join. Without a GPU, run with {fix} (Ctrl-C stops this one).")


def gpu_note(config: PretrainConfig, cluster_gpus: float) -> str | None:
    """gpu_wait_note for the training workers (train.use_gpu)."""
    t = config.train
    if not t.use_gpu:
        return None
    return gpu_wait_note(f"{t.num_workers} worker(s) x train.gpus_per_worker={t.gpus_per_worker:g}",
                         t.num_workers * t.gpus_per_worker, cluster_gpus, "--set train.use_gpu=false")
