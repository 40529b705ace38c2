"""Entity typing (paper appendix "Entity Typing"): the span's representation [x4_s ‖ x4_t]
projected to the types, sigmoid per type, binary cross-entropy with label smoothing 0.1;
micro-F1 on test with the decision threshold that maximises dev micro-F1. Entity embeddings
and mention detection are frozen (span_tasks.py).

Datasets (`eae eval typing --data ...`):

    synth:WORLD,DATA   linked mentions of DATA's shards, typed by the synthetic world
                       (type: person, city, ...; and kind: writer, capital, film, ...)
    wiki:DATA[,FILE]   linked mentions of DATA's shards (the Wikipedia sample) whose entity is a
                       WordNet instance, typed with the paper's general types (person, group,
                       organization, location, time, object, event, place) found among its
                       WordNet hypernyms; `entity`, true of everything, is left out
    openentity:DIR     Open Entity / Ultra-Fine Entity Typing files DIR/{train,dev,test}.json
                       (jsonl: left_context_token, mention_span, right_context_token, y_str),
                       or ERNIE's copy (a JSON list of {sent, start, end, labels}); limited to
                       the 9 general types as the paper does

Splits are the data's own. Each split keeps at most `max_examples` examples.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import torch

from eae_data.contexts import token_span
from eae_data.tokenizer import WordPieceTokenizer
from eae_platform.evaluate.span_tasks import SPLITS, Example, entity_titles, load_splits, read_shard_rows, wordnet_nouns

GENERAL_TYPES = ("person", "group", "organization", "location", "entity", "time", "object", "event", "place")


def _shard_examples(data_dir: str, types_of: dict[int, list[str]], skipped: Counter):
    """{split: [(ids, (s, t), labels)]} for linked mentions whose entity has types."""
    out = {}
    for split in SPLITS:
        examples = []
        for row in read_shard_rows(data_dir, split):
            for s, t, e in zip(row["mention_starts"], row["mention_ends"], row["mention_entity_ids"]):
                if e < 0:
                    continue
                if not types_of.get(e):
                    skipped["untyped_entity"] += 1
                    continue
                examples.append((row["token_ids"], (s, t), types_of[e]))
        out[split] = examples
    return out


def synth_types(world_dir: str | Path, data_dir: str | Path) -> dict[int, list[str]]:
    """Entity id (DATA's vocabulary) -> [type, kind] from the world's entities.jsonl."""
    path = Path(world_dir) / "entities.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: give a synthetic world (`eae data synth --out DIR`)")
    by_title = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        by_title[e["title"]] = [e["type"]] + ([e["kind"]] if e["kind"] and e["kind"] != e["type"] else [])
    return {i: by_title[t] for i, t in enumerate(entity_titles(data_dir)) if t in by_title}


def wordnet_general_types(path: str | Path) -> dict[str, list[str]]:
    """Name of a WordNet instance -> the general types among its hypernyms (instance
    hypernym, then hypernyms up to the root), `entity` left out."""
    lemmas, pointers = wordnet_nouns(path)
    general = set(GENERAL_TYPES) - {"entity"}
    ancestors_cache: dict[str, set[str]] = {}

    def ancestors(offset: str) -> set[str]:
        if offset not in ancestors_cache:
            ancestors_cache[offset] = set()  # cycles never recurse forever
            found = {w.lower() for w in lemmas.get(offset, [])} & general
            for symbol, target in pointers.get(offset, []):
                if symbol in ("@", "@i"):
                    found |= ancestors(target)
            ancestors_cache[offset] = found
        return ancestors_cache[offset]

    out = {}
    for offset, ptrs in pointers.items():
        if any(symbol == "@i" for symbol, _ in ptrs):
            types = sorted(ancestors(offset))
            if types:
                for name in lemmas[offset]:
                    out.setdefault(name, types)
    return out


def openentity_examples(directory: str | Path, tokenizer: WordPieceTokenizer, max_length: int, skipped: Counter):
    directory = Path(directory)
    out = {}
    for split in SPLITS:
        path = directory / f"{split}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: Open Entity needs train.json, dev.json and test.json")
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):  # ERNIE's copy: a JSON list
            records = [(r["sent"], r["start"], r["end"], r["labels"]) for r in json.loads(text)]
        else:
            records = []
            for line in text.splitlines():
                if not line.strip():
                    continue
                r = json.loads(line)
                left = " ".join(r.get("left_context_token", []))
                start = len(left) + (1 if left else 0)
                sentence = " ".join(x for x in (left, r["mention_span"], " ".join(r.get("right_context_token", []))) if x)
                records.append((sentence, start, start + len(r["mention_span"]), r.get("y_str", [])))
        examples = []
        for sentence, start, end, labels in records:
            labels = sorted({label for label in labels if label in GENERAL_TYPES})
            if not labels:
                skipped["no_general_type"] += 1
                continue
            enc = tokenizer.encode(sentence)
            ids, offsets = enc.ids, enc.offsets
            if len(ids) > max_length:
                ids, offsets = ids[: max_length - 1] + [tokenizer.sep_id], offsets[: max_length - 1] + [(0, 0)]
            span = token_span(offsets, list(itertools.accumulate((e for _, e in offsets), max)), start, end)
            if span is None:
                skipped["span_not_aligned_or_truncated"] += 1
                continue
            examples.append((ids, span, labels))
        out[split] = examples
    return out


def load_typing(spec: str, max_length: int, max_examples: int) -> tuple[dict, Counter]:
    def synth(args, skipped):
        return _shard_examples(args[1], synth_types(args[0], args[1]), skipped)

    def wiki(args, skipped):
        from eae_platform.evaluate.probes import WORDNET_NOUNS

        by_name = wordnet_general_types(args[1] if len(args) > 1 else WORDNET_NOUNS)
        types = {i: by_name[t] for i, t in enumerate(entity_titles(args[0])) if t in by_name}
        return _shard_examples(args[0], types, skipped)

    def openentity(args, skipped):
        return openentity_examples(args[0], WordPieceTokenizer(), max_length, skipped)

    sources = {"synth": (2, 2, synth), "wiki": (1, None, wiki), "openentity": (1, 1, openentity)}
    return load_splits("typing", spec, sources, "synth:WORLD,DATA, wiki:DATA[,WORDNET_FILE] or openentity:DIR",
                       max_examples)


def micro_f1(probs: torch.Tensor, gold: torch.Tensor, threshold: float) -> float:
    pred = probs >= threshold
    tp = float((pred & gold).sum())
    p, g = float(pred.sum()), float(gold.sum())
    return 2 * tp / (p + g) if p + g else 0.0


def run(config) -> dict:
    """`eae eval typing --model M --data SPEC`."""
    from eae_platform.evaluate.common import device, load, tracker
    from eae_platform.evaluate.span_tasks import PositionClassifier, predict, train

    dev = device()
    model, _ = load(config.model, config.mlflow_uri, dev)
    data, skipped = load_typing(config.data, model.config.max_length, config.max_examples)
    labels = sorted({t for _, _, types in data["train"] for t in types})
    index = {t: i for i, t in enumerate(labels)}
    examples = {}
    for split, rows in data.items():
        examples[split] = []
        for ids, (s, t), types in rows:
            known = [index[x] for x in types if x in index]
            if len(known) < len(types):
                skipped[f"{split}_unseen_type"] += len(types) - len(known)
            examples[split].append(Example(list(ids), [s, t], known))

    def gold(rows: list[Example]) -> torch.Tensor:
        g = torch.zeros(len(rows), len(labels), dtype=torch.bool)
        for i, e in enumerate(rows):
            g[i, e.target] = True
        return g

    def loss_fn(logits, targets):
        y = torch.zeros_like(logits)
        for i, t in enumerate(targets):
            y[i, t] = 1.0
        y = y * (1 - config.label_smoothing) + config.label_smoothing / 2
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y)

    classifier = PositionClassifier(model, 2, len(labels)).to(dev)
    with tracker(config, {"eae.model": config.model}, model.config) as t:
        train(classifier, examples["train"], loss_fn, config, dev, t.log_metrics)
        probs = {s: torch.sigmoid(predict(classifier, examples[s], dev)) for s in ("dev", "test")}
        thresholds = [round(0.05 * i, 2) for i in range(1, 20)]
        threshold = max(thresholds, key=lambda th: micro_f1(probs["dev"], gold(examples["dev"]), th))
        metrics = {"typing/threshold": threshold, "typing/types": len(labels),
                   "dev/micro_f1": micro_f1(probs["dev"], gold(examples["dev"]), threshold),
                   "test/micro_f1": micro_f1(probs["test"], gold(examples["test"]), threshold)}
        counts = {f"data/{s}_examples": len(v) for s, v in examples.items()}
        counts.update({f"skipped/{k}": v for k, v in sorted(skipped.items())})
        t.log_metrics({**metrics, **counts}, step=config.steps)
        run_id = t.run_id
    return {"metrics": metrics, "counts": counts, "skipped": dict(skipped), "labels": labels, "run_id": run_id}
