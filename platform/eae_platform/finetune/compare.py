"""`eae compare RUN ...`: the paper's tables for MLflow runs, side by side.

    pretraining (Table 2)   dev entity accuracy, token accuracy, perplexity
    QA (Table 4)            dev EM, test EM beside the prior-only baseline (each relation's most
                            frequent training answer) and the oracle (the share of resolvable answers)
    top-K (Table 7)         entity acc, token acc, PPL and QA EM at K = 1, 10, 100, all

A run is named by its run id or its run name (the latest run of that name). Values are each
metric's latest; a table is printed only when some run has its metrics. Markdown by default;
CSV (one row per run, every metric a column) on request.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

# Pretraining and evaluation log dev/entity_accuracy, ...; pretraining runs made before the
# names were unified logged dev_entity_acc, dev_token_acc, dev_ppl (the first name a run has is shown).
PRETRAIN = [("entity acc", ("dev/entity_accuracy", "dev_entity_acc"), 100),
            ("token acc", ("dev/token_accuracy", "dev_token_acc"), 100),
            ("PPL", ("dev/perplexity", "dev_ppl"), 1)]
QA = [("dev EM", ("dev/em",), 100), ("test EM", ("test/em",), 100), ("prior-only (test)", ("test/prior_em",), 100),
      ("oracle (test)", ("test/oracle",), 100)]
TOPK = ("1", "10", "100", "all")
TOPK_METRICS = [("entity acc", "entity_accuracy", 100), ("token acc", "token_accuracy", 100),
                ("PPL", "perplexity", 1), ("QA EM", "qa_em", 100)]


def topk_key(k: str, metric: str) -> str:
    """Where the top-K evaluation logs its metrics: `topk/<K>/<metric>`."""
    return f"topk/{k}/{metric}"


@dataclass
class RunInfo:
    run_id: str
    name: str
    kind: str  # preset of pretraining runs, dataset of QA runs
    metrics: dict[str, float]


def find_runs(names: list[str], uri: str) -> list[RunInfo]:
    from mlflow.exceptions import MlflowException

    from eae_platform.tracking import fail_fast, mlflow_client, sqlite_path, unreachable

    fail_fast()  # as a Tracker does: a dead server is said in seconds, not 8 minutes
    store = sqlite_path(uri)
    if store and names and not store.is_file():  # MLflow would create an empty store there to find nothing in it
        raise LookupError(f"{store} does not exist: no MLflow run with id or name {names[0]!r} in {uri}")
    client = mlflow_client(uri)
    out = []
    for name in names:
        try:
            run = client.get_run(name)
        except MlflowException:
            try:
                experiments = [e.experiment_id for e in client.search_experiments()]
            except MlflowException as error:  # the store down: one line, not MLflow's exception and a traceback file
                if not unreachable(uri, error):
                    raise
                raise LookupError(f"cannot look up run {name!r}: {unreachable(uri, error)}") from None
            found = client.search_runs(experiments, filter_string=f"attributes.run_name = '{name}'",
                                       order_by=["attributes.start_time DESC"], max_results=1) if experiments else []
            if not found:
                raise LookupError(f"no MLflow run with id or name {name!r} in {uri}") from None
            run = found[0]
        params, tags = run.data.params, run.data.tags
        # a sweep's parent run has no dataset tag (its trials do) but logs its space's finetune.data,
        # whose format ("synth:DIR") is the dataset's name
        kind = (tags.get("eae.dataset") or params.get("finetune.data", "").partition(":")[0]
                or params.get("model.preset") or "")
        if params.get("model.use_entity_memory") == "false" and kind not in ("no_eae", "mm"):
            kind += " without memory"  # a preset with the memory switched off (a No-EaE ablation)
        out.append(RunInfo(run.info.run_id, run.info.run_name or run.info.run_id[:8], kind, dict(run.data.metrics)))
    return out


def _value(run: "RunInfo", names: tuple[str, ...]) -> float | None:
    return next((run.metrics[n] for n in names if n in run.metrics), None)


def _cell(value: float | None, scale: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value * scale:.1f}" if scale != 1 else f"{value:.2f}"


def _table(title: str, head: list[str], rows: list[list[str]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(runs: list[RunInfo]) -> str:
    tables = []
    for title, kind, spec in (("Pretraining (held-out masked mentions)", "preset", PRETRAIN),
                              ("Question answering (exact match)", "dataset", QA)):
        rows = [[r.name, r.kind, *(_cell(_value(r, names), s) for _, names, s in spec)]
                for r in runs if any(_value(r, names) is not None for _, names, _ in spec)]
        if rows:
            tables.append(_table(title, ["run", kind, *(n for n, _, _ in spec)], rows))
    has = lambda keys: any(k in r.metrics for r in runs for k in keys)  # noqa: E731
    keys = [topk_key(k, m) for k in TOPK for _, m, _ in TOPK_METRICS]
    if has(keys):
        head = ["K", *(f"{r.name} {n}" for r in runs if any(k in r.metrics for k in keys) for n, _, _ in TOPK_METRICS)]
        rows = [[k, *(_cell(r.metrics.get(topk_key(k, m)), s) for r in runs if any(x in r.metrics for x in keys)
                      for _, m, s in TOPK_METRICS)] for k in TOPK]
        tables.append(_table("Top-K retrieval at inference", head, rows))
    if not tables:
        return "no pretraining, QA or top-K metrics in these runs: " + ", ".join(r.name for r in runs)
    return "\n\n".join(tables)


def to_csv(runs: list[RunInfo]) -> str:
    columns = [n for _, names, _ in PRETRAIN + QA for n in names] + [topk_key(k, m) for k in TOPK for _, m, _ in TOPK_METRICS]
    columns = [c for c in columns if any(c in r.metrics for r in runs)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["run_id", "run_name", "kind", *columns])
    for r in runs:
        writer.writerow([r.run_id, r.name, r.kind, *(r.metrics.get(c, "") for c in columns)])
    return buffer.getvalue()
