"""Markdown tables of the project's studies, printed from their MLflow stores: every number in
docs/results.md comes from the runs, none is typed by hand (tests/test_results_doc.py reruns the
headline's command and compares).

    # the regime study (experiments/regime/, docs/results.md, which lists the archives of its
    # main tables in order): archives of its cells' stores, a later archive's cell winning (a
    # rerun, or a retraining: said so); stores that leave one model at two recipes are refused
    .venv/bin/python experiments/results_tables.py ARCHIVE.mlruns.tar.xz... [--figure docs/results/regime.svg]
    # the same cells trained at several recipes (one archive per recipe): each model's recipe
    # picked on QA dev EM, then EaE − No-EaE at the picks on test (--figure: those gaps)
    .venv/bin/python experiments/results_tables.py --best-recipe ARCHIVE.mlruns.tar.xz... [--figure F]
    # each pretraining run's dev evaluations by step, finished or paused (a study a lost machine
    # cut short): each model's mean over its seeds and EaE − No-EaE paired by seed, per recipe
    .venv/bin/python experiments/results_tables.py --dev-curve ARCHIVE.mlruns.tar.xz...
    # the small CPU reproduction (experiments/reproduce.sh, docs/results/cpu-reproduction.md)
    .venv/bin/python experiments/results_tables.py runs/reproduce/mlflow.db [runs/reproduce-wiki/mlflow.db]

The regime study: a cell is one (world, size, variant, seed); its store holds the pretraining
run (named after the cell), `lama-<cell>` (fact recall on probes), `masked-<cell>` (masked
hyperlink prediction on the test articles) and `qa-<cell>` (closed-book QA). Per world and
size, EaE's gap over No-EaE is paired by seed: its mean and a 95% t-interval over the seeds
(n - 1 degrees of freedom); a claim counts as reproduced only when that interval excludes 0.
Within a transformer, the gap at each world is set against the gap at the next larger one
(does the edge grow with the facts?): the two points' seeds are separate runs, so Welch's
interval, unpaired.
Single figures carry a 95% Wilson interval over their questions or probes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import signal
import statistics
import string
import tarfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: an archive's tables need no MLflow (~2 s to import)
    from mlflow.tracking import MlflowClient

VARIANTS = ("eae", "no_eae", "mm", "eae_unsup")


def latest(client: MlflowClient, name: str) -> dict[str, float] | None:
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string=f"attributes.run_name = '{name}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return dict(runs[0].data.metrics) if runs else None


def pct(m: dict | None, key: str) -> str:
    return "–" if not m or key not in m else f"{100 * m[key]:.1f}"


def num(m: dict | None, key: str, fmt: str = "{:.1f}") -> str:
    return "–" if not m or key not in m else fmt.format(m[key])


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])


def synthetic(client: MlflowClient, prefix: str = "") -> None:
    print("### Masked hyperlink prediction (test split, 5 maskings pooled)\n")
    rows = []
    for v in VARIANTS:
        m = latest(client, f"{prefix}masked-{v}")
        if m:
            rows.append([v, pct(m, "test/entity_accuracy"), pct(m, "test/token_accuracy"), num(m, "test/perplexity"),
                         num(m, "test/entities", "{:.0f}"), num(m, "test/tokens", "{:.0f}")])
    print(table(["model", "entity acc", "token acc", "PPL", "masked entities", "masked tokens"], rows) + "\n")
    if not prefix:
        print("### Pretraining's own dev evaluation (logged by `eae pretrain`)\n")
        # `eae pretrain` logs dev/entity_accuracy, dev/token_accuracy, dev/perplexity; runs made
        # before the names were unified (docs/tracking.md) logged dev_entity_acc, dev_token_acc,
        # dev_ppl: both are read, the new names first
        rows = []
        for v in VARIANTS:
            if m := latest(client, f"pre-{v}"):
                m = {**{"dev/entity_accuracy": m.get("dev_entity_acc"), "dev/token_accuracy": m.get("dev_token_acc"),
                        "dev/perplexity": m.get("dev_ppl")}, **m}
                m = {k: x for k, x in m.items() if x is not None}
                rows.append([v, pct(m, "dev/entity_accuracy"), pct(m, "dev/token_accuracy"), num(m, "dev/perplexity")])
        print(table(["model", "entity acc", "token acc", "PPL"], rows) + "\n")
        print("### Closed-book QA on the synthetic world's questions (EM)\n")
        rows = [[v, pct(m, "dev/em"), pct(m, "test/em"), pct(m, "test/oracle")]
                for v in VARIANTS if (m := latest(client, f"qa-{v}"))]
        print(table(["model", "dev EM", "test EM", "oracle"], rows) + "\n")
        print("### Top-K at inference (test split; QA EM on test questions)\n")
        for v in VARIANTS:
            m = latest(client, f"topk-{v}")
            if m:
                rows = [[k, pct(m, f"topk/{k}/entity_accuracy"), pct(m, f"topk/{k}/token_accuracy"),
                         num(m, f"topk/{k}/perplexity", "{:.2f}"), pct(m, f"topk/{k}/qa_em")] for k in ("1", "10", "100", "all")]
                print(f"{v}:\n\n" + table(["K", "entity acc", "token acc", "PPL", "QA EM"], rows) + "\n")
    print("### LAMA-style probes (zero-shot)\n")
    sources = ("synth",) if not prefix else ("geonames", "countryinfo", "wordnet", "bsdgames")
    rows = []
    for v in VARIANTS:
        m = latest(client, f"{prefix}lama-{v}")
        for s in sources:
            if m and f"lama/{s}/probes" in m:
                rows.append([v, s, num(m, f"lama/{s}/probes", "{:.0f}"), pct(m, f"lama/{s}/token_accuracy"),
                             num(m, f"lama/{s}/entity_probes", "{:.0f}"), pct(m, f"lama/{s}/entity_accuracy")])
    print(table(["model", "source", "probes", "token acc", "entity-answer probes", "entity acc"], rows) + "\n")
    if not prefix:
        m = {v: latest(client, f"lama-{v}") for v in VARIANTS}
        relations = sorted({k.split("/")[2] for mm in m.values() if mm for k in mm
                            if k.startswith("lama/synth/") and k.count("/") == 3})
        rows = [[r, *(pct(m[v], f"lama/synth/{r}/entity_accuracy") + " / " + pct(m[v], f"lama/synth/{r}/token_accuracy")
                      for v in VARIANTS)] for r in relations]
        print("Per relation (entity acc / token acc):\n\n" + table(["relation", *VARIANTS], rows) + "\n")
    print("### Entity typing and relation extraction\n")
    rows = []
    for v in VARIANTS:
        t, r = latest(client, f"{prefix}typing-{v}"), latest(client, f"{prefix}relations-{v}")
        if t or r:
            rows.append([v, pct(t, "dev/micro_f1"), pct(t, "test/micro_f1"), num(t, "typing/threshold", "{:.2f}"),
                         pct(r, "dev/f1"), pct(r, "test/f1"), pct(r, "test/precision"), pct(r, "test/recall")])
    print(table(["model", "typing dev F1", "typing test F1", "threshold", "RE dev F1", "RE test F1", "RE P", "RE R"], rows) + "\n")


def analysis(client: MlflowClient) -> None:
    m = latest(client, "analysis-eae-vs-no_eae")
    if m:
        print("### QA accuracy by bucket (test, 95% bootstrap interval)\n")
        for view in ("answer_frequency", "question_mentions", "question_length"):
            buckets = sorted({k.split("/")[3] for k in m if k.split("/")[2:3] == [view]},
                             key=lambda b: float(b.split("-")[0]))
            rows = []
            for b in buckets:
                cells = []
                for run in ("qa-eae", "qa-no_eae"):
                    key = f"analysis/{run}/{view}/{b}"
                    cells.append("–" if f"{key}/n" not in m else
                                 f"{100 * m[key + '/accuracy']:.1f} [{100 * m[key + '/low']:.1f}, {100 * m[key + '/high']:.1f}] (n={m[key + '/n']:.0f})")
                rows.append([b, *cells])
            print(f"{view}:\n\n" + table(["bucket", "EaE", "No-EaE"], rows) + "\n")
    m = latest(client, "overlap-eae-vs-no_eae")
    if m:
        print("### Prediction overlap and oracle (EaE vs No-EaE, test)\n")
        print(table(["questions", "EaE EM", "No-EaE EM", "both right", "oracle", "same prediction"],
                    [[num(m, "overlap/questions", "{:.0f}"), pct(m, "overlap/a_em"), pct(m, "overlap/b_em"),
                      pct(m, "overlap/both_correct"), pct(m, "overlap/oracle_accuracy"),
                      pct(m, "overlap/prediction_overlap")]]) + "\n")




# --- the regime study ----------------------------------------------------------------------

CELL = re.compile(r"^w(?P<world>\d+)(?:r(?P<renderings>\d+))?-(?P<size>[a-z]+)-(?P<variant>[a-z_]+)-s(?P<seed>\d+)$")
# metric: (run name prefix, MLflow key, label); "" prefix: the pretraining run
METRICS = {
    "recall_stated": ("lama-", "lama/synth/stated/entity_accuracy", "fact recall, facts pretraining read"),
    "recall_unstated": ("lama-", "lama/synth/unstated/entity_accuracy", "fact recall, held-out facts"),
    # the same probes scored by TokenPred (every wordpiece of the answer right: LAMA's P@1 for
    # one-piece answers), the one recall figure a model without EntityPred has (MM, Table 3)
    "recall_stated_token": ("lama-", "lama/synth/stated/token_accuracy",
                            "fact recall by token acc, facts pretraining read"),
    "masked_entity": ("masked-", "test/entity_accuracy", "masked entity acc (test articles)"),
    "masked_token": ("masked-", "test/token_accuracy", "masked token acc"),
    "masked_ppl": ("masked-", "test/perplexity", "masked PPL"),
    "qa_em": ("qa-", "test/em", "QA test EM"),
    "qa_em_stated": ("qa-", "test/em_stated", "QA test EM, facts pretraining read"),
    "qa_em_unstated": ("qa-", "test/em_unstated", "QA test EM, held-out facts"),
    # EaE only (why it wins or not): the memory's top-1 read on the stated facts' probes
    "memory_subject": ("lama-", "lama/synth/stated/memory_subject_accuracy", "EaE memory reads the subject"),
    "memory_answer": ("lama-", "lama/synth/stated/memory_answer_accuracy", "EaE memory reads the answer"),
    # the same probes with the memory's output zeroed (eval.memory_off): what recall owes to it
    "memory_off_recall": ("lama-off-", "lama/synth/stated/entity_accuracy", "EaE fact recall, memory output zeroed"),
    # the fine-tuned QA model's test with the memory's output zeroed (finetune.memory_off_eval)
    "memory_off_qa_em": ("qa-", "test/em_memory_off", "EaE QA test EM, memory output zeroed"),
    "memory_off_qa_em_stated": ("qa-", "test/em_stated_memory_off",
                                "EaE QA test EM, facts pretraining read, memory output zeroed"),
    # masked entity accuracy with the memory reading only the top K entities (eae eval topk, Table 7)
    **{f"memory_k_{k}": ("topk-", f"topk/{k}/entity_accuracy", f"EaE masked entity acc, K={k}")
       for k in ("1", "10", "100", "all")},
}
PAIRED = [k for k in METRICS if not k.startswith("memory_")]  # what both models have
# EaE against its own ablations, paired by seed: (label, [(EaE's metric, the ablation's metric)])
ABLATIONS = [
    ("memory output zeroed at evaluation (EaE − the same model without its memory's output)",
     [("recall_stated", "memory_off_recall"), ("qa_em", "memory_off_qa_em"),
      ("qa_em_stated", "memory_off_qa_em_stated")]),
    ("K at inference (EaE with every entity − EaE reading the top K), masked entity acc",
     [("memory_k_all", f"memory_k_{k}") for k in ("1", "10", "100")]),
]
PRIORS = {"recall_stated": ("lama-", "lama/synth/stated/prior_entity_accuracy"),
          "recall_stated_token": ("lama-", "lama/synth/stated/prior_accuracy"),
          "recall_unstated": ("lama-", "lama/synth/unstated/prior_entity_accuracy"),
          "qa_em": ("qa-", "test/prior_em"), "qa_em_stated": ("qa-", "test/prior_em_stated"),
          "qa_em_unstated": ("qa-", "test/prior_em_unstated")}
COUNTS = {"recall_stated": ("lama-", "lama/synth/stated/entity_probes"),
          "recall_stated_token": ("lama-", "lama/synth/stated/probes"),
          "recall_unstated": ("lama-", "lama/synth/unstated/entity_probes"),
          "masked_entity": ("masked-", "test/entities"), "qa_em": ("qa-", "data/test_questions"),
          "qa_em_stated": ("qa-", "test/questions_stated"), "qa_em_unstated": ("qa-", "test/questions_unstated")}
# The real-text worlds (experiments/regime/settings.sh WORLDS=vital: the Vital Articles + the gensim
# sample; vital2000: the same with the 2,000 most frequent entities): their cells, and per metric
# (run name prefix, MLflow key, label, prior key, count key)
REAL_CELL = re.compile(r"^w(?P<world>vital\d*)-(?P<size>[a-z]+)-(?P<variant>[a-z_]+)-s(?P<seed>\d+)$")
REAL_SOURCES = ("geonames", "countryinfo", "wordnet")
REAL = {
    "masked_entity": ("masked-", "test/entity_accuracy", "masked entity acc (test articles)", None, "test/entities"),
    "masked_token": ("masked-", "test/token_accuracy", "masked token acc", None, None),
    "masked_ppl": ("masked-", "test/perplexity", "masked PPL", None, None),
    "qa_em": ("qa-", "test/em", "fanoutqa single-hop test EM", "test/prior_em", "data/test_questions"),
    "qa_oracle": ("qa-", "test/oracle", "fanoutqa oracle (answer is an entity of the vocabulary)", None, None),
    **{f"lama_{src}": ("lama-", f"lama/{src}/entity_accuracy", f"{src} probes, entity acc",
                       f"lama/{src}/prior_entity_accuracy", f"lama/{src}/entity_probes") for src in REAL_SOURCES},
    **{f"lama_{src}_token": ("lama-", f"lama/{src}/token_accuracy", f"{src} probes, token acc",
                             f"lama/{src}/prior_accuracy", f"lama/{src}/probes") for src in REAL_SOURCES},
    # EaE only: what its memory's output adds at inference, and its K (Table 7)
    "memory_off_qa_em": ("qa-", "test/em_memory_off", "EaE fanoutqa test EM, memory output zeroed", None, None),
    "memory_off_masked_entity": ("masked-off-", "test/entity_accuracy", "EaE masked entity acc, memory output zeroed", None, None),
    **{f"memory_off_lama_{src}": ("lama-off-", f"lama/{src}/entity_accuracy",
                                  f"EaE {src} probes, entity acc, memory output zeroed", None, None) for src in REAL_SOURCES},
    # the memory's top-1 read at the probe's subject (given as a mention) and at its masked answer
    **{f"memory_{what}_{src}": ("lama-", f"lama/{src}/memory_{what}_accuracy",
                                f"EaE memory reads the {what}, {src} probes", None, None)
       for what in ("subject", "answer") for src in REAL_SOURCES},
    **{f"memory_k_{k}": ("topk-", f"topk/{k}/entity_accuracy", f"EaE masked entity acc, K={k}", None, None)
       for k in ("1", "10", "100", "all")},
}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def read_cells(path: Path) -> dict[str, dict[str, dict]]:
    """{cell: {run name: {"metrics": ..., "params": ..., "status": ...}}} from a directory of
    cell stores or a .tar.xz of one (collect.sh), the latest run of each name."""
    if path.is_file():
        return read_archive(path)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    cells = {}
    for store in sorted(p for p in path.iterdir() if CELL.match(p.name) or REAL_CELL.match(p.name)):
        client = MlflowClient(tracking_uri=f"file://{store.resolve()}")
        runs = {}
        experiments = [e.experiment_id for e in client.search_experiments()]
        for r in sorted(client.search_runs(experiments), key=lambda r: r.info.start_time):
            runs[r.info.run_name] = {"metrics": dict(r.data.metrics), "params": dict(r.data.params),
                                     "status": r.info.status}
            if r.info.run_name == store.name:  # the pretraining run: its curve (--dev-curve)
                points = {k: [(m.step, m.timestamp, m.value) for m in client.get_metric_history(r.info.run_id, k)]
                          for k in r.data.metrics}
                runs[r.info.run_name].update(curve(points))
            # (the store's own copy: the artifact URI names the machine that wrote it)
            kept = store / r.info.experiment_id / r.info.run_id / "artifacts" / "predictions" / "test.jsonl"
            if kept.is_file():  # a QA run's per-question predictions (collect.sh keeps them)
                runs[r.info.run_name]["predictions"] = [json.loads(line) for line in kept.read_text().splitlines() if line]
        cells[store.name] = runs
    return cells


def curve(points: dict[str, list[tuple[int, int, float]]]) -> dict:
    """A pretraining run's {"dev": {key: {step: value}}} (its dev evaluations, the latest by
    time at a step) and "last_step" (the furthest step any metric reached: where a paused run
    stopped), from each metric's (step, timestamp, value) points."""
    dev = {k: {step: v for step, _, v in sorted(ps)} for k, ps in points.items() if k.startswith("dev/")}
    return {"dev": dev, "last_step": max((step for ps in points.values() for step, _, _ in ps), default=None)}


# mlflow.entities.RunStatus as FileStore persists it in meta.yaml (a missing status reads RUNNING);
# a copy, as importing MLflow's enum imports all of mlflow (~2 s) for five names
RUN_STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}


def read_archive(path: Path) -> dict[str, dict[str, dict]]:
    """read_cells of a collect.sh archive, read inside the tar. MLflow reads a file store only
    from a directory, and unpacking one (a file per param and metric: ~7,000 for 10 cells) took
    95% of the time (9.8 s against 0.5 s for round 21's store on the 2-core machine). So this
    reads the layout as mlflow's FileStore does (mlflow/store/tracking/file_store.py):
    <cell>/<experiment>/meta.yaml, <cell>/<experiment>/<run>/meta.yaml (run_name, status,
    lifecycle_stage, start_time), a metric's latest value by (step, timestamp, value) among its
    "timestamp value [step]" lines, params/ and tags/ (names may hold "/"); deleted runs and
    experiments (in <cell>/.trash) left out, as search_runs leaves them.
    tests/experiments/test_regime.py checks it against MlflowClient on a store MLflow writes."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where PyYAML has it: 5x faster
    runs: dict[tuple, dict[str, bytes]] = defaultdict(dict)  # (cell, experiment, run) -> {path in it: bytes}
    experiments: set[tuple] = set()  # (cell, experiment), active (a deleted one is in .trash)
    cells: set[str] = set()  # a cell's folder, with runs or not
    with tarfile.open(path) as tar:
        for member in tar:
            parts = member.name.split("/")
            if len(parts) >= 2 and parts[0] == "mlruns" and (CELL.match(parts[1]) or REAL_CELL.match(parts[1])):
                cells.add(parts[1])
            if not member.isfile() or len(parts) < 4 or parts[0] != "mlruns":
                continue
            if len(parts) == 4 and parts[3] == "meta.yaml":
                experiments.add(tuple(parts[1:3]))
            elif len(parts) >= 5:
                runs[tuple(parts[1:4])]["/".join(parts[4:])] = tar.extractfile(member).read()

    def folder(run: dict[str, bytes], name: str) -> dict[str, str]:
        return {k[len(name) + 1:]: v.decode() for k, v in run.items() if k.startswith(name + "/")}

    found: dict[str, list] = defaultdict(list)
    for (cell, experiment, run_id), run in runs.items():
        if cell not in cells or (cell, experiment) not in experiments:
            continue  # not a cell's store, or a deleted experiment's run
        meta = yaml.load(run.get("meta.yaml", b""), Loader=loader)
        if not isinstance(meta, dict) or meta.get("run_id") != run_id or str(meta.get("experiment_id")) != experiment:
            continue  # not a run's folder (a logged model's, say)
        if meta.get("lifecycle_stage", "active") != "active":
            continue
        points = {}
        for key, text in folder(run, "metrics").items():
            # FileStore._get_metric_from_line: a step only in a 3-field line (5 fields: step 0)
            points[key] = [(int(p[2]) if len(p) == 3 else 0, int(p[0]), float(p[1]))
                           for p in (line.split() for line in text.splitlines() if line.strip())]
        metrics = {key: max(ps)[2] for key, ps in points.items()}
        entry = {"metrics": metrics, "params": folder(run, "params"),
                 "status": RUN_STATUS[meta.get("status", 1)]}
        if (kept := run.get("artifacts/predictions/test.jsonl")) is not None:  # collect.sh keeps a QA run's
            entry["predictions"] = [json.loads(line) for line in kept.decode().splitlines() if line]
        name = meta.get("run_name") or folder(run, "tags").get("mlflow.runName")
        if name == cell:  # the pretraining run: its curve (--dev-curve)
            entry.update(curve(points))
        found[cell].append((meta.get("start_time") or 0, name, entry))
    # the latest run of each name, as read_cells keeps it
    return {cell: {name: entry for _, name, entry in sorted(found[cell], key=lambda f: f[0])}
            for cell in sorted(cells)}


def value(runs: dict, cell: str, prefix: str, key: str):
    run = runs.get(prefix + cell)
    return None if run is None or run["status"] != "FINISHED" else run["metrics"].get(key)


def transformer_params(params: dict) -> int:
    """The transformer layers' parameters (l0 + l1 stacks: what EaE and No-EaE share), from
    the pretraining run's model.* params."""
    return _transformer_params(tuple(sorted((k[len("model."):], v) for k, v in params.items()
                                            if k.startswith("model.") and k != "model.preset")))


@functools.cache  # one model built per configuration, not per run (--best-recipe: 144 runs, ~10 configurations)
def _transformer_params(fields: tuple[tuple[str, str], ...]) -> int:
    import yaml
    from eae_model.config import EaEConfig
    from eae_model.summary import parameter_counts

    counts = parameter_counts(EaEConfig.from_dict({k: yaml.safe_load(v) for k, v in fields}))
    return counts["transformer_l0"] + counts["transformer_l1"]


def wilson(p: float, n: float) -> tuple[float, float]:
    if not n:
        return math.nan, math.nan
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean and the half-width of its 95% t-interval (nan for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    sd = statistics.stdev(xs)
    return m, sd, T95.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))


def percent(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}"


def world_label(world: tuple[int, int]) -> str:
    """(entities, renderings) -> "5,000" or "5,000, facts stated 4x"."""
    entities, renderings = world
    return f"{entities:,}" + (f", facts stated {renderings}x" if renderings > 1 else "")


def summarize(cells: dict) -> tuple[dict, dict]:
    """groups[(world, size, variant)] = {metric: [per-seed values], "seeds": [...], ...} and
    setting[(world, size)] = {facts, transformer params, table params}."""
    groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    setting: dict[tuple, dict] = {}
    for cell, runs in cells.items():
        m = CELL.match(cell)
        if m is None:  # the real-text world: print_real_text
            continue
        key = ((int(m["world"]), int(m["renderings"] or 1)), m["size"], m["variant"])
        pre = runs.get(cell)
        if pre is None or pre["status"] != "FINISHED":
            continue
        g = groups[key]
        g["seeds"].append(int(m["seed"]))
        for name, (prefix, metric, _) in METRICS.items():
            g[name].append(value(runs, cell, prefix, metric))
            if name in PRIORS:
                g[f"{name}_prior"].append(value(runs, cell, *PRIORS[name]))
            if name in COUNTS:
                g[f"{name}_n"].append(value(runs, cell, *COUNTS[name]))
        g["qa_dev_em"].append(value(runs, cell, "qa-", "dev/em"))  # picks a recipe (--best-recipe)
        facts = value(runs, cell, "lama-", "lama/synth/stated/available")
        params = pre["params"]
        if facts is not None and m["variant"] == "eae":
            transformer = transformer_params(params)
            setting[key[:2]] = {"facts": facts, "transformer": transformer, "ratio": facts / transformer,  # the regime's axis
                                "table": int(params["model.num_entities"]) * int(params["model.entity_dim"]),
                                "steps": int(params["train.max_steps"]), "batch": int(params["train.batch_size"])}
    return groups, setting


# under each --versus table
VERSUS_NOTE = "\n✓: these stores' runs better, the interval excludes 0; ✗: the others better.\n"


def real_groups(cells: dict) -> dict:
    """The real-text worlds' finished cells as groups of seeds: (world, size, variant) -> REAL's figures
    per seed, their priors and counts, the pretraining's steps x batch and the QA recipe. A cell
    whose store holds QA runs only (experiments/regime/finetune.sh with FROM_STUDY: another QA
    recipe for another study's models) counts, with "–" for its pretraining."""
    groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    finished = lambda run: run is not None and run["status"] == "FINISHED"  # noqa: E731
    for cell, runs in cells.items():
        m = REAL_CELL.match(cell)
        pre, qa = runs.get(cell), runs.get("qa-" + cell)
        if m is None or not (finished(pre) or finished(qa) and pre is None):
            continue
        g = groups[(m["world"], m["size"], m["variant"])]
        g["seeds"].append(int(m["seed"]))
        g["steps"] = (f"{int(pre['params']['train.max_steps']):,} x {pre['params']['train.batch_size']}"
                      f"{settings_label(pre['params'])}" if pre else "–")
        if finished(qa) and "finetune.lr" in qa["params"]:
            f = qa["params"]
            g["qa"] = f"{int(f['finetune.max_steps']):,} x {f['finetune.batch_size']} at {lr_label(float(f['finetune.lr']))}"
        g["init"].append(finished(qa) and qa["params"].get("finetune.init"))  # the model the QA run tuned
        for name, (prefix, key, _, prior, count) in REAL.items():
            g[name].append(value(runs, cell, prefix, key))
            if prior:
                g[f"{name}_prior"].append(value(runs, cell, prefix, prior))
            if count:
                g[f"{name}_n"].append(value(runs, cell, prefix, count))
    return groups


def pretraining_pair(g: dict, other: dict) -> str:
    """The versus table's steps x batch: "3,600 x 128 − 1,200 x 128", or, for QA runs only that
    tuned the very models the other stores' QA runs tuned (seed by seed), "the same models"."""
    theirs = dict(zip(other["seeds"], other["init"]))
    if g["steps"] == "–" and all(i and theirs.get(s) == i for s, i in zip(g["seeds"], g["init"])):
        return f"the same models ({other['steps']})"
    return f"{g['steps']} − {other['steps']}"


def print_real_text(cells: dict, versus: dict | None = None, label: str = "") -> None:
    """The real-text world's tables: every figure per model (mean ± sd over seeds [95%
    t-interval], prior-only baseline, probes or questions), EaE and EaE-unsup paired by seed with
    No-EaE and with each other, each memory model against its memory output zeroed (and that
    against No-EaE), and with `versus` (the cells of other stores: another
    recipe) each model against itself there, paired by seed."""
    groups = real_groups(cells)
    if not groups:
        return
    shared = [k for k in REAL if not k.startswith("memory_")]
    print("## Real text: the Vital Articles + the gensim sample (world `vital`; `vital<N>`: its N most frequent entities)\n")
    print("### Every figure: mean ± sd over seeds [95% t-interval of the mean] (prior-only baseline; "
          "questions or probes per seed)\n")
    rows = [[w, z, v, str(len(g["seeds"])), g["steps"], g.get("qa", "–")] + [figure_cell(g, k) for k in REAL]
            for (w, z, v), g in sorted(groups.items())]
    print(table(["world", "transformer", "model", "seeds", "steps x batch", "QA steps x batch at lr"] + [REAL[k][2] for k in REAL],
                rows) + "\n")
    rows = []
    names = {"eae": "EaE", "eae_unsup": "EaE-unsup", "no_eae": "No-EaE"}
    for w, z in sorted({(w, z) for w, z, _ in groups}):
        for first, second in (("eae", "no_eae"), ("eae_unsup", "no_eae"), ("eae", "eae_unsup")):
            a, b = groups.get((w, z, first)), groups.get((w, z, second))
            if a and b:
                rows.append([w, z, f"{names[first]} − {names[second]}"]
                            + [gap_cell(paired_gap(a, k, b, k), k == "masked_ppl") for k in shared])
        for v in ("eae", "eae_unsup"):  # what the memory's output adds at inference, and what is left without it
            if not (g := groups.get((w, z, v))):
                continue
            rows.append([w, z, f"{names[v]} − {names[v]} with its memory output zeroed"]
                        + [gap_cell(paired_gap(g, k, g, f"memory_off_{k}")) if f"memory_off_{k}" in REAL else "–"
                           for k in shared])
            if no := groups.get((w, z, "no_eae")):
                rows.append([w, z, f"{names[v]} with its memory output zeroed − No-EaE"]
                            + [gap_cell(paired_gap(g, f"memory_off_{k}", no, k)) if f"memory_off_{k}" in REAL else "–"
                               for k in shared])
    print("### Paired by seed: mean gap [95% t-interval] (points)\n")
    print(table(["world", "transformer", "pair"] + [REAL[k][2] for k in shared], rows) + "\n")
    other = real_groups(versus or {})
    rows = [[w, z, v, pretraining_pair(g, other[(w, z, v)]), f"{g.get('qa', '–')} − {other[(w, z, v)].get('qa', '–')}"]
            + [gap_cell(paired_gap(g, k, other[(w, z, v)], k), k == "masked_ppl") for k in shared]
            for (w, z, v), g in sorted(groups.items()) if (w, z, v) in other]
    if rows:
        print(f"### The same model and seed on real text, these stores − {label}: mean gap [95% t-interval] (points)\n")
        print(table(["world", "transformer", "model", "steps x batch", "QA steps x batch at lr"] + [REAL[k][2] for k in shared],
                    rows))
        print(VERSUS_NOTE)


def print_answer_frequency(cells: dict, data_dirs: dict[str, Path]) -> None:
    """QA test EM by the answer entity's frequency in the pretraining text (paper Figure 3):
    per world with its `eae data build` directory, per model, mean over the seeds whose QA
    predictions were kept, and EaE − No-EaE paired by seed per bucket."""
    from eae_platform.evaluate.analysis import FREQUENCY_BINS, bin_label, bucket, entity_frequencies

    for world, data_dir in data_dirs.items():
        frequencies = entity_frequencies(data_dir)
        per = defaultdict(lambda: defaultdict(dict))  # (size, variant) -> bucket -> seed -> EM
        counts = defaultdict(Counter)
        for cell, runs in cells.items():
            m = CELL.match(cell)
            rows = runs.get(f"qa-{cell}", {}).get("predictions")
            if f"{m['world']}" + (f"r{m['renderings']}" if m["renderings"] else "") != world or not rows:
                continue
            hits = defaultdict(list)
            for r in rows:
                b = bucket(frequencies.get(r["answer_id"], 0), FREQUENCY_BINS) if r.get("answer_id") is not None else None
                if b:
                    hits[b].append(bool(r["correct"]))
            for b, flags in hits.items():
                per[(m["size"], m["variant"])][b][int(m["seed"])] = sum(flags) / len(flags)
                counts[(m["size"], m["variant"])][b] = len(flags)
        if not per:
            continue
        labels = [bin_label(lo, hi) for lo, hi in FREQUENCY_BINS]
        print(f"### QA test EM by the answer's linked mentions in the pretraining text (Figure 3), world {world}: "
              "mean over seeds; EaE − No-EaE paired by seed [95% t-interval]\n")
        rows = []
        for size in sorted({z for z, _ in per}):
            for b in labels:
                got = {v: per[(z, v)].get(b) for z, v in per if z == size}
                if not any(got.values()):
                    continue
                row = [size, b, f"{max(counts[(size, v)][b] for v in got):,}"]
                for v in ("eae", "no_eae", "eae_unsup"):
                    xs = list((got.get(v) or {}).values())
                    row.append(f"{100 * statistics.fmean(xs):.1f} (seeds={len(xs)})" if xs else "–")
                gap = None
                if got.get("eae") and got.get("no_eae"):
                    gap = paired_gap({"seeds": list(got["eae"]), "f": list(got["eae"].values())}, "f",
                                     {"seeds": list(got["no_eae"]), "f": list(got["no_eae"].values())}, "f")
                row.append(gap_cell(gap))
                rows.append(row)
        print(table(["transformer", "answer's mentions", "questions per seed", "EaE", "No-EaE", "EaE-unsup",
                     "EaE − No-EaE"], rows) + "\n")


def print_tables(cells: dict, figure: Path | None) -> dict:
    """Every regime table; returns summarize's groups (for --versus)."""
    groups, setting = summarize(cells)
    if not groups:  # real-text stores only: their tables are print_real_text's, not empty ones here
        return groups
    print("### Settings\n")
    rows = []
    for (w, z), s in sorted(setting.items()):
        rows.append([world_label(w), z, f"{s['facts']:,.0f}", f"{s['transformer']:,}", f"{s['ratio']:.3f}",
                     f"{s['table']:,}", f"{s['steps']:,} x {s['batch']}"])
    print(table(["world (entities)", "transformer", "facts stated in pretraining text", "transformer params",
                 "facts per transformer param", "entity table params (EaE)", "steps x batch"], rows) + "\n")

    print("### Every figure: mean ± sd over seeds [95% t-interval of the mean] (prior-only baseline; "
          "questions or probes per seed)\n")
    head = ["world", "transformer", "model", "seeds"] + [METRICS[k][2] for k in METRICS]
    rows = []
    for (w, z, v), g in sorted(groups.items()):
        row = [world_label(w), z, v, str(len(g["seeds"]))]
        row += [figure_cell(g, k) for k in METRICS]
        rows.append(row)
    print(table(head, rows) + "\n")

    print("### EaE − No-EaE, paired by seed: mean gap [95% t-interval] (points)\n")
    gaps = {}
    rows = []
    for (w, z), s in sorted(setting.items()):
        eae, no = groups.get((w, z, "eae")), groups.get((w, z, "no_eae"))
        if not eae or not no:
            continue
        row = [world_label(w), z, f"{s['ratio']:.3f}"]
        for k in PAIRED:
            gap = paired_gap(eae, k, no, k)
            if gap:
                gaps[(w, z, k)] = gap
            row.append(gap_cell(gap, lower_is_better=k == "masked_ppl"))
        rows.append(row)
    print(table(["world", "transformer", "facts / param"] + [METRICS[k][2] for k in PAIRED], rows))
    print("\n✓: EaE better, the interval excludes 0; ✗: No-EaE better, the interval excludes 0; "
          "~: the interval holds 0 (not reproduced). PPL: lower is better, so a negative gap favours EaE.\n")
    print_growth({(w, z): (groups[(w, z, "eae")], groups[(w, z, "no_eae")]) for (w, z) in setting
                  if groups.get((w, z, "eae")) and groups.get((w, z, "no_eae"))}, setting)
    print_ablations(groups)
    if figure:
        draw(setting, gaps, figure)
    return groups


def figure_cell(g: dict, k: str) -> str:
    """One metric of a group of seeds: "mean ± sd [95% t-interval] (prior P; n=N)"; one seed:
    the Wilson interval over its questions or probes instead."""
    xs = [x for x in g[k] if x is not None]
    if not xs:
        return "–"
    mean, sd, half = mean_ci(xs)
    scale = 1 if k == "masked_ppl" else 100
    cell = f"{mean * scale:.1f}"
    if len(xs) > 1:
        cell += f" ± {sd * scale:.1f} [{(mean - half) * scale:.1f}, {(mean + half) * scale:.1f}]"
    ns = [x for x in g.get(f"{k}_n", []) if x is not None]
    if len(xs) == 1 and ns:  # one seed: the interval over its questions or probes
        lo, hi = wilson(xs[0], ns[0])
        cell += f" [{percent(lo)}, {percent(hi)}]"
    priors = [x for x in g.get(f"{k}_prior", []) if x is not None]
    notes = ([f"prior {percent(statistics.fmean(priors))}"] if priors else []) + ([f"n={ns[0]:,.0f}"] if ns else [])
    return cell + (f" ({'; '.join(notes)})" if notes else "")


def paired_gap(a: dict, ka: str, b: dict, kb: str) -> tuple[float, float, int] | None:
    """(mean, 95% half-width, seeds) in points of a[ka] − b[kb] over the seeds both have."""
    x = dict(zip(a["seeds"], a[ka]))
    y = dict(zip(b["seeds"], b[kb]))
    diffs = [x[s] - y[s] for s in x if s in y and x[s] is not None and y[s] is not None]
    if not diffs:
        return None
    mean, _, half = mean_ci(diffs)
    scale = 1 if ka == "masked_ppl" else 100
    return mean * scale, half * scale, len(diffs)


def gap_cell(gap, lower_is_better: bool = False) -> str:
    """"+1.2 [-0.3, +2.7] ✓" (✓: the first better, the interval excludes 0; ✗: the second)."""
    if gap is None:
        return "–"
    mean, half, n = gap
    if math.isnan(half):
        return f"{mean:+.1f} (n=1)"
    better = -1 if lower_is_better else 1
    verdict = " ✓" if better * mean - half > 0 else " ✗" if better * mean + half < 0 else " ~"
    return f"{mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}]{verdict} (seeds={n})"


def gap_per_seed(eae: dict, no: dict, k: str) -> list[float]:
    """EaE − No-EaE on metric k, one value a seed both hold, in points."""
    x, y = dict(zip(eae["seeds"], eae[k])), dict(zip(no["seeds"], no[k]))
    scale = 1 if k == "masked_ppl" else 100
    return [(x[s] - y[s]) * scale for s in x if s in y and x[s] is not None and y[s] is not None]


def welch_gap(b: list[float], a: list[float]) -> tuple[float, float, int] | None:
    """(mean(b) − mean(a), 95% half-width, seeds) with Welch's t-interval: the two points' seeds
    are separate runs (another world), so unpaired, with unequal variances (the
    Welch-Satterthwaite degrees of freedom, fractional: scipy's t quantile, as T95 has only whole
    ones; scipy comes with MLflow)."""
    if not a or not b:
        return None
    diff = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan, min(len(a), len(b))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return diff, 0.0, min(len(a), len(b))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy.stats import t

    return diff, float(t.ppf(0.975, df)) * math.sqrt(va + vb), min(len(a), len(b))


def print_growth(pairs: dict, setting: dict, keys: tuple = PAIRED, budgets: dict | None = None) -> None:
    """The study's question, does EaE's edge grow with the facts a transformer must hold, asked
    of the stores' points directly: within each transformer, for each world and the next larger
    one, the EaE − No-EaE gap there − the gap here, over seeds (Welch). Comparing the two points'
    intervals by eye understates what seeds say (rounds 56-58: every 20k seed above every 100k
    seed on QA, the intervals overlapping). pairs[(world, size)] = (EaE's group, No-EaE's);
    budgets[(world, size)] = "steps x batch" where it is not setting's (the picks' recipes)."""
    def budget(w, z):
        if budgets and (w, z) in budgets:
            return budgets[(w, z)]
        return f"{setting[(w, z)].get('steps', 0):,} x {setting[(w, z)].get('batch', 0)}"

    rows = []
    for z in sorted({z for _, z in pairs}):
        points = sorted((setting[(w, z)]["ratio"], w) for (w, z2) in pairs if z2 == z and (w, z) in setting)
        for (r1, w1), (r2, w2) in zip(points, points[1:]):
            (e1, n1), (e2, n2) = pairs[(w1, z)], pairs[(w2, z)]
            cells = [gap_cell(welch_gap(gap_per_seed(e2, n2, k), gap_per_seed(e1, n1, k)), k == "masked_ppl")
                     for k in keys]
            label = f"{world_label(w1)} → {world_label(w2)} ({r1:.3f} → {r2:.3f}"
            if budget(w1, z) != budget(w2, z):  # the points trained at other budgets: said in the row, not compared silently
                label += f"; {budget(w1, z)} → {budget(w2, z)}"
            rows.append([z, label + ")"] + cells)
    if rows:
        print("### EaE − No-EaE at the larger world − at the smaller, within a transformer: difference of the mean "
              "gaps [95% Welch t-interval] (points)\n")
        print(table(["transformer", "worlds (facts / param)"] + [METRICS[k][2] for k in keys], rows))
        print("\n✓: EaE's edge larger with more facts (it grows), the interval excluding 0; ✗: smaller (it shrinks); "
              "~: the interval holds 0. The points' seeds are separate runs: unpaired. PPL: a negative difference "
              "is growth.\n")


def print_ablations(groups: dict) -> None:
    """EaE against its ablations, paired by seed, on every shared metric: EaE − EaE-unsup (no
    entity-linking supervision of the memory), EaE − MM and No-EaE − MM (the paper's Table 2
    rows: EaE > MM, MM ≈ No-EaE), EaE-unsup − No-EaE (what an unsupervised memory adds); then
    ABLATIONS within EaE."""
    settings = sorted({(w, z) for (w, z, v) in groups if v == "eae"})
    for first, variant, label in (("eae", "eae_unsup", "EaE − EaE-unsup"), ("eae", "mm", "EaE − MM"),
                                  ("no_eae", "mm", "No-EaE − MM"), ("eae_unsup", "no_eae", "EaE-unsup − No-EaE")):
        rows = []
        for w, z in settings:
            one, other = groups.get((w, z, first)), groups.get((w, z, variant))
            if one and other:
                rows.append([world_label(w), z] + [gap_cell(paired_gap(one, k, other, k), k == "masked_ppl") for k in PAIRED])
        if rows:
            print(f"### {label}, paired by seed: mean gap [95% t-interval] (points)\n")
            print(table(["world", "transformer"] + [METRICS[k][2] for k in PAIRED], rows) + "\n")
    cross = [("memory_off_recall", "recall_stated"), ("memory_off_qa_em", "qa_em"), ("memory_off_qa_em_stated", "qa_em_stated")]
    rows = []
    for w, z in settings:
        no = groups.get((w, z, "no_eae"))
        cells = [gap_cell(paired_gap(groups[(w, z, "eae")], a, no, b)) for a, b in cross] if no else []
        if any(c != "–" for c in cells):
            rows.append([world_label(w), z] + cells)
    if rows:  # what is left of EaE's edge without what its memory adds at inference
        print("### EaE with its memory output zeroed at evaluation − No-EaE, paired by seed: mean gap [95% t-interval] (points)\n")
        print(table(["world", "transformer"] + [METRICS[b][2] for _, b in cross], rows) + "\n")
    for label, pairs in ABLATIONS:
        rows = []
        for w, z in settings:
            eae = groups[(w, z, "eae")]
            cells = [gap_cell(paired_gap(eae, a, eae, b)) for a, b in pairs]
            if any(c != "–" for c in cells):
                rows.append([world_label(w), z] + cells)
        if rows:
            print(f"### EaE, {label}: mean gap [95% t-interval] (points)\n")
            print(table(["world", "transformer"] + [f"{METRICS[a][2]} − {METRICS[b][2]}" for a, b in pairs], rows) + "\n")


def print_versus(groups: dict, other: dict, label: str) -> None:
    """Each model against itself in other stores (another recipe: learning rate, steps), paired
    by seed: these stores − those, per (world, transformer, model) both hold."""
    rows = [[world_label(w), z, v] + [gap_cell(paired_gap(g, k, other[(w, z, v)], k), k == "masked_ppl") for k in PAIRED]
            for (w, z, v), g in sorted(groups.items()) if (w, z, v) in other]
    if rows:
        print(f"### The same model and seed, these stores − {label}: mean gap [95% t-interval] (points)\n")
        print(table(["world", "transformer", "model"] + [METRICS[k][2] for k in PAIRED], rows))
        print(VERSUS_NOTE)


def pretrain_recipe(runs: dict, cell: str) -> tuple | None:
    """A cell's pretraining recipe, (lr, steps, warmup share, batch, rows shuffled, the other
    settings as settings_label words), from its pretraining run's params; None without that run or
    those params."""
    pre = runs.get(cell)
    if pre is None:
        return None
    t = pre["params"]
    try:
        return (float(t["train.lr"]), int(t["train.max_steps"]), float(t["train.warmup_fraction"]),
                int(t["train.batch_size"]),
                # runs from before train.shuffle_rows read their rows in file order
                t.get("train.shuffle_rows", "false").lower() == "true",
                settings_label(t))
    except KeyError:  # a run that did not log its config
        return None


def recipe_of(runs: dict, cell: str) -> tuple | None:
    """A cell's training recipe: its pretraining recipe (pretrain_recipe) and (lr, steps) of its
    QA fine-tuning, from the runs' params; None without both runs."""
    pre, qa = pretrain_recipe(runs, cell), runs.get("qa-" + cell)
    if pre is None or qa is None:
        return None
    f = qa["params"]
    try:
        return (*pre, float(f["finetune.lr"]), int(f["finetune.max_steps"]))
    except KeyError:  # a run that did not log its config (read_recipes counts these)
        return None


def qa_only(runs: dict, cell: str) -> dict | None:
    """The QA run of a cell of QA runs only (finetune.sh with FROM_STUDY: another QA recipe for
    a study's models), else None."""
    return runs.get("qa-" + cell) if cell not in runs else None


def model_out(runs: dict, cell: str) -> str | None:
    """Where the cell's pretraining wrote its model (train.out), which a QA run of that model
    names as its finetune.init: the runs name the model by path, not by MLflow run id, since
    each cell's store is a file store of its own."""
    return runs.get(cell, {}).get("params", {}).get("train.out")


def merge_one_recipe(paths: list[Path], seeds: set[int] | None = None) -> tuple[dict, list[str]]:
    """The stores' cells merged, a later store's cell winning (a rerun, or the same cell at
    another recipe on purpose, as round 7's MM with a longer warmup: printed, never silent), and
    the (world, transformer, model) groups whose merged cells hold more than one pretraining
    recipe, synthetic or real text: one table would mix them, so main() refuses them (compare
    recipes with --versus or --best-recipe, or keep the seeds the later store trained: `seeds`,
    --seeds, leaves the cells of other seeds out of every store). A cell of QA runs only
    (FROM_STUDY: another QA recipe for a study's models) replaces the QA run of the cell, in an earlier store, whose pretraining wrote its model
    (train.out == its finetune.init), keeping that cell's pretraining and evaluations; without
    one it is left out, and both are printed (a QA-only cell winning whole would drop the cell's
    pretraining from the tables without a word)."""
    cells: dict[str, tuple[int, dict]] = {}
    replaced, rerun, joined, unlinked = Counter(), Counter(), Counter(), Counter()
    for i, path in enumerate(paths):  # a cell keeps its store's index: sorted, the command line's order
        for cell, runs in read_cells(path).items():
            if seeds is not None and (key := cell_key(cell)) and key[3] not in seeds:
                continue
            if CELL.match(cell) and (qa := qa_only(runs, cell)) is not None:
                out = model_out(cells[cell][1], cell) if cell in cells else None
                if out is None or out != qa["params"].get("finetune.init"):
                    unlinked[str(path)] += 1
                    continue
                joined[str(path)] += 1
                cells[cell] = (cells[cell][0], {**cells[cell][1], "qa-" + cell: qa})  # the pretraining's store
                continue
            if cell in cells and (old := paths[cells[cell][0]]) != path:  # (one store passed twice: the same runs)
                before, after = pretrain_recipe(cells[cell][1], cell), pretrain_recipe(runs, cell)
                if before != after and None not in (before, after):
                    replaced[(str(old), recipe_label(before), str(path), recipe_label(after))] += 1
                elif before is not None and before == after:  # a rerun: its figures move by the runs' own noise (round 22)
                    rerun[(str(old), str(path), recipe_label(before))] += 1
            cells[cell] = (i, runs)
    for (old, before, new, after), n in sorted(replaced.items()):
        print(f"({n} cell(s) of {old}, pretrained at {before}, replaced by {new}'s at {after}: a later store's cell wins)\n")
    for (old, new, recipe), n in sorted(rerun.items()):
        print(f"({n} cell(s) of {old} replaced by {new}'s rerun at the same recipe, {recipe}: a later store's cell wins)\n")
    for path, n in sorted(joined.items()):
        print(f"({n} cell(s) of {path}: QA runs only, each in place of the QA run of the cell whose pretraining wrote its model)\n")
    for path, n in sorted(unlinked.items()):
        print(f"({n} cell(s) of {path} left out: QA runs only, and no earlier store holds the pretraining run "
              "that wrote the model they tuned (train.out = their finetune.init))\n")
    groups = defaultdict(lambda: defaultdict(set))
    for cell, (i, runs) in cells.items():
        r = pretrain_recipe(runs, cell)
        # real text too: its table's "steps x batch" names one cell's recipe, so a mix would pass unseen
        if cell_key(cell) and r is not None:
            groups[cell.rsplit("-s", 1)[0]][r].add(i)  # the cell's name less its seed: w5000r4-medium-eae
    mixed = [f"{g}: " + "; ".join(f"{recipe_label(r)} ({', '.join(dict.fromkeys(str(paths[i]) for i in sorted(stores)))})"
                                  for r, stores in sorted(recipes.items(), key=lambda rs: min(rs[1])))
             for g, recipes in sorted(groups.items()) if len(recipes) > 1]
    return {cell: runs for cell, (_, runs) in cells.items()}, mixed


def recipe_label(r: tuple) -> str:
    """recipe_of's tuple, or pretrain_recipe's (no QA part)."""
    lr, steps, warmup, batch, shuffled, memory, *qa = r
    order = "rows shuffled" if shuffled else "file order"
    return (f"lr {lr_label(lr)}{memory} x {steps:,} ({warmup:.0%} warmup, batch {batch}, {order})"
            + (f"; QA {qa[1]} at {lr_label(qa[0])}" if qa else ""))


def settings_label(params: dict) -> str:
    """A pretraining run's settings beyond lr and steps where they are not the paper's (or the
    preset's): ", memory lr x10" (train.memory_lr_scale: the entity table and the memory at 10 x
    the lr), ", X3 = X2 + X1" (model.memory_layer_norm off), ", memory EL weight 0.1"
    (model.weight_memory_el, the memory's entity-linking loss), ", memory query detached"
    (model.memory_query_detached) and ", from scratch" (the `minilm` preset without
    train.init_encoder, which it otherwise starts from); "" for the paper's (and runs from before
    these settings)."""
    scale = float(params.get("train.memory_lr_scale", 1))
    weight = float(params.get("model.weight_memory_el", 1))
    unloaded = params.get("train.init_encoder") in (None, "", "None", "null")  # MLflow logs None as null
    return "".join([
        "" if scale == 1 else f", memory lr x{scale:g}",
        ", X3 = X2 + X1" if params.get("model.memory_layer_norm", "True").lower() == "false" else "",
        "" if weight == 1 else f", memory EL weight {weight:g}",
        ", memory query detached" if params.get("model.memory_query_detached", "False").lower() == "true" else "",
        ", from scratch" if params.get("model.preset") == "minilm" and unloaded else "",
    ])


def lr_label(lr: float) -> str:
    """3e-4, not 0.0003."""
    return f"{lr:.0e}".replace("e-0", "e-")


def read_recipes(paths: list[Path]) -> dict[tuple, dict]:
    """{recipe: cells} over the stores, each cell under the recipe it was trained with (the same
    cell name trained at several recipes lands in several); a later store's cell wins within one
    recipe, as in main(). A cell of QA runs only (experiments/regime/finetune.sh with FROM_STUDY:
    another QA recipe for another study's models) takes its pretraining and evaluations from the
    cell, among the stores, whose pretraining wrote the model it tuned (model_out ==
    finetune.init)."""
    stores = [read_cells(path) for path in paths]
    wrote: dict[tuple, dict] = defaultdict(dict)  # (cell, train.out) -> {pretraining recipe: runs}
    for cells in stores:
        for cell, runs in cells.items():
            if CELL.match(cell) and (out := model_out(runs, cell)):
                wrote[(cell, out)][pretrain_recipe(runs, cell)] = runs
    by_recipe: dict[tuple, dict] = defaultdict(dict)
    skipped, unlinked = 0, 0
    for cells in stores:
        for cell, runs in cells.items():
            if not CELL.match(cell):  # the real-text world has no recipe grid
                continue
            if (qa := qa_only(runs, cell)) is not None:
                sources = wrote.get((cell, qa["params"].get("finetune.init")), {})
                if len(sources) != 1:  # its model's store not given, or two recipes wrote one path
                    unlinked += 1
                    continue
                runs = {**next(iter(sources.values())), "qa-" + cell: qa}
            r = recipe_of(runs, cell)
            if r is None:
                skipped += 1
            else:
                by_recipe[r][cell] = runs
    if skipped:
        print(f"({skipped} cell(s) left out: no QA run, or a run without its recipe's params)\n")
    if unlinked:
        print(f"({unlinked} cell(s) of QA runs only left out: no store given holds one pretraining run "
              "that wrote the model they tuned (train.out = their finetune.init))\n")
    return by_recipe


def best_recipes(by_recipe: dict[tuple, dict]) -> tuple[dict[tuple, list], dict]:
    """{(world, size, variant): [(recipe, group, dev EM on the seeds every recipe of that model
    holds, dev EM on all the recipe's seeds), ...]}, best first by the first dev figure (by the
    second when fewer than 3 seeds are common): the dev questions pick the recipe, the test
    questions then compare the picks. And summarize's setting per (world, size) (facts and
    transformer parameters: the same at every recipe)."""
    candidates: dict[tuple, list] = defaultdict(list)
    setting: dict[tuple, dict] = {}
    for r, cells in by_recipe.items():
        groups, recipe_setting = summarize(cells)
        setting.update(recipe_setting)
        for key, g in groups.items():
            if any(x is not None for x in g["qa_dev_em"]):
                candidates[key].append((r, g))
    ranked = {}
    for key, options in candidates.items():
        common = set.intersection(*(set(g["seeds"]) for _, g in options))
        rows = []
        for r, g in options:
            dev = {s: x for s, x in zip(g["seeds"], g["qa_dev_em"]) if x is not None}
            on_common = [x for s, x in dev.items() if s in common]
            rows.append((r, g, statistics.fmean(on_common) if len(common) >= 3 and on_common else None,
                         statistics.fmean(dev.values())))
        ranked[key] = sorted(rows, key=lambda row: -(row[2] if row[2] is not None else row[3]))
    return ranked, setting


def _picks(ranked: dict[tuple, list], w, z, other: str) -> list[tuple]:
    """EaE's and `other`'s picks at the point (w, z), [(rule, EaE's row, other's row)]: the pick
    on the seeds all of a model's recipes hold, then, where it differs, the pick on all seeds."""
    by_all = {v: max(ranked[(w, z, v)], key=lambda row: row[3]) for v in ("eae", other)}
    first = (ranked[(w, z, "eae")][0], ranked[(w, z, other)][0])
    # best_recipes falls back to all of a recipe's seeds where its recipes share fewer than 3
    rule = "common seeds" if all(row[2] is not None for row in first) else "all its seeds (fewer than 3 in common)"
    picks = [(rule, *first)]
    if (by_all["eae"][0], by_all[other][0]) != (first[0][0], first[1][0]):
        picks.append(("all its seeds", by_all["eae"], by_all[other]))
    return picks


def _table_lr(*recipes: tuple) -> str:
    """The picks' table lr, "10x" or "10x / 1x", written under the point (rounds 19-21 turned
    points over with it)."""
    scale = [r[5].split("memory lr x")[1].split(",")[0] + "x" if "memory lr x" in r[5] else "1x" for r in recipes]
    return scale[0] if len(set(scale)) == 1 else " / ".join(scale)


def print_best_recipes(ranked: dict[tuple, list], setting: dict) -> tuple[dict, dict]:
    """Each model at its best recipe on dev QA EM, then EaE − No-EaE (and EaE − EaE-unsup, where
    the stores hold it) at those recipes on test, paired by seed: a fair test of EaE's QA edge
    needs each model's own best recipe. Where the pick on all of each recipe's seeds differs
    from the pick on the common ones, both pairs.
    Returns the first pair's gaps, {(world, size, metric): gap}, and what each point's picks
    were, {(world, size): words}, for draw() (--figure)."""
    print("### Each model's recipes: QA dev EM picks one, test EM reported (mean over seeds [95% t-interval])\n")
    rows = []
    for (w, z, v), options in sorted(ranked.items()):
        for i, (r, g, dev_common, dev_all) in enumerate(options):
            rows.append([world_label(w), z, v, recipe_label(r) + (" **(picked)**" if i == 0 else ""),
                         str(len(g["seeds"])), percent(dev_common), percent(dev_all), figure_cell(g, "qa_em")])
    print(table(["world", "transformer", "model", "recipe", "seeds", "QA dev EM, seeds all its recipes hold",
                 "QA dev EM, all its seeds", "QA test EM"], rows))
    print("\nThe pick: the best dev EM on the seeds every recipe of the model holds (on all its seeds when fewer than 3 are).\n")
    keys = ("qa_em", "qa_em_stated", "qa_em_unstated", "recall_stated", "masked_entity")
    gaps, notes = {}, {}
    picked, budgets = {}, {}  # the pairs at the picks, for print_growth
    # EaE − EaE-unsup at the picks too (Table 2's ablation): each model at its own best QA recipe
    for other, name in (("no_eae", "No-EaE"), ("eae_unsup", "EaE-unsup")):
        rows, empty = [], []
        for (w, z) in sorted({(w, z) for (w, z, v) in ranked if v == "eae"}):
            if (w, z, other) not in ranked:
                continue
            ratio = f"{setting[(w, z)]['ratio']:.3f}" if (w, z) in setting else "–"
            for i, (rule, (re_, eae, *_), (rn, no, *_)) in enumerate(_picks(ranked, w, z, other)):
                pair = {k: paired_gap(eae, k, no, k) for k in keys}
                if not any(pair.values()):  # no seed in common (round 5's EaE-unsup against 10x EaE)
                    continue
                if i == 0 and other == "no_eae":  # the figure: the pick on the common seeds (where they suffice)
                    gaps.update({(w, z, k): gap for k, gap in pair.items() if gap})
                    notes[(w, z)] = f"{z}, table {_table_lr(re_, rn)}"
                    picked[(w, z)] = (eae, no)
                    budgets[(w, z)] = " / ".join(dict.fromkeys(f"{r[1]:,} x {r[3]}" for r in (re_, rn)))
                rows.append([world_label(w), z, ratio, rule, recipe_label(re_), recipe_label(rn)]
                            + [gap_cell(pair[k]) for k in keys])
                empty.extend(_why_empty(f"{world_label(w)}, {z} ({rule})", pair, {"EaE": eae, name: no}))
        if rows:
            print(f"### EaE − {name}, each at its best recipe on dev QA, paired by seed: mean gap [95% t-interval] (points)\n")
            print(table(["world", "transformer", "facts / param", "picked on dev EM over", "EaE's recipe", f"{name}'s recipe"]
                        + [METRICS[k][2] for k in keys], rows))
            print(f"\n✓: EaE better, the interval excludes 0; ✗: {name} better; ~: the interval holds 0.\n")
            if empty:
                print("".join(f"(–: {line})\n" for line in empty))
        if other == "no_eae":
            print_growth(picked, setting, keys, budgets)
    return gaps, notes


def _why_empty(where: str, pair: dict, picks: dict[str, dict]) -> list[str]:
    """Why a gap at the picks is "–", said under the table: a picked run without the figure (round
    36's No-EaE pick at 100k had QA runs only) or no seed where both picks have it."""
    lacking = defaultdict(list)
    for k, gap in pair.items():
        if gap is None:
            names = [f"{n}'s" for n, g in picks.items() if all(x is None for x in g.get(k, []))]
            why = " and ".join(names) + " picked runs have none" if names else "the picks have it on no seed in common"
            lacking[why].append(METRICS[k][2])
    return [f"{where}: {'; '.join(metrics)}: {why}" for why, metrics in lacking.items()]


# --dev-curve: what `eae pretrain` logs every train.eval_every steps, (key, label, scale)
DEV_CURVE = (("dev/entity_accuracy", "dev masked entity acc", 100), ("dev/perplexity", "dev PPL", 1))


def cell_key(cell: str) -> tuple[str, str, str, int] | None:
    """(world label, transformer, model, seed) of a synthetic or real-text cell's name, else None."""
    if m := CELL.match(cell):
        return world_label((int(m["world"]), int(m["renderings"] or 1))), m["size"], m["variant"], int(m["seed"])
    if m := REAL_CELL.match(cell):
        return m["world"], m["size"], m["variant"], int(m["seed"])
    return None


def stopped_at(runs: dict, cell: str) -> str | None:
    """"step 2,300 of 6,000 (KILLED)" for a cell whose pretraining run did not finish (paused by
    its time budget or deadline, or failed), None for a finished one or a cell without that run."""
    pre = runs.get(cell)
    if pre is None or pre["status"] == "FINISHED":
        return None
    step = pre.get("last_step")
    steps = pre["params"].get("train.max_steps")
    return (f"step {step:,}" if step is not None else "no step") + (f" of {int(steps):,}" if steps else "") + f" ({pre['status']})"


def note_unfinished(cells: dict) -> None:
    """Say which cells the tables leave out because their pretraining did not finish (a paused
    study's stores: summarize and real_groups keep finished runs only), never silently."""
    stopped = Counter(s for cell, runs in cells.items() if cell_key(cell) and (s := stopped_at(runs, cell)))
    if stopped:
        print(f"({sum(stopped.values())} cell(s) left out, their pretraining not finished: "
              + "; ".join(f"{n} at {s}" for s, n in sorted(stopped.items()))
              + ". Run the study's pretrain stage again to continue them; --dev-curve prints the dev evaluations they logged)\n")


def dev_cell(xs: list[float]) -> str:
    """One model's figure at a step over its seeds: "12.0 ± 2.8" (one seed: "12.0"; none: "–")."""
    if not xs:
        return "–"
    mean, sd, _ = mean_ci(xs)
    return f"{mean:.1f}" + (f" ± {sd:.1f}" if len(xs) > 1 else "")


def dev_gap(diffs: list[float]) -> tuple[float, float, int] | None:
    """gap_cell's (mean, 95% half-width, seeds) of per-seed differences; None without any."""
    if not diffs:
        return None
    mean, _, half = mean_ci(diffs)
    return mean, half, len(diffs)


def dev_at(seeds: dict, key: str, step: int) -> dict:
    """{seed: its run's dev figure `key` at `step`} of {seed: pretraining run} (None where that
    seed did not log it)."""
    return {s: r["dev"].get(key, {}).get(step) for s, r in seeds.items()}


def read_dev_curves(paths: list[Path]) -> dict[tuple, dict]:
    """(world, size, recipe) -> model -> {seed: pretraining run} of the runs that logged a dev
    evaluation; within a recipe a later store's cell wins (a rerun), as in the tables."""
    curves: dict[tuple, dict] = defaultdict(lambda: defaultdict(dict))
    for path in paths:
        for cell, runs in read_cells(path).items():
            key, recipe = cell_key(cell), pretrain_recipe(runs, cell)
            if key and recipe and runs[cell].get("dev"):
                world, size, variant, seed = key
                curves[(world, size, recipe)][variant][seed] = runs[cell]
    return curves


def print_dev_curves(paths: list[Path], versus: list[Path] = ()) -> None:
    """--dev-curve: each pretraining run's dev evaluations by step, finished or not, per world,
    transformer and pretraining recipe: each model's mean ± sd over its seeds and EaE − No-EaE
    paired by seed at each step. A paused study (no QA, no evaluations yet) can be compared on
    what it logged, at a point of its lr schedule: mid-run figures, not the study's result. With
    `versus` (stores of the same world and transformer at another recipe), each model is also
    paired by seed with the same model there and with No-EaE there: a recipe of one model (round
    62's EaE with its memory's query detached) against an earlier store's EaE and No-EaE."""
    curves, other = read_dev_curves(paths), read_dev_curves(list(versus))
    if not curves:
        raise SystemExit("--dev-curve: no pretraining run in these stores logged a dev evaluation")
    for (world, size, recipe), models in sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][1], recipe_label(kv[0][2]))):
        variants = [v for v in VARIANTS if v in models]
        print(f"### Pretraining's dev evaluations by step: {world}, `{size}`, {recipe_label(recipe)}\n")
        for v in variants:
            seeds = models[v]
            states = Counter("finished" if r["status"] == "FINISHED" else f"stopped at step {r['last_step']:,}"
                             for r in seeds.values())
            print(f"- {v}, seeds {', '.join(map(str, sorted(seeds)))}: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
        pairs = [(models, "eae", models, "no_eae", "EaE − No-EaE")] if "eae" in models and "no_eae" in models else []
        theirs_all = [(r, theirs) for (w, z, r), theirs in sorted(other.items(), key=lambda kv: recipe_label(kv[0][2]))
                      if (w, z) == (world, size) and r != recipe]  # a recipe's cells against themselves: nothing to pair
        for letter, (r, theirs) in zip(string.ascii_lowercase, theirs_all):
            print(f"- --versus ({letter}): {recipe_label(r)}; "
                  + ", ".join(f"{u}, seeds {', '.join(map(str, sorted(theirs[u])))}" for u in VARIANTS if u in theirs))
            pairs += [(models, v, theirs, u, f"{v} − ({letter}) {u}")
                      for v in variants for u in dict.fromkeys([v, "no_eae"]) if u in theirs]
        head, steps = ["step"], sorted({step for m in models.values() for r in m.values() for c in r["dev"].values() for step in c})
        for _, label, _ in DEV_CURVE:
            head += [f"{v} {label}" for v in variants] + [f"{name}, {label}" if pairs[1:] else name for *_, name in pairs]
        rows = []
        for step in steps:
            row = [f"{step:,}"]
            for key, _, scale in DEV_CURVE:
                for v in variants:
                    xs = [x * scale for x in dev_at(models[v], key, step).values() if x is not None]
                    row.append(dev_cell(xs))
                for ours, v, theirs, u, _ in pairs:  # paired by seed: the seeds both logged at this step
                    a, b = dev_at(ours[v], key, step), dev_at(theirs[u], key, step)
                    diffs = [(a[s] - b[s]) * scale for s in a if a[s] is not None and b.get(s) is not None]
                    row.append(gap_cell(dev_gap(diffs), lower_is_better=scale == 1))
            rows.append(row)
        print("\n" + table(head, rows) + "\n")


def tick_labels(xs: list, under: dict, xlim: tuple, fontsize: float, axis_in: float) -> list[str]:
    """Each log-axis tick's label: its value, then its note (under[x]) below. Line by line, each
    line takes the first row, at or below the one above it in its label, where it meets no line
    already placed (its width measured in the font, in decades of the axis): close points (5k
    `minilm` 0.0009 beside 5k `medium` 0.003; 20k `minilm` 0.0037 beside that 0.003) would
    otherwise write over each other."""
    from matplotlib.textpath import TextPath

    decades_per_in = math.log10(xlim[1] / xlim[0]) / axis_in
    placed, labels = [], []  # placed: (row, lo, hi) of every line so far, in decades
    for x in xs:
        rows, row = [], 0
        for line in [f"{x:.3g}"] + ([under[x]] if x in under else []):
            half = TextPath((0, 0), line, size=fontsize).get_extents().width / 72 * decades_per_in / 2 + 0.02
            lo, hi = math.log10(x) - half, math.log10(x) + half
            while any(r == row and lo < h and l < hi for r, l, h in placed):
                row += 1
            placed.append((row, lo, hi))
            rows.append((row, line))
            row += 1
        lines = [""] * (rows[-1][0] + 1)  # blank lines keep each line on its row
        for r, line in rows:
            lines[r] = line
        labels.append("\n".join(lines))
    return labels


def draw(setting: dict, gaps: dict, path: Path, notes: dict | None = None) -> None:
    """The gaps against each point's facts per transformer parameter, a panel a metric, a line a
    transformer (and number of times a fact is stated): a line joining different transformers
    would draw a trend across sizes that no run measured. notes[(world, size)], where given, is
    written under the point's tick (--best-recipe: the transformer and the picks' table lr).
    Text stays text in the SVG (svg.fonttype none): searchable, and small."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    plt.rcParams["svg.hashsalt"] = "eae"  # fixed element ids and (savefig below) no date: a rerun rewrites the same file

    gaps = {(w, z, k): g for (w, z, k), g in gaps.items() if (w, z) in setting}
    lines = {}  # (metric, transformer, times a fact is stated): its points, (ratio, gap, half-width)
    for (w, z, k), g in gaps.items():
        lines.setdefault((k, z, w[1]), []).append((setting[(w, z)]["ratio"], *g))
    metrics = [k for k in ("qa_em", "recall_stated", "masked_entity") if any(kk == k for (kk, _, _) in lines)]
    if not metrics:  # stores of one model only, say: nothing to draw, and no empty file
        print(f"figure: not drawn, no EaE − No-EaE gap in these stores ({path})")
        return
    fig, axes = plt.subplots(len(metrics), 1, sharex=True, figsize=(6.4, 1.2 + 2.0 * len(metrics)), squeeze=False)
    renderings = sorted({r for (_, _, r) in lines})
    ratio = {}  # a transformer's smallest facts per parameter: the legend's order
    for (_, z, _), points in lines.items():
        ratio[z] = min(ratio.get(z, math.inf), *(p[0] for p in points))
    sizes = sorted(ratio, key=ratio.get)
    style = {z: (f"C{i}", "os^Dv"[i % 5]) for i, z in enumerate(sizes)}  # one colour and marker a transformer in every panel
    drawn = 0
    for ax, k in zip(axes[:, 0], metrics):
        for z in sizes:
            for r in renderings:
                points = sorted(lines.get((k, z, r), []))
                if not points:
                    continue
                drawn += len(points)
                color, marker = style[z]
                ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[0 if math.isnan(p[2]) else p[2] for p in points],
                            color=color, marker=marker, capsize=4, linestyle="-" if r == 1 else "--",
                            fillstyle="full" if r == 1 else "none",
                            label=z + (f" (facts stated {r}x)" if len(renderings) > 1 else ""))
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(METRICS[k][2], fontsize=9, loc="left")
        ax.set_ylabel("points", fontsize=8)
    legend = {}  # every panel's lines, once a label: a panel may lack a line another has
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    axes[0, 0].legend(legend.values(), legend.keys(), fontsize=8)
    ax = axes[-1, 0]
    ax.set_xscale("log")
    xs = sorted({s["ratio"] for s in setting.values()})
    under = {setting[p]["ratio"]: n for p, n in (notes or {}).items() if p in setting}
    labels = tick_labels(xs, under, ax.get_xlim(), fontsize=8 if under else 10,
                         axis_in=fig.get_figwidth() * ax.get_position().width)
    ax.set_xticks(xs, labels, fontsize=8 if under else None)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("facts stated in pretraining text per transformer parameter")
    fig.suptitle("EaE − No-EaE, paired by seed (95% interval)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    print(f"figure: {path} ({drawn} points)")


def main() -> None:
    parser = argparse.ArgumentParser(description="docs/results.md's tables from MLflow stores")
    parser.add_argument("stores", nargs="+", type=Path, help="regime: collect.sh archives (.tar.xz) or directories "
                        "of cell stores; reproduction: mlflow.db [wiki mlflow.db]")
    parser.add_argument("--figure", type=Path, help="regime: write the gap-vs-regime figure here (.svg or .png); with --best-recipe, of the gaps at the picks")
    parser.add_argument("--answer-frequency", action="append", default=[], metavar="WORLD=DATA_DIR",
                        help="regime: QA EM by answer frequency for WORLD (e.g. 5000r4) from its `eae data build` "
                        "directory (experiments/regime/data.sh rebuilds it: the worlds are seeded), repeatable")
    parser.add_argument("--versus", nargs="+", type=Path, default=[], metavar="STORE",
                        help="regime: also print each model − the same model and seed in these stores "
                        "(the same cells trained at another recipe; with --dev-curve, and − No-EaE there, step by step)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="SEED",
                        help="regime: only these seeds' cells, in every store (--versus's too): a recipe trained on "
                        "fewer seeds than an earlier store's, paired with that store's other models on its seeds")
    parser.add_argument("--dev-curve", action="store_true",
                        help="regime: only print each pretraining run's dev evaluations by step (finished or paused), "
                        "each model's mean over seeds and EaE − No-EaE paired by seed, per recipe")
    parser.add_argument("--best-recipe", action="store_true",
                        help="regime: only pick each model's best recipe (pretraining lr, steps, warmup; QA lr, steps) "
                        "on QA dev EM among the stores' cells, and compare EaE and No-EaE at their picks on test")
    args = parser.parse_args()
    missing = [str(p) for p in args.stores + args.versus if not p.exists()]
    if missing:
        parser.error(f"no such store: {', '.join(missing)}")
    if unread := [str(p) for p in args.stores + args.versus
                  if p.is_file() and p.suffix != ".db" and not tarfile.is_tarfile(p)]:
        parser.error(f"not an archive of cell stores (experiments/regime/collect.sh writes one): {', '.join(unread)}")
    if any("=" not in a for a in args.answer_frequency):
        parser.error("--answer-frequency takes WORLD=DATA_DIR, e.g. 5000r4=runs/regime/data/w5000r4")
    data_dirs = {w: Path(d) for w, d in (a.split("=", 1) for a in args.answer_frequency)}
    if data_dirs:  # checked before the tables print, not after
        from eae_data.shards import shard_files

        if empty := [f"{w}={d}" for w, d in data_dirs.items() if not shard_files(d, "train")]:
            parser.error(f"--answer-frequency: no train shards under {', '.join(empty)} (give a world's `eae data build` "
                         "directory: STUDY=runs/regime WORLDS=<world> experiments/regime/data.sh rebuilds it)")
    if all(p.suffix == ".db" for p in args.stores):
        from mlflow.tracking import MlflowClient

        synth = MlflowClient(f"sqlite:///{args.stores[0]}")
        synthetic(synth)
        analysis(synth)
        if len(args.stores) > 1:
            print("## Wikipedia sample\n")
            synthetic(MlflowClient(f"sqlite:///{args.stores[1]}"), prefix="wiki-")
        return
    if args.seeds and (args.dev_curve or args.best_recipe):
        parser.error("--seeds: only for the one-recipe tables (not with --dev-curve or --best-recipe)")
    if args.dev_curve:
        print_dev_curves(args.stores, args.versus)
        return
    if args.best_recipe:
        ranked, setting = best_recipes(read_recipes(args.stores))
        if not ranked:
            parser.error("--best-recipe: no cell in these stores has a QA run with a dev EM")
        gaps, notes = print_best_recipes(ranked, setting)
        if args.figure:
            draw(setting, gaps, args.figure, notes)
        return
    seeds = set(args.seeds) if args.seeds else None
    cells, mixed = merge_one_recipe(args.stores, seeds)
    other, mixed_other = merge_one_recipe(args.versus, seeds)
    if mixed or mixed_other:
        parser.error("these stores hold a model pretrained at more than one recipe, which one table would mix "
                     "(pass one recipe's stores; compare recipes with --versus or --best-recipe; keep the seeds "
                     "the later store trained with --seeds):\n  "
                     + "\n  ".join(mixed + [f"(--versus) {m}" for m in mixed_other]))
    note_unfinished(cells)
    groups = print_tables(cells, args.figure)
    versus_label = " ".join(p.name for p in args.versus)
    if args.versus:
        print_versus(groups, summarize(other)[0], versus_label)
    print_real_text(cells, other, versus_label)
    print_answer_frequency(cells, data_dirs)


if __name__ == "__main__":
    # `| head` ends the tables quietly, as a shell tool stops, not in a BrokenPipeError traceback
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
