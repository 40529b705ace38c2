"""The main job's closing report (scripts/main): what was trained and in how long, the model's
entity linking on the dev split beside a most-frequent-entity baseline, one dev sentence linked
by the model, and where the model, checkpoints and MLflow run are.

    python -m eae_platform.main_report --model DIR --data DIR --checkpoints DIR --mlflow-uri URI --seconds S

Linking accuracy: for every linked mention of the dev articles (entity in the model's
vocabulary), the model gets the mention's span (as `eae serve` does for given spans) and its
top-1 entity is compared with the Wikipedia link's. The baseline answers the training split's
most frequent entity for every mention.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from eae_data.shards import shard_files

COLUMNS = ["text", "token_starts", "token_ends", "mention_starts", "mention_ends", "mention_entity_ids"]


def linked_mentions(data: str, split: str, num_entities: int) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """Per context of `split`: its text and linked mentions as (char start, char end, entity id)."""
    out = []
    for f in shard_files(data, split):
        for r in pq.read_table(f, columns=COLUMNS).to_pylist():
            spans = [(r["token_starts"][s], r["token_ends"][e], i)  # mention_ends: the last wordpiece
                     for s, e, i in zip(r["mention_starts"], r["mention_ends"], r["mention_entity_ids"])
                     if 0 <= i < num_entities]
            if spans:
                out.append((r["text"], spans))
    return out


def evaluate_linking(engine, contexts, most_frequent: int) -> dict:
    """Top-1 linking accuracy of the model and of the baseline, and the context the model linked
    best (its text and mentions with predicted and gold ids)."""
    correct = baseline = total = 0
    best = None
    for text, spans in contexts:
        found = engine.link(text, spans=[[s, e - s] for s, e, _ in spans], top_k=1)["mentions"]
        gold = {(s, e): i for s, e, i in spans}
        rows = [(m["start"], m["end"], m["entity_id"], gold[m["start"], m["end"]]) for m in found]
        correct, total = correct + sum(p == g for *_, p, g in rows), total + len(rows)
        baseline += sum(g == most_frequent for *_, g in rows)
        for s, e, p, g in rows:  # the sentence around a mention; the one with most correct links
            left, right = text.rfind(". ", 0, s) + 1, text.find(". ", e)
            right = len(text) if right < 0 else right + 1
            mine = [(text[s1:e1], p1, g1) for s1, e1, p1, g1 in rows if left <= s1 and e1 <= right]
            hits = sum(p1 == g1 for _, p1, g1 in mine)
            if best is None or hits > best[0]:
                best = (hits, text[left:right].strip(), mine)
    return {"accuracy": correct / max(total, 1), "baseline": baseline / max(total, 1), "mentions": total,
            "correct": correct, "example": best}


def final_metrics(uri: str, run_name: str) -> dict:
    """The dev metrics the pretraining logged last (its newest MLflow run of this name)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"attributes.run_name = '{run_name}'", order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return {}
    return {"run_id": runs[0].info.run_id, **{k: v for k, v in runs[0].data.metrics.items() if k.startswith("dev")}}


def main(argv: list[str] | None = None) -> int:
    from eae_platform.serving.engine import Engine
    from eae_platform.serving.model_source import resolve

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--checkpoints", required=True)
    p.add_argument("--mlflow-uri", required=True)
    p.add_argument("--seconds", type=float, required=True)
    args = p.parse_args(argv)

    config = json.loads((Path(args.model) / "config.json").read_text())
    manifest = json.loads((Path(args.data) / "manifest.json").read_text())
    states = sorted(Path(args.checkpoints).glob("checkpoint_*/state.json"))
    state = json.loads(states[-1].read_text()) if states else {}
    train = state.get("config", {}).get("train", {})
    n = config["num_entities"]
    counts = Counter(i for _, spans in linked_mentions(args.data, "train", n) for _, _, i in spans)
    most_frequent = counts.most_common(1)[0][0]
    engine = Engine(resolve(args.model))
    result = evaluate_linking(engine, linked_mentions(args.data, "dev", n), most_frequent)
    logged = final_metrics(args.mlflow_uri, train.get("name", ""))
    better = result["accuracy"] > result["baseline"]

    c = manifest["counts"]
    print(f"\n=== main job: {args.seconds / 60:.1f} minutes ===")
    print(f"trained: EaE preset {config.get('preset')} ({config['hidden_size']} wide, {n:,} entities) for "
          f"{state.get('step')} steps of {train.get('batch_size')} contexts on {train.get('num_workers')} Ray Train "
          f"workers, from {c['contexts_per_split']['train']:,} training contexts of gensim's Wikipedia sample "
          f"({c['articles']} articles) read with Ray Data")
    print(f"dev entity linking (given mention spans, top-1), {result['mentions']} mentions: model "
          f"{100 * result['accuracy']:.1f}% ({result['correct']}), most-frequent-entity baseline "
          f"{100 * result['baseline']:.1f}% ('{engine.titles[most_frequent]}', {counts[most_frequent]} training links)")
    if logged:
        print("dev masked-mention metrics logged by the pretraining: "
              + ", ".join(f"{k} {v:.4g}" for k, v in logged.items() if k != "run_id"))
    print((f"the model links {result['correct']} of {result['mentions']} dev mentions right, more than the baseline: "
           "better, though far from good" if better else
           "the model does NOT link better than the baseline in this run: too few steps for this vocabulary")
          + "; predicting a masked mention's entity from its context alone (dev/entity_accuracy) needs far "
          "more training than a few minutes on 2 cores")
    _, text, rows = result["example"]
    print(f"a dev sentence, linked by the model: {text!r}")
    for mention, predicted, gold in rows:
        mark = "ok " if predicted == gold else "no "
        print(f"  {mark} {mention!r} -> {engine.titles[predicted]!r}" + ("" if predicted == gold else
              f" (Wikipedia links {engine.titles[gold]!r})"))
    print(f"model:       {args.model}")
    print(f"checkpoints: {args.checkpoints}")
    if logged:
        print(f"MLflow run:  {logged['run_id']} in {args.mlflow_uri}; open the UI with "
              f".venv/bin/mlflow ui --backend-store-uri {args.mlflow_uri} --host 127.0.0.1 --port 5000")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
