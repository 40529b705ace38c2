"""Relation extraction (paper Table 9), as the paper does it after Matching the Blanks:
marker tokens around the subject ([unused0] ... [unused1]) and the object ([unused2] ...
[unused3]), the representations at the two start markers concatenated and projected to the
relations (softmax, cross-entropy). Score: TACRED's micro F1 over the relations other than
`no_relation`.

Datasets (`eae eval relations --data ...`):

    synth:WORLD,DATA   distant supervision: ordered pairs of linked mentions in a context of
                       DATA's shards get the relation the synthetic world's facts give them,
                       else no_relation (sampled, as many as the related pairs)
    wiki:DATA          the same over the Wikipedia sample, with real relations that ship
                       offline: GeoNames (capital, city_country, continent), bsdgames' quiz
                       (capital, state_capital) and WordNet part holonyms (part_of)
    tacred:TRAIN,DEV,TEST   the official TACRED json files (token, subj_start, subj_end,
                       obj_start, obj_end, relation; inclusive token indices)
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import torch

from eae_data.tokenizer import WordPieceTokenizer
from eae_platform.evaluate.span_tasks import SPLITS, Example, entity_titles, load_splits, read_shard_rows

NO_RELATION = "no_relation"
MARKERS = ("[unused0]", "[unused1]", "[unused2]", "[unused3]")  # subject start/end, object start/end
PTB_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def mark(pieces: list[list[int]], subj: tuple[int, int], obj: tuple[int, int], markers: list[int],
         cls_id: int, sep_id: int) -> tuple[list[int], int, int]:
    """Units (each a list of wordpieces) with the subject's units subj[0]..subj[1] and the
    object's obj[0]..obj[1] (inclusive, not overlapping) wrapped in markers ->
    ([CLS] ... [SEP] ids, subject start marker index, object start marker index)."""
    ids, subj_at, obj_at = [cls_id], -1, -1
    for i, unit in enumerate(pieces):
        if i == subj[0]:
            subj_at = len(ids)
            ids.append(markers[0])
        if i == obj[0]:
            obj_at = len(ids)
            ids.append(markers[2])
        ids += unit
        if i == subj[1]:
            ids.append(markers[1])
        if i == obj[1]:
            ids.append(markers[3])
    return ids + [sep_id], subj_at, obj_at


def fit_window(length: int, first: int, last: int, size: int) -> tuple[int, int] | None:
    """[lo, hi) of at most `size` units that keeps units first..last, centred on them (a
    context plus four markers may exceed max_length), or None when they span more than size."""
    if length <= size:
        return 0, length
    if last - first + 1 > size:
        return None
    lo = max(0, min(first - (size - (last - first + 1)) // 2, length - size))
    return lo, lo + size


def _marker_ids(tokenizer: WordPieceTokenizer) -> list[int]:
    return [tokenizer.token_to_id(m) for m in MARKERS]


def distant_examples(data_dir: str, triples: set[tuple[int, str, int]], max_length: int, max_examples: int,
                     seed: int, skipped: Counter) -> dict[str, list[tuple[list[int], int, int, str]]]:
    """{split: [(ids, subject marker, object marker, relation)]} from DATA's shards."""
    tokenizer = WordPieceTokenizer()
    markers = _marker_ids(tokenizer)
    relation_of = {(s, o): r for s, r, o in triples}
    rng = random.Random(seed)
    out = {}
    for split in SPLITS:
        positives, negatives = [], []
        for row in read_shard_rows(data_dir, split):
            ids = row["token_ids"][1:-1]  # without [CLS] and [SEP]: mark() adds them back
            linked = [(s - 1, t - 1, e) for s, t, e in zip(row["mention_starts"], row["mention_ends"],
                                                            row["mention_entity_ids"]) if e >= 0]
            for (s1, t1, e1) in linked:
                for (s2, t2, e2) in linked:
                    if e1 == e2 or not (t1 < s2 or t2 < s1):
                        continue
                    relation = relation_of.get((e1, e2))
                    window = fit_window(len(ids), min(s1, s2), max(t1, t2), max_length - 6)  # [CLS] [SEP] 4 markers
                    if window is None:
                        skipped["pair_too_far_apart"] += 1
                        continue
                    lo, hi = window
                    units = [[i] for i in ids[lo:hi]]
                    marked, a, b = mark(units, (s1 - lo, t1 - lo), (s2 - lo, t2 - lo), markers, tokenizer.cls_id,
                                        tokenizer.sep_id)
                    (positives if relation else negatives).append((marked, a, b, relation or NO_RELATION))
        rng.shuffle(negatives)
        examples = positives + negatives[: len(positives)]
        rng.shuffle(examples)
        out[split] = examples[:max_examples]
        skipped[f"{split}_negatives_unused"] += max(0, len(negatives) - len(positives))
    return out


def synth_triples(world_dir: str | Path, data_dir: str | Path) -> set[tuple[int, str, int]]:
    path = Path(world_dir) / "facts.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: give a synthetic world (`eae data synth --out DIR`)")
    ids = {t: i for i, t in enumerate(entity_titles(data_dir))}
    out = set()
    for line in path.read_text().splitlines():
        f = json.loads(line)
        if f["subject"] in ids and f["object"] in ids:
            out.add((ids[f["subject"]], f["relation"], ids[f["object"]]))
    return out


def wiki_triples(data_dir: str | Path, skipped: Counter) -> set[tuple[int, str, int]]:
    """Real relations between entities of DATA's vocabulary (names resolved like QA answers:
    title, redirect, anchor text)."""
    from eae_data.qa.resolve import AnswerResolver
    from eae_platform.evaluate.probes import WORDNET_NOUNS, bsdgames_probes, geonames_probes
    from eae_platform.evaluate.span_tasks import wordnet_nouns

    resolver = AnswerResolver.from_dir(data_dir)
    named: list[tuple[str, str, list[str]]] = []  # (subject, relation, object names)
    probe_skips: Counter = Counter()  # the probe builders' own skips: not relations
    for source in (geonames_probes, bsdgames_probes):
        try:
            named += [(p.subject, p.relation, p.answers) for p in source(probe_skips)]
        except FileNotFoundError:
            skipped[f"source_missing_{source.__name__}"] += 1
    if WORDNET_NOUNS.is_file():
        lemmas, pointers = wordnet_nouns(WORDNET_NOUNS)
        for offset, ptrs in pointers.items():
            for symbol, target in ptrs:
                if symbol == "#p" and lemmas[offset][0][:1].isupper():
                    named.append((lemmas[offset][0], "part_of", lemmas[target]))
    out = set()
    for subject, relation, objects in named:
        s = resolver.entity_id(subject)
        o = next((e for e in map(resolver.entity_id, objects) if e is not None), None)
        if s is None or o is None or s == o:
            skipped["relation_not_in_vocabulary"] += 1
        else:
            out.add((s, relation, o))
    return out


def tacred_examples(paths: list[str], max_length: int, skipped: Counter) -> dict[str, list]:
    if len(paths) != 3:
        raise ValueError("tacred needs TRAIN,DEV,TEST json files")
    tokenizer = WordPieceTokenizer()
    markers = _marker_ids(tokenizer)
    out = {}
    for split, path in zip(SPLITS, paths):
        if not Path(path).is_file():
            raise FileNotFoundError(f"TACRED file {path} not found")
        examples = []
        for r in json.loads(Path(path).read_text(encoding="utf-8")):
            try:
                tokens = [PTB_BRACKETS.get(t, t) for t in r["token"]]
                subj, obj = (r["subj_start"], r["subj_end"]), (r["obj_start"], r["obj_end"])
                relation = r["relation"]
            except (KeyError, TypeError):
                skipped["bad_record"] += 1
                continue
            if not (0 <= subj[0] <= subj[1] < len(tokens) and 0 <= obj[0] <= obj[1] < len(tokens)) or not (
                    subj[1] < obj[0] or obj[1] < subj[0]):
                skipped["bad_spans"] += 1
                continue
            units = [tokenizer.encode(t, add_special_tokens=False).ids or [tokenizer.unk_id] for t in tokens]
            ids, a, b = mark(units, subj, obj, markers, tokenizer.cls_id, tokenizer.sep_id)
            if len(ids) > max_length:
                skipped["too_long"] += 1
                continue
            examples.append((ids, a, b, relation))
        out[split] = examples
    return out


def load_relations(spec: str, max_length: int, max_examples: int, seed: int) -> tuple[dict, Counter]:
    def synth(args, skipped):
        return distant_examples(args[1], synth_triples(args[0], args[1]), max_length, max_examples, seed, skipped)

    def wiki(args, skipped):
        return distant_examples(args[0], wiki_triples(args[0], skipped), max_length, max_examples, seed, skipped)

    def tacred(args, skipped):  # tacred_examples says what a wrong number of files needs
        return tacred_examples(args, max_length, skipped)

    sources = {"synth": (2, 2, synth), "wiki": (1, 1, wiki), "tacred": (0, None, tacred)}
    return load_splits("relation", spec, sources, "synth:WORLD,DATA, wiki:DATA or tacred:TRAIN,DEV,TEST", max_examples)


def f1_score(predicted: list[str], gold: list[str]) -> dict[str, float]:
    """TACRED's micro precision, recall and F1 over the relations other than no_relation."""
    correct = sum(p == g != NO_RELATION for p, g in zip(predicted, gold))
    guessed = sum(p != NO_RELATION for p in predicted)
    actual = sum(g != NO_RELATION for g in gold)
    precision = correct / guessed if guessed else 0.0
    recall = correct / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def run(config) -> dict:
    """`eae eval relations --model M --data SPEC`."""
    from eae_platform.evaluate.common import device, load, tracker
    from eae_platform.evaluate.span_tasks import PositionClassifier, predict, train

    dev = device()
    model, _ = load(config.model, config.mlflow_uri, dev)
    data, skipped = load_relations(config.data, model.config.max_length, config.max_examples, config.seed)
    labels = sorted({r for *_, r in data["train"]} | {NO_RELATION})
    index = {r: i for i, r in enumerate(labels)}
    examples = {}
    for split, rows in data.items():
        examples[split] = []
        for ids, a, b, relation in rows:
            if relation not in index:  # a relation training never saw: scored as a miss
                skipped[f"{split}_unseen_relation"] += 1
            examples[split].append(Example(ids, [a, b], index.get(relation, -1)))

    def loss_fn(logits, targets):
        return torch.nn.functional.cross_entropy(logits, torch.tensor(targets, device=logits.device))

    classifier = PositionClassifier(model, 2, len(labels)).to(dev)
    metrics = {"relations/labels": len(labels)}
    with tracker(config, {"eae.model": config.model}, model.config) as t:
        train(classifier, [e for e in examples["train"] if e.target >= 0], loss_fn, config, dev, t.log_metrics)
        for split in ("dev", "test"):
            predicted = [labels[i] for i in predict(classifier, examples[split], dev).argmax(-1).tolist()]
            gold = [labels[e.target] if e.target >= 0 else "?" for e in examples[split]]
            metrics.update({f"{split}/{k}": v for k, v in f1_score(predicted, gold).items()})
        counts = {f"data/{s}_examples": len(v) for s, v in examples.items()}
        counts.update({f"data/{s}_related": sum(e.target != index[NO_RELATION] for e in v) for s, v in examples.items()})
        counts.update({f"skipped/{k}": v for k, v in sorted(skipped.items())})
        t.log_metrics({**metrics, **counts}, step=config.steps)
        run_id = t.run_id
    return {"metrics": metrics, "counts": counts, "skipped": dict(skipped), "labels": labels, "run_id": run_id}
