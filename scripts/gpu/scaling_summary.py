"""The JSON summary of scripts/gpu/pretrain-scaling's runs, read back from MLflow (the store
MLFLOW_TRACKING_URI names) and the Ray Train storage folder.

Per run: steady tokens/s (all tokens / all seconds of the logged windows after the warm-up,
`--warmup-steps`: the first window holds Triton autotuning and the first reads, and the first
2-GPU run on a fresh machine compiles again in the second; windows holding profiled steps,
`--profile-steps`, are left out too), step time, its median window and contexts/s, the entity
table's GiB per worker (rows + gradient + Adam state, `table_gib_per_worker`), the peak GPU
memory of the workers (largest and smallest, `peak_gpu_gib`, `peak_gpu_gib_min`), the MLflow
run id and its checkpoint artifacts, the checkpoint folders with their files. Then the scaling
of each run over the 1-worker run's: by tokens/s, and by contexts (workers x the 1-worker
stall-free step time / the run's: every worker's batch has the same number of contexts, while
real tokens per batch vary with the data each worker reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """A training metric's history: `train/<key>`, or `<key>` in runs made before the metric
    names were unified (docs/tracking.md)."""
    history = client.get_metric_history(run_id, f"train/{key}") or client.get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


# Steady windows stay within a few % of the median (H100 runs: 0.080-0.089 s against 0.082);
# at 2x, the tail of a stall (a 0.168 s window after two of 0.36-0.43 s) passed as steady.
STALL_FACTOR = 1.5


def steady(tokens_per_s: list[tuple[int, float]], step_time_s: list[tuple[int, float]], warmup_steps: int,
           profiled: tuple[int, int] | None = None) -> dict:
    """Windows ending after step `warmup_steps` and holding no profiled step: total tokens /
    total seconds, mean and median step time. Windows are keyed by their last step; a window's
    steps = its step minus the previous window's."""
    times = dict(step_time_s)
    rows, previous = [], 0  # per timed window: (last step, steps, seconds, tokens, s/step)
    for step, tps in tokens_per_s:
        first, steps = previous + 1, step - previous
        previous = step
        if step <= warmup_steps or step not in times:
            continue
        if profiled and first <= profiled[1] and step >= profiled[0]:  # the profiler slows its steps
            continue
        rows.append((step, steps, times[step] * steps, tps * times[step] * steps, times[step]))
    if not rows:
        return {}
    steps = sum(r[1] for r in rows)
    seconds = sum(r[2] for r in rows)
    median = statistics.median(r[4] for r in rows)
    # A stall: a window over STALL_FACTOR x the median step (one-time costs inside the run:
    # Triton autotuning for a new mention-count bucket, benchmarks/autotune_buckets.py; the next
    # epoch's Ray Data pipeline starting). Listed with their cost, and left out of the
    # stall-free step time that the contexts scaling compares.
    stalled = [r for r in rows if r[4] > STALL_FACTOR * median]
    calm = [r for r in rows if r[4] <= STALL_FACTOR * median]
    return {"tokens_per_s": sum(r[3] for r in rows) / seconds, "step_time_s": seconds / steps,
            "median_window_step_time_s": median,
            "stall_free_step_time_s": sum(r[2] for r in calm) / sum(r[1] for r in calm),
            "stall_windows": [{"step": r[0], "step_time_s": round(r[4], 4), "extra_s": round(r[2] - r[1] * median, 2)}
                              for r in stalled],
            "steps_timed": steps, "windows_timed": len(rows),
            "first_window_tokens_per_s": tokens_per_s[0][1] if tokens_per_s else None}


def summarize_run(client, experiment_id: str | None, record: dict, storage: Path, batch: int, warmup_steps: int,
                  profiled: tuple[int, int] | None) -> dict:
    out = dict(record)
    ckpt_root = storage / record["name"]
    out["checkpoints"] = {
        d.name: {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}
        for d in sorted(ckpt_root.glob("checkpoint_*")) if d.is_dir()
    }
    if client is None or experiment_id is None:
        return out
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.runName = '{record['name']}'")
    if not runs:
        out["mlflow"] = "no run of that name"
        return out
    run = runs[0]
    rid = run.info.run_id
    out["mlflow_run_id"] = rid
    out["mlflow_status"] = run.info.status
    out["mlflow_checkpoint_artifacts"] = [a.path for a in client.list_artifacts(rid, "checkpoints")]
    tps, st = _history(client, rid, "tokens_per_s"), _history(client, rid, "step_time_s")
    # the slowest worker's s/step waiting for its batch, in garbage collections, in the table's
    # exchanges and for the gradients' all-reduces after the backward (the last two: 2+ workers)
    # and (GPUs) how far the GPU ran behind the host (the least worker's) and the s/step until the
    # host had launched the window's steps (the step time as runs before gpu_lag_s measured it)
    waits = {key: dict(_history(client, rid, key))
             for key in ("data_wait_s", "gc_s", "exchange_s", "grad_sync_wait_s", "gpu_lag_s", "launch_time_s")}
    out["windows"] = [{"step": s, "tokens_per_s": round(v), "step_time_s": round(dict(st).get(s, float("nan")), 4),
                       **{key: round(h[s], 4) for key, h in waits.items() if s in h}} for s, v in tps]
    out.update(steady(tps, st, warmup_steps, profiled))
    launched = steady(tps, _history(client, rid, "launch_time_s"), warmup_steps, profiled)
    if launched:
        out["stall_free_launch_time_s"] = launched["stall_free_step_time_s"]
    for key, h in waits.items():  # the median over the windows after the warm-up
        timed = [v for s, v in h.items() if s > warmup_steps]
        if timed:
            out[f"median_{key[:-2]}_ms"] = round(statistics.median(timed) * 1e3, 2)
    if out.get("step_time_s"):
        out["contexts_per_s"] = batch * record["workers"] / out["step_time_s"]
    for key in ("table_gib_per_worker", "peak_gpu_gib", "peak_gpu_gib_min"):
        values = _history(client, rid, key)
        if values:
            out[key] = max(v for _, v in values) if key != "peak_gpu_gib_min" else values[-1][1]
    losses = _history(client, rid, "loss")
    if losses:
        out["loss_first_window"], out["loss_last_window"] = losses[0][1], losses[-1][1]
    out["dev"] = {k: v for k, v in run.data.metrics.items() if k.startswith(("dev/", "dev_"))}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", required=True, help="JSON lines: workers, name, rc, wall_s")
    p.add_argument("--storage", required=True, help="train.storage_path")
    p.add_argument("--experiment", default="gpu-scaling")
    p.add_argument("--log-every", type=int, required=True)
    p.add_argument("--batch", type=int, required=True, help="contexts per worker and step")
    p.add_argument("--warmup-steps", type=int, help="leave out the windows ending at or before this step (default: --log-every)")
    p.add_argument("--profile-steps", help="FIRST-LAST, the runs' train.profile_steps: their windows are left out")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    warmup = args.log_every if args.warmup_steps is None else args.warmup_steps
    profiled = tuple(int(x) for x in args.profile_steps.split("-")) if args.profile_steps else None
    records = [json.loads(x) for x in Path(args.runs).read_text().splitlines() if x.strip()]
    client = experiment_id = None
    error = None
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(os.environ.get("MLFLOW_TRACKING_URI"))
        experiment = client.get_experiment_by_name(args.experiment)
        experiment_id = experiment.experiment_id if experiment else None
    except Exception as exc:  # noqa: BLE001 - the summary must still be written
        error = f"{type(exc).__name__}: {exc}"
    runs = []
    for record in records:
        try:
            runs.append(summarize_run(client, experiment_id, record, Path(args.storage), args.batch, warmup, profiled))
        except Exception as exc:  # noqa: BLE001
            runs.append({**record, "summary_error": f"{type(exc).__name__}: {exc}"})
    one = next((r for r in runs if r["workers"] == 1 and r.get("tokens_per_s")), None)
    for r in runs:
        if one and r.get("tokens_per_s"):
            r["scaling_vs_1_worker"] = r["tokens_per_s"] / one["tokens_per_s"]
            r["scaling_contexts_vs_1_worker"] = r["workers"] * one["stall_free_step_time_s"] / r["stall_free_step_time_s"]
            if one.get("stall_free_launch_time_s") and r.get("stall_free_launch_time_s"):  # the earlier runs' measure
                r["scaling_launched_contexts_vs_1_worker"] = (r["workers"] * one["stall_free_launch_time_s"]
                                                              / r["stall_free_launch_time_s"])
    summary = {"mlflow_uri": os.environ.get("MLFLOW_TRACKING_URI"), "log_every": args.log_every,
               "warmup_steps": warmup, "profile_steps": args.profile_steps,
               "batch_per_worker": args.batch, "runs": runs, **({"mlflow_error": error} if error else {})}
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    for r in runs:
        print(f"workers {r['workers']}: rc {r['rc']}, {r.get('tokens_per_s', float('nan')):,.0f} tokens/s steady "
              f"({r.get('contexts_per_s', float('nan')):,.0f} contexts/s, step {r.get('step_time_s', float('nan')) * 1e3:.1f} ms "
              f"over {r.get('steps_timed', 0)} steps, median window {r.get('median_window_step_time_s', float('nan')) * 1e3:.1f} ms, "
              f"{r.get('stall_free_step_time_s', float('nan')) * 1e3:.1f} ms without {len(r.get('stall_windows', []))} stalled windows), "
              f"scaling {r.get('scaling_vs_1_worker', float('nan')):.2f}x (tokens), {r.get('scaling_contexts_vs_1_worker', float('nan')):.2f}x (contexts), table {r.get('table_gib_per_worker', float('nan')):.2f} GiB/worker, "
              f"until launched {r.get('stall_free_launch_time_s', float('nan')) * 1e3:.1f} ms "
              f"({r.get('scaling_launched_contexts_vs_1_worker', float('nan')):.2f}x), "
              f"peak {r.get('peak_gpu_gib', float('nan')):.1f} GiB, "
              + "".join(f"{k[7:-3]} {v:.2f} ms/step, " for k, v in r.items() if k.startswith("median_") and k.endswith("_ms"))
              + f"checkpoints {list(r.get('checkpoints', {}))}, "
              f"MLflow {r.get('mlflow_run_id')}")


if __name__ == "__main__":
    main()
