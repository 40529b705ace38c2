"""QA analysis (paper Figure 3 and Table 8) from the predictions QA runs log
(`predictions/<split>.jsonl`, one row per question: id, question, answer_id, prediction_id,
correct).

    analysis   accuracy by (a) the answer entity's frequency in the pretraining data (linked
               mentions of the train shards), (b) the number of entity mentions in the question
               (alias-table matches over the entity vocabulary), (c) the question's length in
               words; 95% bootstrap intervals; one PNG per view, one line per run
    overlap    of two runs: prediction overlap (same predicted entity), oracle accuracy (either
               is right), both and each run's EM
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections import Counter
from pathlib import Path

FREQUENCY_BINS = [(0, 0), (1, 2), (3, 9), (10, 29), (30, 99), (100, 999), (1000, math.inf)]
MENTION_BINS = [(0, 0), (1, 1), (2, 2), (3, math.inf)]
LENGTH_BINS = [(1, 5), (6, 8), (9, 11), (12, 15), (16, math.inf)]


def bin_label(lo: float, hi: float) -> str:
    if lo == hi:
        return str(int(lo))
    return f"{int(lo)}-inf" if math.isinf(hi) else f"{int(lo)}-{int(hi)}"


def bucket(value: float, bins) -> str | None:
    for lo, hi in bins:
        if lo <= value <= hi:
            return bin_label(lo, hi)
    return None


def bootstrap_interval(flags: list[bool], resamples: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of 0/1 flags."""
    rng = random.Random(seed)
    n = len(flags)
    means = sorted(sum(flags[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * (resamples - 1))], means[int(math.ceil(0.975 * (resamples - 1)))]


def entity_frequencies(data_dir: str | Path) -> Counter:
    """Linked mentions per entity id in the train shards of an `eae data build` directory."""
    import pyarrow.parquet as pq

    from eae_data.shards import shard_files

    files = shard_files(data_dir, "train")
    if not files:
        raise FileNotFoundError(f"no train shards under {data_dir}/shards/train: give the pretraining data")
    counts: Counter = Counter()
    for f in files:
        for ids in pq.read_table(f, columns=["mention_entity_ids"]).column(0).to_pylist():
            counts.update(i for i in ids if i >= 0)
    return counts


def views(rows: list[dict], frequencies: Counter, matcher) -> dict[str, list[tuple[str | None, bool]]]:
    """(bucket, correct) per question for each view."""
    out = {"answer_frequency": [], "question_mentions": [], "question_length": []}
    for r in rows:
        correct = bool(r["correct"])
        freq = frequencies.get(r["answer_id"], 0) if r.get("answer_id") is not None else None
        out["answer_frequency"].append((None if freq is None else bucket(freq, FREQUENCY_BINS), correct))
        out["question_mentions"].append((bucket(len(matcher.find(r["question"], [])), MENTION_BINS), correct))
        out["question_length"].append((bucket(len(r["question"].split()), LENGTH_BINS), correct))
    return out


BINS = {"answer_frequency": FREQUENCY_BINS, "question_mentions": MENTION_BINS, "question_length": LENGTH_BINS}
XLABEL = {"answer_frequency": "answer entity's linked mentions in the pretraining data",
          "question_mentions": "entity mentions in the question", "question_length": "question length (words)"}


def accuracy_table(pairs: list[tuple[str | None, bool]], bins, resamples: int) -> list[dict]:
    """Per bucket (in bin order, empty ones left out): n, accuracy, 95% bootstrap interval.
    Questions without a bucket (unresolved answers for frequency) are left out."""
    table = []
    for lo, hi in bins:
        label = bin_label(lo, hi)
        flags = [c for b, c in pairs if b == label]
        if flags:
            low, high = bootstrap_interval(flags, resamples)
            table.append({"bucket": label, "n": len(flags), "accuracy": sum(flags) / len(flags), "low": low, "high": high})
    return table


def plot(view: str, tables: dict[str, list[dict]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = [bin_label(lo, hi) for lo, hi in BINS[view]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for i, (run, table) in enumerate(tables.items()):
        xs = [labels.index(t["bucket"]) + (i - (len(tables) - 1) / 2) * 0.08 for t in table]
        ys = [100 * t["accuracy"] for t in table]
        err = [[100 * (t["accuracy"] - t["low"]) for t in table], [100 * (t["high"] - t["accuracy"]) for t in table]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=run)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(XLABEL[view])
    ax.set_ylabel("exact match (%)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def load_predictions(run_names: list[str], split: str, uri: str) -> dict[str, list[dict]]:
    """{run name: prediction rows} from each QA run's `predictions/<split>.jsonl` artifact."""
    import mlflow

    from eae_platform.finetune.compare import find_runs

    out = {}
    for info in find_runs(run_names, uri):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = mlflow.artifacts.download_artifacts(run_id=info.run_id, artifact_path=f"predictions/{split}.jsonl",
                                                            dst_path=tmp, tracking_uri=uri)
            except Exception as error:  # MLflow raises several types for a missing artifact
                raise LookupError(f"run {info.name} ({info.run_id}) has no predictions/{split}.jsonl artifact: "
                                  f"is it a QA run (eae finetune qa)? ({error})") from None
            out[info.name] = [json.loads(line) for line in Path(local).read_text().splitlines() if line.strip()]
    return out


def run_names(config) -> list[str]:
    """eval.runs as a list: analysis one or more, overlap exactly two."""
    count = 2 if config.task == "overlap" else None
    names = [r.strip() for r in config.runs.split(",") if r.strip()]
    if not names or (count is not None and len(names) != count):
        raise ValueError(f"eval.runs needs {'exactly ' + str(count) if count else 'one or more'} QA run(s) "
                         f"(ids or names, comma-separated), got {config.runs!r}")
    return names


def run(config) -> dict:
    """`eae eval analysis --runs QA_RUN[,QA_RUN...] --data PRETRAIN_DATA`."""
    from eae_data.aliases import AliasMatcher
    from eae_data.qa.resolve import AnswerResolver
    from eae_platform.evaluate.common import tracker
    from eae_platform.tracking import artifact_location

    predictions = load_predictions(run_names(config), config.split, config.mlflow_uri)
    if not config.data:
        raise ValueError("eval.data must be the pretraining data (an `eae data build` directory): answer frequencies")
    frequencies = entity_frequencies(config.data)
    matcher = AliasMatcher(AnswerResolver.from_dir(config.data).names())
    tables = {view: {} for view in BINS}
    for name, rows in predictions.items():
        for view, pairs in views(rows, frequencies, matcher).items():
            tables[view][name] = accuracy_table(pairs, BINS[view], config.bootstrap)
    metrics = {}
    for view, per_run in tables.items():
        for name, table in per_run.items():
            for t in table:
                key = f"analysis/{name}/{view}/{t['bucket']}"
                metrics.update({f"{key}/accuracy": t["accuracy"], f"{key}/n": t["n"], f"{key}/low": t["low"],
                                f"{key}/high": t["high"]})
    with tracker(config) as t, tempfile.TemporaryDirectory() as tmp:
        t.log_metrics(metrics, step=0)
        for view, per_run in tables.items():
            t.log_artifacts(plot(view, per_run, Path(tmp) / f"{view}.png"), "plots")
        (Path(tmp) / "analysis.json").write_text(json.dumps(tables, indent=2))
        t.log_artifacts(Path(tmp) / "analysis.json", "plots")
        run_id = t.run_id
        plots = artifact_location(t.artifact_uri, "plots") if t.artifact_uri else None
    return {"metrics": metrics, "tables": tables, "run_id": run_id, "plots": plots,
            "plot_files": [f"{view}.png" for view in tables] + ["analysis.json"]}


def overlap(a: list[dict], b: list[dict]) -> dict[str, float]:
    """Table 8 over the questions both runs answered (joined on id)."""
    by_id = {r["id"]: r for r in b}
    pairs = [(r, by_id[r["id"]]) for r in a if r["id"] in by_id]
    if not pairs:
        raise ValueError("the two runs share no question id: were they evaluated on the same dataset and split?")
    n = len(pairs)
    return {
        "overlap/questions": n,
        "overlap/prediction_overlap": sum(x["prediction_id"] == y["prediction_id"] for x, y in pairs) / n,
        "overlap/oracle_accuracy": sum(bool(x["correct"]) or bool(y["correct"]) for x, y in pairs) / n,
        "overlap/both_correct": sum(bool(x["correct"]) and bool(y["correct"]) for x, y in pairs) / n,
        "overlap/a_em": sum(bool(x["correct"]) for x, _ in pairs) / n,
        "overlap/b_em": sum(bool(y["correct"]) for _, y in pairs) / n,
        "overlap/only_in_a": len(a) - n,
        "overlap/only_in_b": len(b) - n,
    }


def run_overlap(config) -> dict:
    """`eae eval overlap --runs A,B`."""
    from eae_platform.evaluate.common import tracker

    names = run_names(config)
    predictions = load_predictions(names, config.split, config.mlflow_uri)
    if len(predictions) != 2:
        raise ValueError(f"eval.runs names the same run twice: {config.runs!r}")
    (name_a, a), (name_b, b) = predictions.items()
    metrics = overlap(a, b)
    with tracker(config, {"eae.runs": f"{name_a},{name_b}"}) as t:
        t.log_metrics(metrics, step=0)
        run_id = t.run_id
    return {"metrics": metrics, "runs": [name_a, name_b], "run_id": run_id}
