"""Markdown tables of the reproduction's MLflow runs (experiments/reproduce.sh), as pasted into
docs/results.md: every number comes from the runs, none is typed by hand.

    .venv/bin/python experiments/results_tables.py runs/reproduce/mlflow.db [runs/reproduce-wiki/mlflow.db]
"""

from __future__ import annotations

import sys

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
        # `eae pretrain` logs dev_entity_acc, dev_token_acc, dev_ppl (the names eae compare reads,
        # dev/entity_accuracy, ..., are taken when present)
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


if __name__ == "__main__":
    synth = MlflowClient(f"sqlite:///{sys.argv[1]}")
    synthetic(synth)
    analysis(synth)
    if len(sys.argv) > 2:
        print("## Wikipedia sample\n")
        synthetic(MlflowClient(f"sqlite:///{sys.argv[2]}"), prefix="wiki-")
