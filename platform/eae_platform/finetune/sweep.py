"""Ray Tune sweeps of QA fine-tuning: the paper's grids, exactly, or Optuna searches.

A space file (tune_spaces/*.yaml) holds a base `finetune:` config, the `grid:` to search and
`sweep:` settings. Every trial is one `finetune()` run in a Tune function trainable, logged as
an MLflow child run of the sweep's parent run. Selection is on dev EM; test is evaluated once,
for the selected trial, by the driver (trials never see test). A failed trial is reported
(printed, and tagged on the parent run) and the sweep goes on; `--resume` continues an
interrupted sweep from its Tune experiment state, with the settings it started with (its
sweep.json), and re-runs the failed trials.

    search: grid          Tune's default searcher over tune.grid_search: every combination
    search: optuna-grid   Optuna's GridSampler: the same combinations, through Optuna
    search: optuna-tpe    Optuna's TPE over the grid's values, `num_samples` trials
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eae_model.config import parse_override
from eae_platform.finetune.config import FinetuneConfig, absolute_paths, finetune_config_from
from eae_platform.pretrain.storage import check_output_dir
from eae_platform.progress import verbose

SEARCHES = ("grid", "optuna-grid", "optuna-tpe")
METRIC = "dev/em"  # what trials report to Tune, named as in MLflow


@dataclass
class SweepConfig:
    name: str = "qa-sweep"  # Tune experiment name (under storage_path) and the parent MLflow run's name
    search: str = "grid"
    num_samples: int = 0  # optuna-tpe's trial budget (grid searches run every combination once)
    max_concurrent: int = 2
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    storage_path: str = "runs/tune"
    seed: int = 0
    # true: start even where no node has a trial's CPUs and GPUs (an autoscaler will add one);
    # else such a sweep is refused (check_trial_fits), as Tune would wait for ever
    wait_for_resources: bool = False

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ValueError(f"sweep.search must be one of {', '.join(SEARCHES)}, got {self.search!r}")
        if self.max_concurrent <= 0 or self.cpus_per_trial <= 0 or self.gpus_per_trial < 0:
            raise ValueError("sweep.max_concurrent and sweep.cpus_per_trial must be positive, gpus_per_trial >= 0")
        if self.search == "optuna-tpe" and self.num_samples <= 0:
            raise ValueError("sweep.num_samples (the trial budget) must be positive for optuna-tpe")


@dataclass
class SweepSpace:
    sweep: SweepConfig
    finetune: dict[str, Any]  # base FinetuneConfig values
    grid: dict[str, list] = field(default_factory=dict)
    # what load_space read: the space file's sections and the overrides, saved in sweep.json when
    # the sweep starts, so that --resume can tell a command line's settings from the sweep's
    started_with: dict[str, Any] | None = None

    def combinations(self) -> list[dict[str, Any]]:
        keys = list(self.grid)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.grid[k] for k in keys))]

    def trial_config(self, params: dict[str, Any], **extra: Any) -> FinetuneConfig:
        return finetune_config_from({**self.finetune, **params, **extra})

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": dataclasses.asdict(self.sweep), "finetune": self.finetune, "grid": self.grid}


def load_space(path: str | Path, overrides: list[str] | None = None) -> SweepSpace:
    """A space file, then `sweep.key=`, `finetune.key=` and `grid.key=[...]` overrides. Every
    combination is checked to make a valid FinetuneConfig before anything runs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"search space {path} not found (see tune_spaces/)")
    with path.open(encoding="utf-8") as f:  # a file, not its text: a YAML error names the file, not "<unicode string>"
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict) or set(data) - {"sweep", "finetune", "grid"}:
        raise ValueError(f"{path}: expected top-level sections sweep:, finetune: and grid: only")
    sections = {k: dict(data.get(k) or {}) for k in ("sweep", "finetune", "grid")}
    for text in overrides or []:
        key, value = parse_override(text)
        section, _, name = key.partition(".")
        if section not in sections or not name:
            raise ValueError(f"override {key!r} must be sweep.<key>, finetune.<key> or grid.<key>")
        sections[section][name] = value
    sweep_fields = {f.name for f in dataclasses.fields(SweepConfig)}
    unknown = set(sections["sweep"]) - sweep_fields
    if unknown:
        raise ValueError(f"unknown sweep keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(sweep_fields))})")
    grid = sections["grid"]
    known = {f.name for f in dataclasses.fields(FinetuneConfig)}
    for key, values in grid.items():
        if key not in known:
            raise ValueError(f"grid key {key!r} is not a finetune setting")
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.{key} must be a non-empty list, got {values!r}")
    space = SweepSpace(SweepConfig(**sections["sweep"]), sections["finetune"], grid,
                       started_with={"space": str(path.resolve()), "file": {k: dict(data.get(k) or {}) for k in sections},
                                     "overrides": list(overrides or [])})
    for params in space.combinations():
        space.trial_config(params)  # raises on a bad value, before any trial starts
    return space


def check_trial_fits(sweep: SweepConfig) -> None:
    """Refuse a sweep whose trials no node of the connected cluster can hold. Tune waits for
    them for ever, logging "insufficient resources" each minute (it only warns: an autoscaler may
    add the node). A trial's resources are one placement-group bundle, so one node must hold
    them all. Let through where sweep.wait_for_resources is set, or where Ray's cluster launcher
    started the cluster (its ~/ray_bootstrap_config.yaml: Tune's own test for autoscaling)."""
    import ray

    if sweep.wait_for_resources or Path("~/ray_bootstrap_config.yaml").expanduser().exists():
        return
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    if any(r.get("CPU", 0) >= sweep.cpus_per_trial and r.get("GPU", 0) >= sweep.gpus_per_trial for r in nodes):
        return
    have = ", ".join(dict.fromkeys(f"{_count(r.get('CPU', 0), 'CPU')} and {_count(r.get('GPU', 0), 'GPU')}" for r in nodes))
    raise ValueError(f"a trial asks for {_count(sweep.cpus_per_trial, 'CPU')} and {_count(sweep.gpus_per_trial, 'GPU')} on one node, "
                     f"and no node of this Ray cluster has them (its nodes: {have}): set "
                     "sweep.cpus_per_trial and sweep.gpus_per_trial to fit (--set sweep.cpus_per_trial=1 "
                     "--set sweep.gpus_per_trial=0 on a CPU machine), or sweep.wait_for_resources=true "
                     "where an autoscaler will add such a node")


def _count(number: float, unit: str) -> str:
    """'1 GPU', '0 GPUs', '0.5 CPUs'."""
    return f"{number:g} {unit}" + ("" if number == 1 else "s")


def _trainable(base: dict[str, Any], parent_run_id: str, mlflow_uri: str, cpus: float):
    # Not Ray's setup_mlflow: it opens the trial's run through MLflow's fluent API (the global
    # tracking URI and an active run, each later call straight to the store, so a trial fails
    # when the store goes away mid-trial). A trial is one finetune(), as `eae finetune qa` is:
    # its Tracker opens the run as a child of the sweep's and queues on disk through an outage.
    def trial(params: dict[str, Any]) -> None:
        import torch
        from ray import tune

        from eae_platform.finetune.qa import finetune

        torch.set_num_threads(max(1, int(cpus)))
        config = finetune_config_from({**base, **params, "evaluate_test": False, "parent_run_id": parent_run_id,
                                       "mlflow_uri": mlflow_uri, "run_name": tune.get_context().get_trial_name(),
                                       "out": None, "register": False})

        def report(metrics: dict, model_dir: Path | None) -> None:
            if model_dir is None:
                tune.report(metrics)
            else:  # the final report carries the fine-tuned model: Tune persists it
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(model_dir)))

        finetune(config, report)

    return trial


def _search(space: SweepSpace):
    """(param_space, search_alg, num_samples) for the space's search."""
    from ray import tune

    s = space.sweep
    if s.search == "grid":
        return {k: tune.grid_search(v) for k, v in space.grid.items()}, None, 1
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    param_space = {k: tune.choice(v) for k, v in space.grid.items()}
    if s.search == "optuna-grid":
        sampler = optuna.samplers.GridSampler(space.grid, seed=s.seed)
        num_samples = len(space.combinations())
    else:
        sampler = optuna.samplers.TPESampler(seed=s.seed)
        num_samples = s.num_samples
    return param_space, OptunaSearch(sampler=sampler, metric=METRIC, mode="max"), num_samples


def resolved(space: SweepSpace) -> SweepSpace:
    """The space as its trials run it (in directories of their own): the base finetune config
    complete, its local paths absolute and its tracking URI fixed now."""
    from eae_platform.tracking import tracking_uri

    base = absolute_paths(finetune_config_from(space.finetune))
    return dataclasses.replace(space, finetune={**dataclasses.asdict(base), "mlflow_uri": base.mlflow_uri or tracking_uri()})


def check_storage(sweep: SweepConfig, resume: bool) -> None:
    """On the driver, before Ray starts (run_sweep found both after it had, ~10 s, and after
    opening the sweep's MLflow run): a new sweep whose directory exists, and a
    sweep.storage_path that cannot be a directory (under /proc, under a file), which was a bare
    `[Errno 2] ...`. The storage is made, the sweep's own directory is not (Tune makes it)."""
    root = Path(sweep.storage_path).resolve()
    if not resume and (root / sweep.name).exists():
        raise FileExistsError(f"{root / sweep.name} exists: resume it with --resume, or choose another sweep.name")
    check_output_dir(root, "sweep.storage_path", "the sweep's trials and state")


def state_path(sweep: SweepConfig) -> Path:
    """The sweep's own file beside Tune's state: its parent run and the settings it started with."""
    return Path(sweep.storage_path).resolve() / sweep.name / "sweep.json"


def saved_state(sweep: SweepConfig) -> dict:
    """The sweep.json of the sweep to resume (save_state's)."""
    path = state_path(sweep)
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: {path} not found (run the sweep first)")
    return json.loads(path.read_text())


def save_state(space: SweepSpace, parent_run_id: str) -> None:
    """sweep.json of a sweep that starts: its MLflow parent run, its resolved space (what every
    --resume continues with) and what load_space read (the space file's sections, the overrides)."""
    path = state_path(space.sweep)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"parent_run_id": parent_run_id, "space": space.to_dict(),
                                "started_with": space.started_with}, indent=2))


# Settings a --resume takes from its command line, not from the saved sweep: the two that find
# the sweep, and whether to start where no node yet holds a trial (the cluster may be another).
RESUME_FROM_COMMAND_LINE = ("sweep.name", "sweep.storage_path", "sweep.wait_for_resources")


def resume_space(space: SweepSpace) -> SweepSpace:
    """The space `eae tune --resume` continues: the one the sweep started with (sweep.json), not
    the command line's. The command line (`space`, from load_space) finds the sweep by its
    sweep.name and sweep.storage_path; each other setting it gives, an override or a space-file
    value changed since the start, must equal the saved one (a repeat passes): else a ValueError
    names every one that differs. A sweep started before sweep.json kept the space file and the
    overrides resumes with its saved space, only the overrides checked, and says so."""
    saved = saved_state(space.sweep)  # every sweep.json eae tune wrote holds "space"
    then, before = saved["space"], saved.get("started_with")
    ours = space.started_with or {"file": {}, "overrides": []}
    given = {parse_override(text)[0] for text in ours["overrides"]}
    if before:  # the space file's values that changed since the start
        given |= {f"{section}.{key}" for section in ("sweep", "finetune", "grid")
                  for key in set(before["file"].get(section, {})) | set(ours["file"].get(section, {}))
                  if _plain(before["file"].get(section, {}).get(key)) != _plain(ours["file"].get(section, {}).get(key))}
    else:
        print(f"eae: note: sweep {space.sweep.name} was started before eae tune saved its space file: resuming with "
              "its saved settings, checked against this command line's --set overrides only", file=sys.stderr, flush=True)
    now = resolved(space).to_dict()
    differ = [key for key in sorted(given - set(RESUME_FROM_COMMAND_LINE))
              if _plain(_setting(now, key)) != _plain(_setting(then, key))]
    if differ:
        raise ValueError(f"sweep {space.sweep.name} was started with other settings than this command line gives: "
                         + "; ".join(f"{key} (started with {_setting(then, key)!r}, now {_setting(now, key)!r})"
                                     for key in differ)
                         + ": resume without them (the sweep's saved settings are used), or start another sweep "
                           "(--set sweep.name=...)")
    sweep_fields = {f.name for f in dataclasses.fields(SweepConfig)}
    sweep = SweepConfig(**{k: v for k, v in then["sweep"].items() if k in sweep_fields})
    sweep = dataclasses.replace(sweep, **{key.partition(".")[2]: getattr(space.sweep, key.partition(".")[2])
                                          for key in RESUME_FROM_COMMAND_LINE})
    return SweepSpace(sweep, then["finetune"], then["grid"], started_with=before)


def _setting(space: dict, key: str) -> Any:
    section, _, name = key.partition(".")
    return (space.get(section) or {}).get(name)


def _plain(value: Any) -> Any:
    """A value as sweep.json holds it (tuples as lists), for comparing with a saved one."""
    return json.loads(json.dumps(value))


def run_sweep(space: SweepSpace, resume: bool = False) -> dict:
    """Run (or resume) the sweep; returns a summary with every trial, the selected one and its
    test EM. Raises RuntimeError when no trial finished."""
    from ray import tune

    from eae_platform.tracking import Tracker

    s = space.sweep
    root = Path(s.storage_path).resolve()
    space = resolved(space)
    mlflow_uri = space.finetune["mlflow_uri"]
    experiment = space.finetune["experiment"]
    if resume:
        parent = Tracker(experiment, uri=mlflow_uri, run_id=saved_state(s)["parent_run_id"])
    else:
        if (root / s.name).exists():
            raise FileExistsError(f"{root / s.name} exists: resume it with --resume, or choose another sweep.name")
        parent = Tracker(experiment, run_name=s.name, uri=mlflow_uri, tags={"eae.task": "qa-sweep"})
        parent.log_config(space.to_dict())
        save_state(space, parent.run_id)

    trainable = tune.with_resources(_trainable(space.finetune, parent.run_id, mlflow_uri, s.cpus_per_trial),
                                    {"cpu": s.cpus_per_trial, "gpu": s.gpus_per_trial})
    if resume:
        tuner = tune.Tuner.restore(str(root / s.name), trainable, resume_errored=True)
    else:
        param_space, search_alg, num_samples = _search(space)
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(metric=METRIC, mode="max", search_alg=search_alg, num_samples=num_samples,
                                        max_concurrent_trials=s.max_concurrent),
            # Tune's own status tables and banners only with --verbose; by default a line per
            # trial event from _trial_lines (the trials' output stays in Ray's log files)
            run_config=tune.RunConfig(name=s.name, storage_path=str(root), verbose=1 if verbose() else 0,
                                      callbacks=[] if verbose() else [_trial_lines(list(space.grid))],
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1)),
        )
    if not verbose():  # Tune's new output engine prints its tables even at verbose=0; its
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # legacy one honours it (Ray's switch)
    # num_to_keep=1 makes Tune snapshot its state as each trial reports its checkpoint, and warn
    # (3 lines, up to 5 times a default sweep) where two snapshots fall within 5 s, as trials
    # ending together do; the state is a small file on local disk, so the warning is noise. Its
    # threshold at 0 is Ray's own way to silence it (read when the Tuner starts its run).
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    with parent:  # an exception ends the sweep's run FAILED, an interrupt or SIGTERM KILLED
        try:
            with _sigterm_as_ctrl_c():
                results = tuner.fit()
        except (KeyboardInterrupt, SystemExit):  # a second Ctrl-C or SIGTERM: Tune stops waiting
            _end_orphans(parent, "KILLED")
            raise
        # Ctrl-C or SIGTERM: Tune catches it, stops the trials (killing their processes), saves its state and
        # returns; a trial it stopped has no error and no final report (dev EM with the model as
        # its checkpoint), while its status may read TERMINATED all the same
        interrupted = any(r.error is None and (r.checkpoint is None or METRIC not in (r.metrics or {}))
                          for r in results)
        _end_orphans(parent, "KILLED" if interrupted else "FAILED")
        if interrupted:
            raise KeyboardInterrupt(f"sweep {s.name} interrupted: continue it with --resume")
        return _select(space, results, parent, mlflow_uri, root)


def _trial_lines(grid_keys: list[str]):
    """A Tune callback that prints one line per trial event on the driver: started (with its
    grid values), each report (step, dev EM), finished, failed."""
    from ray import tune

    class TrialLines(tune.Callback):
        def _name(self, trial) -> str:
            values = ", ".join(f"{k}={trial.config.get(k)}" for k in grid_keys)
            return f"trial {trial.trial_id} ({values})"

        def on_trial_start(self, iteration, trials, trial, **info):
            print(f"{self._name(trial)}: started", flush=True)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            em = result.get(METRIC)
            print(f"{self._name(trial)}: step {result.get('step')}"
                  + (f", dev EM {100 * em:.1f}" if em is not None else ""), flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            print(f"{self._name(trial)}: finished", flush=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            print(f"{self._name(trial)}: failed (the sweep's summary gives the error)", flush=True)

    return TrialLines()


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM (`ray job stop`, a scheduler, kill) stops the sweep as Ctrl-C does: it calls the
    current SIGINT handler, which during fit() is Tune's (stop the trials, kill their processes,
    save the experiment state, return). Ray's driver handler (sys.exit) left at once instead, while
    Tune could still be starting a trial: that trial's MLflow run, created after the driver had
    ended the RUNNING ones, stayed RUNNING (CI). Only the main thread may set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def as_ctrl_c(signum, frame):
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # SIG_DFL or SIG_IGN: no Python handler to call
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end_orphans(parent, status: str) -> None:
    """End the sweep's trial runs still RUNNING once Tune is done with them: their processes
    were killed (Tune stops trials on Ctrl-C; a lost node) before finetune() could end them."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=parent.uri)
        for run in client.search_runs([parent.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}' "
                                      "and attributes.status = 'RUNNING'"):
            client.set_terminated(run.info.run_id, status)
    except Exception as error:  # noqa: BLE001 - the store is away: the sweep's own outcome matters more
        print(f"could not end the sweep's unfinished trial runs {status}: {error}", flush=True)


def best_trial(done: list[dict]) -> dict:
    """The trial of highest dev EM; ties: the first in `done`, which `_select` lists in the order
    Tune created the trials (the grid's order; Optuna's suggestions in turn). Not by trial id:
    Optuna's ids are random, so a tie went to a later trial. Not Tune's results order either:
    after --resume they come in another, and a finished sweep selected another of its tied trials
    (and tagged a second child eae.selected)."""
    return max(done, key=lambda t: t["dev_em"])  # max keeps the first of equal keys


def _created(result) -> float:
    """A trial's place in the order Tune created the sweep's trials, which a fresh sweep's results
    follow: the number its experiment tag starts with (`2_lr=0.0010`, in its last result once it
    reported, and in its directory's name, `trial_<id>_2_lr=0.0010_<date>`, before). A restored
    sweep's results come in another order (Tune requeues its trials newest result first), and
    `eae tune --resume` listed the trials reversed."""
    metrics = result.metrics or {}
    tag = metrics.get("experiment_tag") or Path(result.path).name.partition(f"_{metrics.get('trial_id')}_")[2]
    number = str(tag).partition("_")[0]
    return int(number) if number.isdigit() else math.inf


def _trial_name(result) -> str:
    """A trial's id as Tune reports it, else its directory's name (a trial that never reported)."""
    return (result.metrics or {}).get("trial_id") or Path(result.path).name


def _select(space: SweepSpace, results, parent, mlflow_uri: str, root: Path) -> dict:
    """The finished sweep: every trial, the selected one (on dev EM), its test EM, its model
    registered."""
    from eae_platform.finetune.qa import register_qa_model, registered_at_close
    from eae_platform.tracking import Tracker

    s = space.sweep
    experiment = space.finetune["experiment"]
    trials, failed = [], []
    # A restored sweep's come newest first: listed as a fresh one's (trial id where a tag lacks its number)
    for r in sorted(results, key=lambda r: (_created(r), _trial_name(r))):
        params = {k: r.config.get(k) for k in space.grid}
        row = {"trial": _trial_name(r), **params,
               "dev_em": r.metrics.get(METRIC) if r.metrics else None,
               "mlflow_run_id": (r.metrics or {}).get("mlflow_run_id"), "checkpoint": r.checkpoint.path if r.checkpoint else None}
        if r.error is not None:
            row["error"] = str(r.error).strip().splitlines()[-1][:300]
            failed.append(row)
        trials.append(row)
    done = [t for t in trials if "error" not in t and t["dev_em"] is not None and t["checkpoint"]]
    parent.set_tags({"eae.failed_trials": json.dumps([{"trial": t["trial"], "error": t["error"]} for t in failed])})
    parent.log_metrics({"sweep/trials": len(trials), "sweep/failed": len(failed), "sweep/finished": len(done)}, step=0)
    if not done:
        parent.close("FAILED")
        raise RuntimeError(f"no trial of sweep {s.name} finished; failures: {failed}")
    best = best_trial(done)
    test = _evaluate_test(space, best, mlflow_uri)
    parent.set_tags({"eae.best_trial": best["trial"], "eae.best_run_id": best["mlflow_run_id"] or "",
                     **{f"eae.best.{k}": best[k] for k in space.grid}})
    parent.log_metrics({"dev/em": best["dev_em"], "test/em": test["em"], "test/oracle": test["oracle"],
                        "test/prior_em": test["prior_em"], "dev/oracle": test["dev_oracle"]}, step=0)
    registered = {}
    if best["mlflow_run_id"]:
        child = Tracker(experiment, uri=mlflow_uri, run_id=best["mlflow_run_id"])
        child.log_metrics({"test/em": test["em"], "test/oracle": test["oracle"], "test/prior_em": test["prior_em"]}, step=0)
        child.set_tags({"eae.selected": "true"})
        config = space.trial_config({k: best[k] for k in space.grid})
        registered = register_qa_model(child, config, Path(best["checkpoint"]), config.steps)
        child.close()
        registered.update(registered_at_close(child, registered))
    parent.close()
    return {"name": s.name, "parent_run_id": parent.run_id, "trials": trials, "failed": failed, "best": best,
            "test": test, "storage": str(root / s.name), **registered}


def _evaluate_test(space: SweepSpace, best: dict, mlflow_uri: str) -> dict:
    """The selected trial's fine-tuned model on the test split (once), beside the prior-only
    baseline (each relation's most frequent training answer), as `eae finetune qa` reports it."""
    import torch

    from eae_model.checkpoint import load_model
    from eae_platform.finetune.qa import QATask

    model_dir = Path(best["checkpoint"])
    config = space.trial_config({k: best[k] for k in space.grid}, init=str(model_dir), mlflow_uri=mlflow_uri)
    model = load_model(model_dir)
    task = QATask(config, model_dir, model.config.max_length)
    test, predictions = task.evaluate(model, "test", torch.device("cpu"))
    prior = task.breakdown("test", predictions).get("test/prior_em", math.nan)
    return {"em": test["em"], "oracle": test["oracle"], "prior_em": prior, "questions": test["questions"],
            "dev_oracle": task.oracle("dev")}


def format_trials(summary: dict, grid_keys: list[str]) -> str:
    """A Markdown table of the trials, the selected one marked."""
    head = ["trial", *grid_keys, "dev EM", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in summary["trials"]:
        em = "" if t["dev_em"] is None or (isinstance(t["dev_em"], float) and math.isnan(t["dev_em"])) else f"{100 * t['dev_em']:.1f}"
        status = "FAILED: " + t["error"] if "error" in t else ("selected" if t is summary["best"] else "ok")
        lines.append("| " + " | ".join([t["trial"], *(str(t[k]) for k in grid_keys), em, status]) + " |")
    test = summary["test"]
    lines.append(f"\nselected {summary['best']['trial']}: dev EM {100 * summary['best']['dev_em']:.1f}, "
                 f"test EM {100 * test['em']:.1f} (oracle {100 * test['oracle']:.1f}, prior-only baseline "
                 f"{100 * test['prior_em']:.1f}, {test['questions']} questions)")
    return "\n".join(lines)
