"""Is a paused and relaunched pretraining the run it would have been? One recipe (the GPU study's
switches: the entity table and memory at 10x the lr, rows shuffled) on a small synthetic world,
trained --straight times straight through and once paused --pauses times (train.time_budget_s:
each launch stops at its first log window) and relaunched, all with one seed. Prints each run's
training loss at every log window and each run's largest weight difference from the first.

On a CPU the paused run is the straight one, bit for bit (also tests/eae_platform/test_pretrain.py).
On a GPU no two runs are (CUDA's reductions), so read the paused run's distance from the first
against the other straight runs' distance from it: a resume that lost state (an Adam group's lr,
its moments) parts far more.

    python experiments/pause_check.py --out /tmp/pause-check                    # CPU, `tiny`
    python experiments/pause_check.py --out /tmp/pc --device gpu --preset medium --set train.compile=false

Runs an earlier call finished (their models saved under --out) are read, not trained again.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from eae_data.synth.output import write_world
from eae_platform.ray_session import connect


def store(out: Path) -> str:
    """The MLflow store every run of the check logs to: SQLite, or where SQLAlchemy is missing (the
    GPU machine's wheels: MLflow there refused a sqlite URI) a file store, as the regime study's."""
    if importlib.util.find_spec("sqlalchemy"):
        return f"sqlite:///{out / 'mlflow.db'}"
    return (out / "mlruns").as_uri()


def build_world(out: Path, entities: int) -> Path:
    """A synthetic world of `entities` (seed 0) and its shards, under out (kept between calls)."""
    from eae_platform.preprocess.build import build, synthetic_settings

    data = out / "data"
    if not (data / "manifest.json").is_file():
        write_world(out / "world", entities, seed=0)
        build(synthetic_settings([str(out / "world" / "world.xml")], str(data)))
    return data


def pretrain(args, data: Path, name: str, *extra: str) -> dict:
    from eae_platform.pretrain.config import load_pretrain_config
    from eae_platform.pretrain.job import run

    out = args.out
    device = (["train.use_gpu=true", "train.gpus_per_worker=0.3", "train.cpus_per_worker=1"] if args.device == "gpu"
              else ["train.use_gpu=false", "train.cpus_per_worker=0.5"])
    overrides = [
        f"model.num_entities={args.entities}", "model.max_length=128", f"train.data={data}",
        f"train.storage_path={out / 'ray'}", f"train.name={name}", f"train.out={out / 'models' / name}",
        f"train.batch_size={args.batch}", f"train.max_steps={args.steps}", "train.lr=1e-3", "train.num_workers=1",
        f"train.log_every={args.log_every}", f"train.checkpoint_every={args.log_every}", "train.eval_batches=1",
        "train.memory_lr_scale=10", "train.shuffle_rows=true", f"train.seed={args.seed}", "train.register_as=null",
        f"train.mlflow_uri={store(out)}", *device, *args.set, *extra]
    return run(load_pretrain_config(None, overrides, preset=args.preset))


def finished(out: Path, name: str) -> str | None:
    """The MLflow run id of run `name` if an earlier call trained it to the end (its model saved)."""
    from mlflow.tracking import MlflowClient

    if not (out / "models" / name / "config.json").is_file():
        return None
    client = MlflowClient(store(out))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], f"attributes.run_name = '{name}'")
    return runs[0].info.run_id if runs else None


def losses(out: Path, run_id: str) -> dict[int, float]:
    """{step: training loss} of an MLflow run, each log window's."""
    from mlflow.tracking import MlflowClient

    return {m.step: m.value for m in MlflowClient(store(out)).get_metric_history(run_id, "train/loss")}


def largest_difference(a: Path, b: Path) -> tuple[float, str]:
    """The largest absolute difference of any weight of two saved models, and its name."""
    from eae_model.checkpoint import load_model

    x, y = load_model(a).state_dict(), load_model(b).state_dict()
    return max(((x[n].float() - y[n].float()).abs().max().item(), n) for n in x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the world, the runs, their store and models")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--entities", type=int, default=600)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--straight", type=int, default=2, help="runs straight through (>= 1)")
    p.add_argument("--pauses", type=int, default=2, help="pauses of the paused run (each at a log window)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more pretraining overrides for every run, e.g. train.compile=false")
    args = p.parse_args(argv)
    if args.straight < 1 or args.pauses < 1 or args.pauses * args.log_every >= args.steps:
        p.error("need --straight >= 1, --pauses >= 1 and --pauses x --log-every < --steps")
    args.out = args.out.resolve()
    # MLflow 3 refuses a file store without it; a local cluster's workers started below inherit it
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    # RAY_ADDRESS's cluster, else a new local one, as every `eae` command connects: a bare
    # ray.init() joined the cluster a stale /tmp/ray/ray_current_cluster named (a stopped study
    # head's) and waited there until the device call's end
    connect()
    data = build_world(args.out, args.entities)

    # a run an earlier call finished is read, not trained again (a device call's 10 minutes)
    runs = {}
    for name in [f"straight-{i + 1}" for i in range(args.straight)]:
        runs[name] = finished(args.out, name) or pretrain(args, data, name)["mlflow_run_id"]
    runs["paused"] = finished(args.out, "paused")
    if runs["paused"] is None:
        for _ in range(args.pauses):  # a run cut by an earlier call's end resumes here, and pauses again
            paused = pretrain(args, data, "paused", "train.time_budget_s=1e-6")
            print(f"paused run: paused at step {paused['paused_at_step']}", flush=True)
        runs["paused"] = pretrain(args, data, "paused")["mlflow_run_id"]

    table = {name: losses(args.out, run_id) for name, run_id in runs.items()}
    steps = sorted(table["straight-1"])
    print("\n| run | " + " | ".join(f"loss at step {s}" for s in steps) + " | largest weight difference from straight-1 |")
    print("|---|" + "---|" * (len(steps) + 1))
    for name, by_step in table.items():
        diff, weight = largest_difference(args.out / "models" / "straight-1", args.out / "models" / name)
        print(f"| {name} | " + " | ".join(f"{by_step.get(s, float('nan')):.6f}" for s in steps) + f" | {diff:.3g} ({weight}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
