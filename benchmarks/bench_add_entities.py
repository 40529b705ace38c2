"""How good are entities added without retraining (POST /v1/entities, `eae entities add`)?

On a synthetic world (`eae data synth` + `eae data build`), a tiny EaE is trained in-process
with a share of the entities held out: their mentions are unlinked in training, and the
served table never has their rows (the evaluation model keeps only the seen entities). Then
each held-out entity is added from K example contexts of the train split (the engine's
add_entities: the mean direction of its mentions' EntityPred queries h', with norm
new_entity_norm x the table's mean row norm), and dev+test mentions are linked with their
gold spans:

  seen entities, trained rows          accuracy@1/@5 before any addition: the reference
  held-out entities, added from K      accuracy@1/@5 for K = 1, 2, 4 (and the memory's h)
  seen entities after the additions    their accuracy@1 now, and the share an added entity took
  new_entity_norm 0.6 ... 1.0          the trade-off between the two (K = 4)

    .venv/bin/python benchmarks/bench_add_entities.py [--entities 2000] [--train-steps 1400]

The world and shards are cached in --work (default runs/bench-add-entities); the model is
trained each run (seeded; ~140 s on an idle 2-core machine), or reused with --reuse-model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["context_id", "text", "token_ids", "token_starts", "token_ends", "mention_starts", "mention_ends",
           "mention_entity_ids"]


def build_data(work: Path, entities: int, seed: int) -> Path:
    from eae_data.synth import write_world

    data = work / "data"
    if (data / "manifest.json").is_file():
        return data
    write_world(work / "world", entities, seed)
    from eae_platform.preprocess.build import BuildSettings, build
    from eae_platform.ray_session import connect

    ray = connect(num_cpus=2)
    try:
        build(BuildSettings(dumps=[str(work / "world" / "world.xml")], out=str(data), entities=entities,
                            dev_fraction=0.1, test_fraction=0.1, shard_rows=500, ner="none"))
    finally:
        ray.shutdown()
    return data


def read_split(data: Path, split: str) -> dict[str, list]:
    files = sorted((data / "shards" / split).glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(f, columns=COLUMNS) for f in files]).to_pydict()


def train(rows: dict, held_out: set[int], num_entities: int, steps: int, seed: int):
    """The tiny preset, Adam 1e-3, batch 32; mentions of held-out entities unlinked."""
    from eae_model.config import load_config
    from eae_model.model import EaEModel
    from eae_platform.pretrain.data import collate

    torch.manual_seed(seed)
    model = EaEModel(load_config("tiny", overrides=[f"num_entities={num_entities}", "max_length=128"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    entity_ids = [np.array([-1 if e in held_out else e for e in es], np.int64) for es in rows["mention_entity_ids"]]
    columns = {"context_id": np.array(rows["context_id"], np.int64), "token_ids": rows["token_ids"],
               "mention_starts": rows["mention_starts"], "mention_ends": rows["mention_ends"],
               "mention_entity_ids": entity_ids}
    rng = np.random.default_rng(seed)
    step, t0, window = 0, time.monotonic(), []
    model.train()
    while step < steps:
        pick = rng.choice(len(columns["context_id"]), 32, replace=False)
        batch = collate({k: (v[pick] if isinstance(v, np.ndarray) else [v[i] for i in pick]) for k, v in columns.items()},
                        seed, step, 0.2, num_entities)
        out = model(batch.input_ids, batch.attention_mask, mentions=batch.mentions, mlm_labels=batch.mlm_labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window.append({k: float(v.detach()) for k, v in out.losses.items()})
        step += 1
        if step % 100 == 0:
            mean = {k: round(float(np.mean([w[k] for w in window])), 3) for k in window[0]}
            print(f"  step {step} ({time.monotonic() - t0:.0f} s): {mean}", flush=True)
            window = []
    return model.eval(), step


def save_seen_model(model, seen: list[int], titles: list[str], out: Path) -> Path:
    """The model with only the seen entities' rows (ids renumbered 0..len(seen)-1)."""
    from eae_model.checkpoint import save_model
    from eae_model.config import EaEConfig
    from eae_model.model import EaEModel

    config = EaEConfig.from_dict({**model.config.to_dict(), "num_entities": len(seen)})
    served = EaEModel(config)
    state = model.state_dict()
    state["entity_table.weight"] = state["entity_table.weight"][seen]
    served.load_state_dict(state)
    save_model(served, out)
    pq.write_table(pa.table({"entity_id": pa.array(range(len(seen)), pa.int32()),
                             "title": [titles[e] for e in seen]}), out / "entities.parquet")
    return out


def char_spans(rows: dict, i: int) -> list[tuple[int, int, int]]:
    """(start, end, entity id) of row i's linked mentions, in characters of its text."""
    starts, ends = rows["token_starts"][i], rows["token_ends"][i]
    return [(starts[s], ends[t], e) for s, t, e in zip(rows["mention_starts"][i], rows["mention_ends"][i],
                                                       rows["mention_entity_ids"][i]) if e >= 0]


def evaluate(engine, rows: dict, gold_of, batch: int = 32) -> list[tuple[int, list[int]]]:
    """[(gold served id, top-5 served ids)] for every linked mention whose entity gold_of maps."""
    jobs, golds = [], []
    for i in range(len(rows["text"])):
        spans = char_spans(rows, i)
        if spans:
            jobs.append(engine.prepare(engine.link_job(rows["text"][i], [[s, e - s] for s, e, _ in spans], 5)))
            golds.append([gold_of(e) for _, _, e in spans])
    out = []
    for n in range(0, len(jobs), batch):
        for result, gold in zip(engine.run(jobs[n:n + batch]), golds[n:n + batch]):
            for m, g in zip(result["mentions"], gold):
                if g is not None:
                    out.append((g, [c["entity_id"] for c in m["candidates"]]))
    return out


def accuracy(pairs, which=lambda g: True) -> tuple[float, float, int]:
    chosen = [(g, top) for g, top in pairs if which(g)]
    if not chosen:
        return float("nan"), float("nan"), 0
    return (float(np.mean([top[0] == g for g, top in chosen])), float(np.mean([g in top for g, top in chosen])),
            len(chosen))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entities", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=1400)
    p.add_argument("--holdout", type=float, default=0.2, help="share of entities held out of training")
    p.add_argument("--contexts", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--norms", type=float, nargs="+", default=[0.6, 0.7, 0.8, 0.9, 1.0])
    p.add_argument("--work", default=str(REPO / "runs" / "bench-add-entities"))
    p.add_argument("--reuse-model", action="store_true", help="evaluate the model the last run trained")
    args = p.parse_args()

    from eae_platform.serving.engine import Engine, EngineConfig
    from eae_platform.serving.model_source import resolve

    # One thread: ops this small gain nothing from two, and on a busy 2-core machine intra-op
    # threads can make training many times slower.
    torch.set_num_threads(1)
    work = Path(args.work)
    data = build_data(work, args.entities, args.seed)
    vocab = pq.read_table(data / "entities.parquet").sort_by("entity_id")
    titles = vocab.column("title").to_pylist()
    n = len(titles)
    train_rows, eval_rows = read_split(data, "train"), read_split(data, "dev")
    test_rows = read_split(data, "test")
    eval_rows = {k: eval_rows[k] + test_rows[k] for k in eval_rows}

    # Held out: entities with enough train contexts to give max(K) examples and some eval mentions.
    contexts_of: dict[int, list[int]] = {}
    for i in range(len(train_rows["text"])):
        for e in {e for _, _, e in char_spans(train_rows, i)}:
            contexts_of.setdefault(e, []).append(i)
    in_eval = {e for i in range(len(eval_rows["text"])) for _, _, e in char_spans(eval_rows, i)}
    eligible = sorted(e for e, c in contexts_of.items() if len(c) >= max(args.contexts) and e in in_eval)
    rng = np.random.default_rng(args.seed)
    held_out = set(rng.choice(eligible, min(int(args.holdout * n), len(eligible)), replace=False).tolist())
    seen = [e for e in range(n) if e not in held_out]
    print(f"{n} entities, {len(train_rows['text'])} train and {len(eval_rows['text'])} dev+test contexts; "
          f"{len(held_out)} held out of training ({len(eligible)} eligible)", flush=True)

    served_dir = work / "served-model"
    if args.reuse_model and (served_dir / "train.json").is_file():
        trained = json.loads((served_dir / "train.json").read_text())
        if trained["held_out"] != sorted(held_out):
            raise SystemExit(f"{served_dir} was trained with other held-out entities: run without --reuse-model")
        steps = trained["steps"]
    else:
        print(f"training the tiny preset for {args.train_steps} steps (1 thread) ...", flush=True)
        model, steps = train(train_rows, held_out, n, args.train_steps, args.seed)
        save_seen_model(model, seen, titles, served_dir)
        (served_dir / "train.json").write_text(json.dumps({"steps": steps, "held_out": sorted(held_out)}))
    served_id = {e: i for i, e in enumerate(seen)}

    def fresh(source: str = "entity_pred", norm: float = 0.8) -> Engine:
        return Engine(resolve(str(served_dir)), EngineConfig(embed_source=source, new_entity_norm=norm, retrieve_k=20))

    engine = fresh()
    base = evaluate(engine, eval_rows, served_id.get)
    s1, s5, s_n = accuracy(base)
    print(f"\nafter {steps} steps; linking dev+test mentions with gold spans, {len(seen)} entities served:")
    print(f"  seen entities (trained rows):             acc@1 {s1:.3f}  acc@5 {s5:.3f}  ({s_n} mentions)")
    results = {"steps": steps, "seen": {"acc1": s1, "acc5": s5, "mentions": s_n}, "added": []}

    examples = {e: [contexts_of[e][j] for j in rng.permutation(len(contexts_of[e]))] for e in held_out}
    setups = [("entity_pred", k, 0.8) for k in args.contexts] + [("memory", max(args.contexts), 0.8)]
    setups += [("entity_pred", max(args.contexts), a) for a in args.norms if a != 0.8]
    for source, k, norm in setups:
        engine = fresh(source, norm)
        new = []
        for e in sorted(held_out):
            ctx = [{"text": train_rows["text"][i],
                    "spans": [[s, t - s] for s, t, x in char_spans(train_rows, i) if x == e]}
                   for i in examples[e][:k]]
            new.append({"title": titles[e], "contexts": ctx})
        t0 = time.perf_counter()
        added = engine.add_entities(new, save=False)
        add_s = time.perf_counter() - t0
        ids = dict(zip(sorted(held_out), (a["entity_id"] for a in added)))
        gold = {**served_id, **ids}
        pairs = evaluate(engine, eval_rows, gold.get)
        h1, h5, h_n = accuracy(pairs, lambda g: g >= len(seen))
        a1, a5, a_n = accuracy(pairs, lambda g: g < len(seen))
        taken = float(np.mean([top[0] >= len(seen) for g, top in pairs if g < len(seen)]))
        overall = (h1 * h_n + a1 * a_n) / (h_n + a_n)
        print(f"  added from K={k} ({source}, norm {norm}): held-out acc@1 {h1:.3f} acc@5 {h5:.3f} ({h_n} mentions); "
              f"seen acc@1 {a1:.3f} ({taken:.1%} taken by added); all acc@1 {overall:.3f}; "
              f"{len(new)} added in {add_s:.2f} s", flush=True)
        results["added"].append({"source": source, "k": k, "norm": norm, "acc1": h1, "acc5": h5, "mentions": h_n,
                                 "seen_acc1_after": a1, "seen_taken": taken, "all_acc1": overall, "add_seconds": add_s})
    before = s1 * s_n / (s_n + h_n)
    print(f"  all dev+test mentions before adding (held-out ones unlinkable): acc@1 {before:.3f}")
    chance = 1 / (len(seen) + len(held_out))
    print(f"  (chance acc@1: {chance:.4f}; held-out entities not added are unlinkable: acc 0)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
