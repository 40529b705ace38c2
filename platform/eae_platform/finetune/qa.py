"""Closed-book QA fine-tuning (paper section "Open domain Question Answering").

    finetune(config) -> summary      # train on the resolvable train questions, evaluate EM

One process (CPU threads or one GPU): QA batches are small, and a Tune sweep runs several
trials side by side instead. The pretrained model comes from `config.init` (an MLflow model
URI, a model directory or a pretraining checkpoint). Answers are resolved to entity ids with the
model's entity vocabulary; unresolved *training* questions are dropped (counted), while every
dev/test question counts, so EM is bounded by the oracle (the share that resolved), which is
reported beside it as the paper does.

MLflow (one run, a child of `parent_run_id` in sweeps): the whole config and the pretrained
model's config as params; `train/loss` (+ per head), `train/lr`; `dev/em`, `dev/oracle`, and
`test/em`, `test/oracle` when test is evaluated, beside the prior-only baseline `<split>/prior_em`
(synth: always the relation's most frequent training answer) and, with `finetune.stated_in`, EM
for the questions whose fact pretraining read (`<split>/em_stated`) and the rest (`_unstated`);
counts as `data/*`; predictions as `predictions/<split>.jsonl` artifacts. The run ends FAILED on an
error and KILLED on an interrupt. The fine-tuned model is registered as a new version of
`models:/eae-qa` (no alias moves), or with `register_as: NAME` of NAME with `alias` (default qa)
moved to it; sweep trials register nothing (`register: false`; the sweep registers its pick).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from eae_data.aliases import AliasMatcher
from eae_data.constants import VOCAB_FILES
from eae_data.qa.examples import SPLITS, QAExample, load_dataset, normalize_answer
from eae_data.qa.resolve import AnswerResolver
from eae_data.tokenizer import WordPieceTokenizer
from eae_model.checkpoint import load_model, save_model
from eae_model.model import EaEModel
from eae_model.qa.encode import EncodedQuestion, QAEncoder
from eae_platform import task_stop
from eae_platform.finetune.config import FinetuneConfig
from eae_platform.model_init import InitModel, resolve_init

Report = Callable[[dict, "Path | None"], None]  # (metrics, final model dir or None)
REGISTERED_NAME = "eae-qa"  # the registered model of fine-tuned QA models without --register-as


class QATask:
    """A dataset read, resolved and encoded for one model's vocabulary and tokenizer."""

    def __init__(self, config: FinetuneConfig, vocab_dir: Path, max_length: int):
        self.config = config
        self.resolver = AnswerResolver.from_dir(vocab_dir)
        self.dataset = load_dataset(config.data, config.dev_fraction)
        matcher = None
        if config.mentions == "alias":
            matcher = AliasMatcher(self.resolver.names())
        self.encoder = QAEncoder(WordPieceTokenizer(), max_length, config.answer_token, matcher)
        self.examples: dict[str, list[QAExample]] = {}
        self.encoded: dict[str, list[EncodedQuestion]] = {}
        self.counts: dict[str, float] = {}
        for split in SPLITS:
            examples = self.dataset.splits.get(split, [])
            resolved = self.resolver.resolve_all(examples)
            if split == "train":  # the paper drops unresolved training questions
                examples = [ex for ex in examples if ex.answer_id is not None]
            self.examples[split] = examples
            self.encoded[split] = self.encoder.encode(examples)
            self.counts[f"data/{split}_questions"] = len(self.dataset.splits.get(split, []))
            self.counts[f"data/{split}_resolved"] = resolved
        self.counts["data/train_dropped_unresolved"] = self.counts["data/train_questions"] - len(self.examples["train"])
        self.counts["data/question_mentions"] = sum(len(q.spans) for s in SPLITS for q in self.encoded[s])
        for reason, n in sorted(self.dataset.skipped.items()):
            self.counts[f"data/skipped_{reason}"] = n
        for reason, n in sorted(self.encoder.skipped.items()):
            self.counts[f"data/mentions_skipped_{reason}"] = n
        if not self.dataset.splits.get("train"):  # nothing read: not a vocabulary mismatch
            skipped = f" ({sum(self.dataset.skipped.values()):,} records skipped: {dict(self.dataset.skipped)})" \
                if self.dataset.skipped else ""
            raise ValueError(f"{config.data!r} holds no training question{skipped}")
        if not self.examples["train"]:
            raise ValueError(f"no training question of {config.data!r} resolves to an entity of the model's "
                             f"vocabulary ({len(self.resolver):,} entities in {vocab_dir})")

    def oracle(self, split: str) -> float:
        n = self.counts[f"data/{split}_questions"]
        return self.counts[f"data/{split}_resolved"] / n if n else math.nan

    @torch.no_grad()
    def evaluate(self, model: EaEModel, split: str, device: torch.device, k: int | None = None,
                 ) -> tuple[dict[str, float], list[dict]]:
        """Exact match of the top entity at the answer position over every question of `split`
        (unresolved answers count as wrong). k: the memory's top-k; None: the model's inference
        k (k >= num_entities is all of them, the full softmax). Returns ({em, oracle,
        questions}, predictions)."""
        examples, encoded = self.examples[split], self.encoded[split]
        was_training = model.training
        model.eval()
        predictions, correct = [], 0
        size = self.config.eval_batch_size
        for i in range(0, len(encoded), size):
            batch = self.encoder.collate(encoded[i : i + size]).to(device)
            mentions = batch.mentions.spans()
            kwargs = {} if k is None else {"k": k}
            with _autocast(device):
                out = model(batch.input_ids, batch.attention_mask, mentions=mentions, **kwargs)
            scores, ids = model.entity_table.top_k(out.entity_queries[batch.answer_index].float(), self.config.top_k)
            for ex, row_scores, row_ids in zip(examples[i : i + size], scores.tolist(), ids.tolist()):
                hit = self.resolver.matches(row_ids[0], ex.answers)
                correct += hit
                predictions.append({
                    "id": ex.id, "question": ex.question, "answers": ex.answers[:5], "answer_id": ex.answer_id,
                    "prediction": self.resolver.titles[row_ids[0]], "prediction_id": row_ids[0], "correct": hit,
                    "top_k": [[self.resolver.titles[e], round(s, 4)] for e, s in zip(row_ids, row_scores)],
                })
        model.train(was_training)
        n = len(examples)
        return {"em": correct / n if n else math.nan, "oracle": self.oracle(split), "questions": n}, predictions

    def prior_answers(self) -> dict[str, str]:
        """relation -> its most frequent answer among the training questions: the prior-only
        baseline's answer. Questions that name no relation (fanoutqa, TriviaQA) share one,
        "": the most frequent training answer overall."""
        counts: dict[str, Counter] = defaultdict(Counter)
        for ex in self.examples["train"]:
            counts[ex.meta.get("relation") or ""][ex.answers[0]] += 1
        return {r: c.most_common(1)[0][0] for r, c in counts.items()}

    def breakdown(self, split: str, predictions: list[dict], stated=None) -> dict[str, float]:
        """EM of `split` beside the prior-only baseline (`prior_em`: always the relation's most
        frequent training answer), overall and, given stated(subject_id) -> bool (which facts
        pretraining read, `probes.stated_subjects`), per group: `em_stated`, `em_unstated`,
        with their question counts. Empty without training questions."""
        prior = self.prior_answers()
        if not prior:
            return {}
        groups: dict[str, list[tuple[bool, bool]]] = defaultdict(list)  # group -> (correct, prior correct)
        for ex, row in zip(self.examples[split], predictions):
            guess = prior.get(ex.meta.get("relation") or "")
            hit = guess is not None and normalize_answer(guess) in {normalize_answer(a) for a in ex.answers}
            groups[""].append((row["correct"], hit))
            if stated is not None and ex.meta.get("subject_id") is not None:
                groups["_stated" if stated(ex.meta["subject_id"]) else "_unstated"].append((row["correct"], hit))
        out = {}
        for g, rows in groups.items():
            out[f"{split}/prior_em{g}"] = sum(p for _, p in rows) / len(rows)
            if g:
                out[f"{split}/em{g}"] = sum(c for c, _ in rows) / len(rows)
                out[f"{split}/questions{g}"] = len(rows)
        return out


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def load_init_model(init: InitModel, device: torch.device) -> EaEModel:
    model = load_model(init.model_dir, config=init.config).to(device)
    if model.entity_pred is None:
        raise ValueError(f"the model of preset {model.config.preset!r} has no EntityPred head: it cannot "
                         "predict answer entities (QA needs EaE or No-EaE)")
    return model


def clip_gradients(model: torch.nn.Module, max_norm: float) -> None:
    """Clip the global gradient norm to max_norm; max_norm <= 0: no clipping, as in pretraining
    (pretrain.loop.sync_and_clip). torch's clip_grad_norm_ with max_norm 0 multiplies every
    gradient by 0: `finetune.grad_clip=0` trained nothing, silently."""
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm)


def index_batches(n: int, batch_size: int, seed: int):
    """Endless index batches: a fresh permutation each epoch (seeded by seed and epoch); when
    there are fewer questions than batch_size, each batch is all of them."""
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        if n <= batch_size:
            yield order
        else:
            for i in range(0, n - batch_size + 1, batch_size):
                yield order[i : i + batch_size]
        epoch += 1


def finetune(config: FinetuneConfig, report: Report | None = None, device: torch.device | None = None) -> dict:
    """Fine-tune `config.init` on `config.data`; returns {metrics, run_id, model, model_uri, ...}."""
    from eae_platform.tracking import Tracker

    if config.crash_once_file and not Path(config.crash_once_file).exists():
        Path(config.crash_once_file).touch()
        raise RuntimeError(f"crash_once_file: failing this run once on purpose ({config.crash_once_file} created)")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    init = resolve_init(config.init, config.mlflow_uri)
    vocab_dir = Path(config.vocab) if config.vocab else init.vocab_dir
    model = load_init_model(init, device)
    task = QATask(config, vocab_dir, model.config.max_length)
    if len(task.resolver) != model.config.num_entities:
        raise ValueError(f"the entity vocabulary in {vocab_dir} has {len(task.resolver):,} entities but the model "
                         f"{model.config.num_entities:,}: they do not belong together")

    tags = {"eae.task": "qa", "eae.dataset": task.dataset.name}
    if config.parent_run_id:
        tags["mlflow.parentRunId"] = config.parent_run_id
    # A sweep's trial (it has a parent run) waits up to a minute for a store that is restarting,
    # when it starts (else it would fail: a CI run of the restart test) and when it ends (else a
    # trial ending in a restart longer than the default 10 s leaves its metrics in its unsent
    # journal, not in its run: another CI run of that test, under load)
    waits = {"open_wait_s": 60.0, "close_wait_s": 60.0} if config.parent_run_id else {}  # else Tracker's defaults
    config = dataclasses.replace(config, run_name=run_name(config, task.dataset.name))  # its logged config says it too
    tracker = Tracker(config.experiment, run_name=config.run_name, uri=config.mlflow_uri, tags=tags, **waits)
    with tracker:  # an exception ends the MLflow run FAILED, an interrupt (Ctrl-C, a cancelled task) KILLED
        return _train(config, report, device, model, task, vocab_dir, tracker)


def run_name(config: FinetuneConfig, dataset: str) -> str:
    """The MLflow run's name: finetune.run_name, else "qa-" and the --out directory's name (the
    quick start's `--out runs/qa/eae` is `qa-eae`, a name `eae compare` and `eae eval analysis`
    take), else "qa-" and the dataset's; never MLflow's random one, which no user would guess."""
    return config.run_name or f"qa-{Path(config.out).name if config.out else dataset}"


def _train(config: FinetuneConfig, report: Report | None, device: torch.device, model: EaEModel, task: QATask,
           vocab_dir: Path, tracker) -> dict:
    """finetune()'s training, evaluation and model registration, logged to `tracker`'s run."""
    from eae_platform.pretrain.loop import lr_lambda
    from eae_platform.progress import say

    tracker.log_config({**config.to_dict(), "model": model.config.to_dict()})
    tracker.log_metrics({**task.counts, "dev/oracle": task.oracle("dev"), "test/oracle": task.oracle("test")}, step=0)

    torch.manual_seed(config.seed)
    steps = config.steps
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(steps, config.warmup_fraction))
    train = task.encoded["train"]
    batches = index_batches(len(train), config.batch_size, config.seed)
    metrics: dict[str, float] = {}
    window, window_steps, start = {}, 0, time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        task_stop.check()  # the command was stopped (Ctrl-C, SIGTERM): KILLED, at a step's boundary
        batch = task.encoder.collate([train[i] for i in next(batches)]).to(device)
        with _autocast(device):
            out = model(batch.input_ids, batch.attention_mask, mentions=batch.mentions, bio_labels=batch.bio_labels)
        if not torch.isfinite(out.loss):
            raise FloatingPointError(f"step {step}: the loss is {float(out.loss)} (lr {config.lr} too high?)")
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        clip_gradients(model, config.grad_clip)
        optimizer.step()
        scheduler.step()
        for name, value in {"loss": out.loss, **out.losses}.items():
            window[name] = window.get(name, 0.0) + float(value.detach())
        window_steps += 1
        if step % config.log_every == 0 or step == steps:
            elapsed = time.perf_counter() - start
            tracker.log_metrics({("train/loss" if n == "loss" else f"train/loss_{n}"): v / window_steps
                                 for n, v in window.items()} | {"train/lr": scheduler.get_last_lr()[0],
                                 "train/steps_per_s": window_steps / elapsed}, step=step)
            say(f"step {step}/{steps}: loss {window['loss'] / window_steps:.3f} | {window_steps / elapsed:.2f} steps/s")
            window, window_steps, start = {}, 0, time.perf_counter()
        if config.eval_every and step % config.eval_every == 0 and step < steps:
            dev, _ = task.evaluate(model, "dev", device)
            tracker.log_metrics({"dev/em": dev["em"]}, step=step)
            say(f"step {step}/{steps}: dev EM {100 * dev['em']:.1f}")
            if report:
                report({"step": step, "dev/em": dev["em"]}, None)

    stated = None
    if config.stated_in:
        from eae_platform.evaluate.probes import stated_subjects

        stated = stated_subjects(config.stated_in)
    dev, dev_predictions = task.evaluate(model, "dev", device)
    metrics = {"dev/em": dev["em"], "dev/oracle": dev["oracle"], **task.breakdown("dev", dev_predictions, stated)}
    predictions = {"dev": dev_predictions}
    if config.evaluate_test:
        test, predictions["test"] = task.evaluate(model, "test", device)
        metrics.update({"test/em": test["em"], "test/oracle": test["oracle"],
                        **task.breakdown("test", predictions["test"], stated)})
        if config.memory_off_eval:
            off, predictions["test_memory_off"] = memory_off_em(model, task, device, stated, config.init)
            metrics.update(off)
    tracker.log_metrics(metrics, step=steps)
    with tempfile.TemporaryDirectory() as tmp:
        for split, rows in predictions.items():
            path = Path(tmp) / f"{split}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            tracker.log_artifacts(path, "predictions")
    out_dir = Path(config.out) if config.out else None
    keep = out_dir is not None or report is not None  # a Tune trial's directory becomes its checkpoint
    registered = {}
    if keep or config.register:
        out_dir = out_dir or Path(tempfile.mkdtemp(prefix="eae-qa-model-"))
        save_qa_model(model, vocab_dir, out_dir)
        if config.register:
            registered = register_qa_model(tracker, config, out_dir, steps)
    summary = {"metrics": metrics, "run_id": tracker.run_id, "run_name": config.run_name,
               "model": str(out_dir) if keep else None, "counts": task.counts, "steps": steps, **registered}
    if report:
        report({"step": steps, "dev/em": dev["em"], "dev/oracle": dev["oracle"], "mlflow_run_id": tracker.run_id},
               out_dir)
    closed = tracker.close()
    summary.update(registered_at_close(tracker, registered))
    # what the store did not take, and where it is journaled: the tracker's report of it stays in
    # the Ray task's log, so the command says it (else nothing did)
    summary["mlflow_unsent"] = [] if closed.ok else [str(closed)]  # a list, as eae eval's (one run per evaluation)
    if out_dir is not None and not keep:  # registered (or staged by the tracker): the copy is not needed
        shutil.rmtree(out_dir, ignore_errors=True)
    return summary


def memory_off_em(model: EaEModel, task: QATask, device: torch.device, stated, name: str,
                  ) -> tuple[dict[str, float], list[dict]]:
    """Test EM with EaE's memory output zeroed (evaluate.common.silence_memory) for as long as
    this evaluation runs: ({`test/em_memory_off`, and with `stated` `test/em_stated_memory_off` and
    `test/em_unstated_memory_off`}, predictions). What the fine-tuned model's answers owe to what
    it retrieves."""
    from eae_platform.evaluate.common import silence_memory

    handle = silence_memory(model, name)
    try:
        off, predictions = task.evaluate(model, "test", device)
    finally:
        handle.remove()
    groups = {k: v for k, v in task.breakdown("test", predictions, stated).items() if k.startswith("test/em_")}
    return {f"{k}_memory_off": v for k, v in {"test/em": off["em"], **groups}.items()}, predictions


def register_qa_model(tracker, config: FinetuneConfig, model_dir: Path, step: int) -> dict:
    """A fine-tuned model as a new registered version, linked to `tracker`'s run: of
    `config.register_as` with its alias (`config.alias`) moved to it, else of REGISTERED_NAME
    with no alias moved (aliases move only when asked). Returns {model_uri} (None while queued
    for an unreachable store), with an alias also {alias_version, alias_was}."""
    from eae_platform.tracking import alias_version

    before = len(tracker.registered)
    if not config.register_as:
        uri = tracker.register_model(model_dir, REGISTERED_NAME, alias=None, step=step)
        return {"model_uri": uri} if len(tracker.registered) > before else {"model_uri": None, "queued": True}
    was = alias_version(tracker.uri, config.register_as, config.alias)
    uri = tracker.register_model(model_dir, config.register_as, config.alias, step=step)
    if len(tracker.registered) == before:  # queued: the alias has not moved yet
        return {"model_uri": None, "queued": True, "alias_was": was}
    return {"model_uri": uri, "alias_version": alias_version(tracker.uri, config.register_as, config.alias),
            "alias_was": was}


def registered_at_close(tracker, registered: dict) -> dict:
    """After `tracker.close()`: a registration register_qa_model found queued (the store was
    away then) and close() then made, as register_qa_model would have said it; {} otherwise.
    Without it the command printed no `registered:` line for a version that had been registered."""
    if not registered.get("queued") or not tracker.registered:
        return {}
    done = tracker.registered[-1]
    if done["alias"] is None:
        return {"model_uri": done["uri"], "queued": False}
    return {"model_uri": done["uri"], "queued": False, "alias_version": done["version"]}


def save_qa_model(model: EaEModel, vocab_dir: Path, out: Path) -> Path:
    """The fine-tuned model as a model directory, with the entity vocabulary beside it."""
    save_model(model, out)
    for name in VOCAB_FILES:
        if (vocab_dir / name).is_file() and (vocab_dir / name).resolve() != (out / name).resolve():
            shutil.copyfile(vocab_dir / name, out / name)
    return out
