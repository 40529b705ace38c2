"""Zero-shot cloze probes (paper Table 3): "The capital of France is [MASK] ." -> Paris.

Each probe's [MASK] becomes as many [MASK] wordpieces as its answer has (the answer's length
is given, as in pretraining where a masked mention keeps its wordpiece count), and two heads
answer it, without any fine-tuning:

    token   TokenPred's argmax at every masked position spells the answer's wordpieces
            (for one-wordpiece answers this is LAMA's P@1)
    entity  EntityPred's top entity at the masked span (a mention, s..t) is the answer's entity;
            only probes whose answer resolves to an entity of the model's vocabulary count

The subject's name, when found in the sentence, is given as a mention too, so the memory (EaE)
reads its entity. Accuracy per relation and per source (micro), logged as
`lama/<source>/<relation>/{token_accuracy,entity_accuracy,probes,entity_probes}`; synth probes
with `eval.stated_in` also per group (`lama/synth/stated/...`: facts whose article pretraining
read; `unstated`: held-out articles), beside the prior-only baseline (`prior_accuracy`,
`prior_entity_accuracy`: always the relation's most frequent answer; for real probes, the
most frequent answer among the probes asked the same way, `probes.set_priors`). For EaE, what its memory
read: `memory_subject_accuracy` (the top-1 entity at the subject's mention is the subject: the
memory found whose facts are asked) and `memory_answer_accuracy` (at the masked answer).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace

import torch

from eae_data.tokenizer import WordPieceTokenizer
from eae_model.mentions import Mentions
from eae_model.model import EaEModel
from eae_platform import task_stop
from eae_platform.evaluate.probes import MASK, Probe


@dataclass
class EncodedProbe:
    probe: Probe
    ids: list[int]
    answer_ids: list[int]  # the answer's wordpieces
    answer_span: tuple[int, int]  # inclusive wordpiece span of the masks
    subject_span: tuple[int, int] | None
    entity_id: int | None  # the answer's entity in the model's vocabulary
    subject_id: int | None = None  # the subject's entity, when its name resolves


def _find(haystack: list[int], needle: list[int]) -> int:
    for i in range(len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    return -1


def encode_probes(probes: list[Probe], tokenizer: WordPieceTokenizer, max_length: int, resolve,
                  skipped: Counter) -> list[EncodedProbe]:
    """resolve(name) -> entity id or None (the model's vocabulary)."""
    out = []
    for p in probes:
        left, right = p.text.split(MASK, 1)
        answer = tokenizer.encode(p.answer, add_special_tokens=False).ids
        if not answer:
            skipped[f"{p.source}/empty_answer"] += 1
            continue
        left_ids = tokenizer.encode(left, add_special_tokens=False).ids
        right_ids = tokenizer.encode(right, add_special_tokens=False).ids
        ids = [tokenizer.cls_id, *left_ids, *[tokenizer.mask_id] * len(answer), *right_ids, tokenizer.sep_id]
        if len(ids) > max_length:
            skipped[f"{p.source}/too_long"] += 1
            continue
        start = 1 + len(left_ids)
        span = (start, start + len(answer) - 1)
        subject_span = None
        if p.subject:
            needle = tokenizer.encode(p.subject, add_special_tokens=False).ids
            at = _find(ids, needle) if needle else -1
            if at >= 0 and (at + len(needle) - 1 < span[0] or at > span[1]):
                subject_span = (at, at + len(needle) - 1)
            else:
                skipped[f"{p.source}/subject_not_found"] += 1  # still probed, without the subject mention
        entity = next((e for e in (resolve(a) for a in p.answers) if e is not None), None)
        subject_id = resolve(p.subject) if subject_span is not None else None
        out.append(EncodedProbe(p, ids, answer, span, subject_span, entity, subject_id))
    return out


@torch.no_grad()
def score(model: EaEModel, encoded: list[EncodedProbe], device: torch.device, batch_size: int = 64,
          ) -> list[dict]:
    """One row per probe: token_correct, entity_correct (None when not scorable), prediction."""
    model.eval()
    rows = []
    for i in range(0, len(encoded), batch_size):
        task_stop.check()  # the command was stopped
        chunk = encoded[i : i + batch_size]
        length = max(len(e.ids) for e in chunk)
        ids = torch.zeros((len(chunk), length), dtype=torch.long)
        mask = torch.zeros_like(ids)
        spans = []
        for b, e in enumerate(chunk):
            ids[b, : len(e.ids)] = torch.tensor(e.ids)
            mask[b, : len(e.ids)] = 1
            # mentions in position order (the memory's slots follow their starts)
            spans.append(sorted([e.answer_span] + ([e.subject_span] if e.subject_span else [])))
        m = Mentions.from_lists(spans)
        out = model(ids.to(device), mask.to(device), mentions=m.spans().to(device))
        logits = model.token_logits(out.x4)  # [B, L, V]
        first = [sum(len(s) for s in spans[:b]) for b in range(len(chunk))]  # each probe's first mention row
        answer_rows = [first[b] + spans[b].index(e.answer_span) for b, e in enumerate(chunk)]
        top = None
        if out.entity_queries is not None:
            _, top = model.entity_table.top_k(out.entity_queries[torch.tensor(answer_rows)].float(), 1)
        # EaE: what the memory read (its top-1 entity, after l0 layers) at each mention
        read = None
        if out.memory is not None:
            _, read = model.entity_table.top_k(out.memory.pseudo_embeddings.float(), 1)
        for b, e in enumerate(chunk):
            s, t = e.answer_span
            predicted = logits[b, s : t + 1].argmax(-1).tolist()
            row = {"source": e.probe.source, "relation": e.probe.relation, "group": e.probe.group,
                   "text": e.probe.text, "answer": e.probe.answer, "token_correct": predicted == e.answer_ids,
                   "token_prediction": predicted, "entity_correct": None,
                   "prior_correct": e.probe.prior in e.probe.answers if e.probe.prior else None}
            if top is not None and e.entity_id is not None:
                row["entity_correct"] = int(top[b, 0]) == e.entity_id
                row["entity_prediction"] = int(top[b, 0])
            if read is not None and e.entity_id is not None:
                row["memory_answer_correct"] = int(read[answer_rows[b], 0]) == e.entity_id
            if read is not None and e.subject_id is not None:
                row["memory_subject_correct"] = int(read[first[b] + spans[b].index(e.subject_span), 0]) == e.subject_id
            rows.append(row)
    return rows


def aggregate(rows: list[dict]) -> dict[str, float]:
    """Accuracy per (source, relation), per source and, for probes with a group (synth with
    stated_in), per source and group, with counts; where probes have a prior, the prior-only
    baseline's accuracy over the same probes (`prior_accuracy`: always the relation's most
    frequent answer; over the entity-scorable ones: `prior_entity_accuracy`)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[f"lama/{r['source']}/{r['relation']}"].append(r)
        groups[f"lama/{r['source']}"].append(r)
        if r.get("group"):
            groups[f"lama/{r['source']}/{r['group']}"].append(r)
    metrics = {}
    for key, group in groups.items():
        metrics[f"{key}/probes"] = len(group)
        metrics[f"{key}/token_accuracy"] = sum(r["token_correct"] for r in group) / len(group)
        with_prior = all(r.get("prior_correct") is not None for r in group)
        if with_prior:
            metrics[f"{key}/prior_accuracy"] = sum(r["prior_correct"] for r in group) / len(group)
        scorable = [r for r in group if r["entity_correct"] is not None]
        metrics[f"{key}/entity_probes"] = len(scorable)
        if scorable:
            metrics[f"{key}/entity_accuracy"] = sum(r["entity_correct"] for r in scorable) / len(scorable)
            if with_prior:
                metrics[f"{key}/prior_entity_accuracy"] = sum(r["prior_correct"] for r in scorable) / len(scorable)
        for what in ("subject", "answer"):  # EaE only: the memory's reads
            read = [r[f"memory_{what}_correct"] for r in group if f"memory_{what}_correct" in r]
            if read:
                metrics[f"{key}/memory_{what}_accuracy"] = sum(read) / len(read)
    return metrics


def run(config) -> dict:
    """`eae eval lama`: probes of config.data (a source spec, see probes.py) for config.model;
    with config.memory_off_run, again with the memory's output zeroed, as a run of that name."""
    from eae_data.qa.resolve import AnswerResolver
    from eae_platform.evaluate.common import device, load, silence_memory
    from eae_platform.evaluate.probes import load_probes

    dev = device()
    probe_set = load_probes(config.data, config.max_per_relation, config.seed, config.stated_in or None)
    model, vocab_dir = load(config.model, config.mlflow_uri, dev, config.memory_off)
    if config.memory_off_run and model.entity_memory is None:  # before any run is logged
        raise ValueError(f"eval.memory_off_run: {config.model} has no entity memory (model.use_entity_memory=false)")
    resolver = AnswerResolver.from_dir(vocab_dir) if model.entity_pred is not None and vocab_dir else None
    skipped = Counter(probe_set.skipped)
    encoded = encode_probes(probe_set.probes, WordPieceTokenizer(), model.config.max_length,
                            resolver.entity_id if resolver else (lambda name: None), skipped)
    summary = _score_and_log(config, model, encoded, skipped, probe_set.available, dev)
    if config.memory_off_run:
        silence_memory(model, config.model)
        off = replace(config, memory_off=True, memory_off_run="", run_name=config.memory_off_run)
        summary["memory_off"] = _score_and_log(off, model, encoded, skipped, probe_set.available, dev)
    return summary


def _score_and_log(config, model, encoded, skipped: Counter, available: dict, dev) -> dict:
    """Score the encoded probes and log them as config's MLflow run: {metrics, skipped, run_id, rows}."""
    import json
    import tempfile
    from pathlib import Path

    from eae_platform.evaluate.common import tracker

    rows = score(model, encoded, dev, max(config.batch_size, 64))
    metrics = aggregate(rows)
    counts = {f"skipped/{k}": v for k, v in sorted(skipped.items())}
    counts.update({f"lama/{k}/available": v for k, v in sorted(available.items())})
    with tracker(config, {"eae.model": config.model}, model.config) as t:
        t.log_metrics({**metrics, **counts}, step=0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probes.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            t.log_artifacts(path, "predictions")
        run_id = t.run_id
    return {"metrics": metrics, "skipped": dict(skipped), "run_id": run_id, "rows": rows}
