"""`eae`: the one console script. Subcommands import their dependencies lazily, so
`eae model summary` starts in a second and never imports Ray."""

from __future__ import annotations

import argparse
import json
import sys


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
