"""Driver side of pretraining: a TorchTrainer over the workers, then the MLflow bookkeeping
that needs the finished run (checkpoint artifacts, the registered model).

Relaunching with the same `train.name` and `train.storage_path` resumes from the last
checkpoint (Ray Train V2 restores it into `ray.train.get_checkpoint()`); a worker crash
restarts the workers from the last checkpoint up to `train.max_failures` times.
"""

from __future__ import annotations

import json
from pathlib import Path

from eae_platform.pretrain.config import PretrainConfig
from eae_platform.pretrain.loop import train_loop_per_worker
from eae_platform.tracking import Tracker, tracking_uri


def run(config: PretrainConfig) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = config.train
    # Paths every worker reads or writes: absolute, so they survive a job's working dir.
    t.data = str(Path(t.data).resolve())
    t.storage_path = str(Path(t.storage_path).resolve())
    if t.out:
        t.out = str(Path(t.out).resolve())
    # Resolved here: workers run in other directories, where the default would name another store.
    t.mlflow_uri = t.mlflow_uri or tracking_uri()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config.to_dict(),
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker={"CPU": t.cpus_per_worker, **({"GPU": 1} if t.use_gpu else {})},
        ),
        torch_config=TorchConfig(backend="nccl" if t.use_gpu else "gloo"),
        run_config=RunConfig(name=t.name, storage_path=t.storage_path, failure_config=FailureConfig(max_failures=t.max_failures)),
    )
    result = trainer.fit()
    summary = {"checkpoint": result.checkpoint.path if result.checkpoint else None, "metrics": result.metrics,
               "model": t.out, "storage": str(Path(t.storage_path) / t.name)}
    if result.checkpoint is not None:
        summary.update(_finish_mlflow(config, Path(result.checkpoint.path)))
    return summary


def _finish_mlflow(config: PretrainConfig, checkpoint: Path) -> dict:
    t = config.train
    state = json.loads((checkpoint / "state.json").read_text())
    tracker = Tracker(t.experiment, run_id=state["mlflow_run_id"], uri=t.mlflow_uri)
    tracker.log_artifacts(str(checkpoint), f"checkpoints/{checkpoint.name}")
    model_uri = None
    if t.out and t.register_as:
        model_uri = tracker.register_model(t.out, t.register_as, t.alias)
    report = tracker.close()
    return {"mlflow_run_id": state["mlflow_run_id"], "mlflow_uri": t.mlflow_uri, "model_uri": model_uri,
            "mlflow_unsent": report}
