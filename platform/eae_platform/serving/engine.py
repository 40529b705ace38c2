"""Entity linking, question answering and new entities with a loaded EaE model; no Ray here
(the Serve deployment in app.py wraps one engine per replica).

Linking: the text is cut into windows of at most max_length - 2 wordpieces (never inside a
word or a given span), each window runs through EaEModel at once (one padded batch for all
windows of all requests), and every mention's candidates are the top entities of faiss search
with EntityPred's query h' (the memory's h when the model has no EntityPred). A candidate's
score is its softmax probability among the `retrieve_k` best entities (the paper's top-k
softmax; an upper bound of the full-softmax probability).

Answering (the paper's open-domain QA setup): the question gets an answer position, a [MASK]
token before [SEP], used as a mention; the question's own mentions are decoded by the BIO head
elsewhere; the answer entities are the candidates of the answer position.

New entities: the mean direction of EntityPred's queries h' over example mentions, scaled to
0.8 x the table's mean row norm (EngineConfig.new_entity_norm), appended to E and to the
index (ids N, N+1, ...), optionally saved to an entity store that every replica (and a
restart) reads back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from eae_data.constants import MASK_TOKEN_ID
from eae_model import bio
from eae_model.mentions import Mentions
from eae_platform.serving.index import IndexConfig
from eae_platform.serving.model_source import ModelFiles, read_aliases, read_titles, titles_corpus
from eae_platform.serving.table import FaissEntityTable

STORE_JSON, STORE_ROWS = "added-entities.json", "added-entities.safetensors"
EMBED_SOURCES = ("entity_pred", "memory", "both")


class RequestError(ValueError):
    """Bad input: the HTTP layer answers `status` with the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class EngineConfig:
    max_text_chars: int = 10_000  # longer texts are refused (413)
    max_top_k: int = 100  # top_k above this is refused
    default_top_k: int = 5
    retrieve_k: int = 100  # candidates per mention whose softmax gives the scores
    max_spans: int = 512
    max_contexts: int = 64  # example contexts per new entity
    entity_store: str | None = None  # directory of added entities (saved, and read at start)
    embed_source: str = "entity_pred"  # new entities from: entity_pred (h'), memory (h) or both
    # A new row's norm, relative to the trained rows' mean norm. Scores are dot products and the
    # new row points straight at its examples' queries, so at 1.0 it wins mentions of other
    # entities too; at 0.5 it never wins. 0.8 linked best overall (benchmarks/bench_add_entities.py).
    new_entity_norm: float = 0.8
    index: IndexConfig = field(default_factory=IndexConfig)
    num_threads: int | None = None  # torch intra-op threads (None: torch's default; Serve: the replica's CPUs)

    def __post_init__(self) -> None:
        if isinstance(self.index, dict):
            self.index = IndexConfig(**self.index)
        if self.embed_source not in EMBED_SOURCES:
            raise ValueError(f"embed_source must be one of {', '.join(EMBED_SOURCES)}")
        if self.entity_store and Path(self.entity_store).exists() and not Path(self.entity_store).is_dir():
            # was NotADirectoryError at the first read or write, a traceback file
            raise ValueError(f"entity store {self.entity_store}: not a directory (a store is a directory, made "
                             f"when missing, of {STORE_ROWS} and {STORE_JSON})")
        for name in ("max_text_chars", "max_top_k", "default_top_k", "retrieve_k", "max_spans", "max_contexts",
                     "new_entity_norm"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass
class Window:
    """One model input: [CLS] ids [SEP]; offsets per wordpiece (specials: None); spans are
    inclusive wordpiece indices in the window; owner/kind say where its mentions go."""

    owner: int
    ids: list[int]
    offsets: list[tuple[int, int] | None]
    spans: list[tuple[int, int]] | None  # given spans (None: detect with the BIO head)
    answer_at: int | None = None  # the answer position of a question


@dataclass
class LinkJob:
    text: str
    spans: list[tuple[int, int]] | None = None  # (start, end) characters, end exclusive
    top_k: int = 5


@dataclass
class AnswerJob:
    question: str
    top_k: int = 5


def check_encodable(text: str, what: str) -> None:
    """JSON may escape half a UTF-16 pair ("\\ud800"), which decodes to a lone surrogate that no
    UTF-8 encoder takes: the tokenizer raised TypeError (a 500), and an added title with one broke
    every later response naming it. Refused here, where the text comes in."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{what} has an unpaired surrogate, {text[exc.start]!r} at character {exc.start} "
                           "(half of a UTF-16 pair in a JSON \\u escape)") from None


def parse_spans(spans, text: str, max_spans: int) -> list[tuple[int, int]]:
    """[[start, length], ...] (REL's convention) -> sorted (start, end) character spans; every
    problem is a RequestError naming the span."""
    if not isinstance(spans, list):
        raise RequestError("spans must be a list of [start, length] pairs")
    if len(spans) > max_spans:
        raise RequestError(f"{len(spans)} spans, at most {max_spans} allowed")
    out = []
    for i, span in enumerate(spans):
        if (not isinstance(span, (list, tuple)) or len(span) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)):
            raise RequestError(f"span {i}: {span!r} is not a [start, length] pair of integers")
        start, length = span
        if start < 0 or length <= 0 or start + length > len(text):
            raise RequestError(f"span {i}: [{start}, {length}] is not inside the text of {len(text)} "
                               f"characters with a positive length")
        if not text[start:start + length].strip():
            raise RequestError(f"span {i}: [{start}, {length}] covers only whitespace")
        out.append((start, start + length, i))
    out.sort()
    for (s0, e0, i0), (s1, e1, i1) in zip(out, out[1:]):
        if s1 < e0:
            raise RequestError(f"spans {i0} [{s0}, {e0 - s0}] and {i1} [{s1}, {e1 - s1}] overlap")
    return [(s, e) for s, e, _ in out]


class Engine:
    def __init__(self, files: ModelFiles, config: EngineConfig | None = None, device: str | None = None):
        """device: "cpu" or "cuda"; None: a GPU when one is visible (the Serve app says which:
        a replica without GPUs may still see one)."""
        from eae_data.tokenizer import WordPieceTokenizer
        from eae_model.checkpoint import load_model

        self.config = c = config or EngineConfig()
        if c.num_threads:
            torch.set_num_threads(c.num_threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the engine was asked to run on a GPU, and torch sees none (gpus_per_replica > 0 "
                               "on a node without GPUs, or a CPU-only torch)")
        self.files = files
        self.model = load_model(files.model_dir, self.device).eval()
        if self.model.entity_table is None:
            raise ValueError(f"model {files.source}: preset {self.model.config.preset!r} has no entity table to link to")
        self.base_entities = self.model.entity_table.num_entities
        # On a GPU the memory's top-k and the candidates come from the exact top-k kernel (a flat index)
        self.table = FaissEntityTable(self.model.entity_table.weight, c.index, self.device)
        self.model.entity_table = self.table
        self.titles = read_titles(files.titles_file, self.base_entities)
        self.title_ids = {t: i for i, t in enumerate(self.titles) if t is not None}
        self.titles_from = titles_corpus(files.titles_file)  # "wikipedia", "synthetic" or None
        self._aliases = None  # (entity ids, aliases) from aliases.parquet, read at the first entity()
        self.added_aliases: list[list[str]] = []  # the aliases given for each added entity, in id order
        self.row_norm = float(self.table.weight.norm(dim=-1).mean())
        self.tokenizer = WordPieceTokenizer()
        self.window = self.model.config.max_length - 2
        self._store_stamp: int | None = None
        self.sync_store()

    # --- description ---------------------------------------------------------------------

    def describe(self) -> dict:
        c = self.model.config
        return {
            "model": self.files.source, "preset": c.preset, "max_length": c.max_length, "device": self.device.type,
            "entities": self.table.num_entities, "added_entities": self.table.num_entities - self.base_entities,
            "titles": self.files.titles_file is not None, "titles_from": self.titles_from,
            "index": self.table.index.describe(),
            "linking_head": "entity_pred" if self.model.entity_pred is not None else "memory",
            "limits": {"max_text_chars": self.config.max_text_chars, "max_top_k": self.config.max_top_k,
                       "max_spans": self.config.max_spans},
        }  # fmt: skip

    def entity(self, entity_id, max_aliases: int = 20) -> dict:
        """What the server knows of one entity: its title, where the title comes from
        ("wikipedia", "synthetic", "added" through /v1/entities, or null: unknown) and its most
        frequent aliases in the training data."""
        self.sync_store()  # an entity another replica added
        if not isinstance(entity_id, int) or not 0 <= entity_id < self.table.num_entities:
            raise RequestError(f"no entity {entity_id}: ids go from 0 to {self.table.num_entities - 1}", 404)
        if entity_id >= self.base_entities:
            return {"entity_id": entity_id, "title": self.titles[entity_id], "source": "added",
                    "aliases": self.added_aliases[entity_id - self.base_entities][:max_aliases]}
        if self._aliases is None:
            self._aliases = read_aliases(self.files.titles_file) or (np.zeros(0, np.int64), [])
        ids, names = self._aliases
        lo, hi = (int(x) for x in np.searchsorted(ids, [entity_id, entity_id + 1]))
        return {"entity_id": entity_id, "title": self.titles[entity_id], "source": self.titles_from,
                "aliases": names[lo:min(hi, lo + max_aliases)].to_pylist() if hi > lo else []}

    # --- validation ----------------------------------------------------------------------

    def check_text(self, text, what: str = "text") -> str:
        if not isinstance(text, str):
            raise RequestError(f"{what} must be a string, got {type(text).__name__}")
        if not text.strip():
            raise RequestError(f"{what} is empty")
        check_encodable(text, what)
        if len(text) > self.config.max_text_chars:
            raise RequestError(f"{what} has {len(text):,} characters; the limit is {self.config.max_text_chars:,}", 413)
        return text

    def check_top_k(self, top_k) -> int:
        if top_k is None:
            return self.config.default_top_k
        if not isinstance(top_k, int) or isinstance(top_k, bool):
            raise RequestError(f"top_k must be an integer, got {type(top_k).__name__}")
        if not 1 <= top_k <= self.config.max_top_k:
            raise RequestError(f"top_k must be between 1 and {self.config.max_top_k}, got {top_k}")
        return top_k

    def link_job(self, text, spans=None, top_k=None) -> LinkJob:
        text = self.check_text(text)
        return LinkJob(text, None if spans is None else parse_spans(spans, text, self.config.max_spans),
                       self.check_top_k(top_k))

    def answer_job(self, question, top_k=None) -> AnswerJob:
        return AnswerJob(self.check_text(question, "question"), self.check_top_k(top_k))

    # --- windows -------------------------------------------------------------------------

    def _windows(self, owner: int, text: str, spans: list[tuple[int, int]] | None) -> list[Window]:
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
        token_spans = None
        if spans is not None:
            token_spans = []
            for s, e in spans:
                covered = [i for i, (a, b) in enumerate(offsets) if b > s and a < e]
                if not covered:
                    raise RequestError(f"span [{s}, {e - s}] covers no word the tokenizer keeps")
                if token_spans and covered[0] <= token_spans[-1][1]:
                    raise RequestError(f"span [{s}, {e - s}] shares a wordpiece with the span before it")
                token_spans.append((covered[0], covered[-1]))
        cut_blocked = set()  # cutting before token i would split a word or a span
        for i in range(1, len(ids)):
            if offsets[i][0] == offsets[i - 1][1]:
                cut_blocked.add(i)
        for s, t in token_spans or []:
            cut_blocked.update(range(s + 1, t + 1))
            if t - s + 1 > self.window:
                raise RequestError(f"a span of {t - s + 1} wordpieces is longer than the model's window of {self.window}")
        windows, start = [], 0
        while start < len(ids) or not windows:
            end = min(start + self.window, len(ids))
            if end < len(ids):
                cut = end
                while cut > start + 1 and cut in cut_blocked:
                    cut -= 1
                end = cut if cut > start + 1 else end
            mine = None
            if token_spans is not None:
                mine = [(s - start + 1, t - start + 1) for s, t in token_spans if start <= s and t < end]
            windows.append(Window(owner, [self.tokenizer.cls_id, *ids[start:end], self.tokenizer.sep_id],
                                  [None, *offsets[start:end], None], mine))
            start = end
            if start >= len(ids):
                break
        return windows

    def _question_window(self, owner: int, question: str) -> Window:
        enc = self.tokenizer.encode(question, add_special_tokens=False)
        if len(enc.ids) > self.window - 1:
            raise RequestError(f"the question has {len(enc.ids)} wordpieces; the model takes at most {self.window - 1}")
        ids = [self.tokenizer.cls_id, *enc.ids, MASK_TOKEN_ID, self.tokenizer.sep_id]
        return Window(owner, ids, [None, *enc.offsets, None, None], [], answer_at=len(enc.ids) + 1)

    # --- the model -----------------------------------------------------------------------

    def _pad(self, windows: list[Window], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(w.ids) for w in windows)
        ids = torch.full((len(windows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(windows), width), dtype=torch.long)
        for b, w in enumerate(windows):
            ids[b, : len(w.ids)] = torch.tensor(w.ids)
            mask[b, : len(w.ids)] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def _detect(self, windows: list[Window]) -> None:
        """Fill w.spans of question windows with the BIO head's mentions (never on the answer
        position)."""
        m = self.model
        if m.mention_head is None:
            return
        ids, mask = self._pad(windows, m.config.pad_token_id)
        x1 = m.transformer_l0(m.token_embed(ids), mask.bool())
        allowed = m.mention_allowed(ids, mask)
        for b, w in enumerate(windows):
            allowed[b, w.answer_at] = False
        tags = bio.decode_bio(m.mention_head(x1), allowed)
        found = bio.tags_to_mentions(tags)
        mentions = list(zip(found.batch_ids.tolist(), found.starts.tolist(), found.ends.tolist()))
        for b, w in enumerate(windows):
            w.spans = [(s, t) for i, s, t in mentions if i == b]

    @torch.no_grad()
    def _run(self, windows: list[Window], given: bool, retrieve_k: int) -> list[list[dict]]:
        """One forward pass over `windows`: per window, its mentions as dicts with wordpiece
        span, mention-detection confidence and candidates (ids, scores, logits)."""
        m = self.model
        ids, mask = self._pad(windows, m.config.pad_token_id)
        spans = None
        if given:
            lists = [list(w.spans) + ([(w.answer_at, w.answer_at)] if w.answer_at is not None else []) for w in windows]
            spans = Mentions.from_lists([sorted(s) for s in lists]).to(self.device)
        out = m(ids, mask, mentions=spans)
        found = out.mentions
        queries = out.entity_queries if out.entity_queries is not None else out.memory.pseudo_embeddings
        logits, entity_ids = self.table.top_k(queries, retrieve_k)
        probs = torch.softmax(logits.masked_fill(entity_ids < 0, float("-inf")), -1).nan_to_num(0.0)
        logits, entity_ids, probs = logits.cpu(), entity_ids.cpu(), probs.cpu()  # one copy, not one per item
        spans_found = list(zip(found.batch_ids.tolist(), found.starts.tolist(), found.ends.tolist()))
        md_conf = self._mention_confidence(out.bio_logits, spans_found)
        per_window: list[list[dict]] = [[] for _ in windows]
        for i, (b, s, t) in enumerate(spans_found):
            keep = entity_ids[i] >= 0
            per_window[b].append({
                "span": (s, t), "md_conf": md_conf[i],
                "ids": entity_ids[i][keep].tolist(), "scores": probs[i][keep].tolist(), "logits": logits[i][keep].tolist(),
            })  # fmt: skip
        return per_window

    @staticmethod
    def _mention_confidence(bio_logits: torch.Tensor | None, spans: list[tuple[int, int, int]]) -> list[float | None]:
        """Per mention (batch row, start, end): exp(mean log p(tag)) of its B then I tags under the BIO head."""
        if bio_logits is None:
            return [None] * len(spans)
        logp = torch.log_softmax(bio_logits.float(), -1).cpu()
        out = []
        for b, s, t in spans:
            total = logp[b, s, bio.B] + logp[b, s + 1 : t + 1, bio.I].sum()
            out.append(math.exp(float(total) / (t - s + 1)))
        return out

    def _candidates(self, mention: dict, top_k: int) -> list[dict]:
        return [{"entity_id": e, "title": self.titles[e] if e < len(self.titles) else None, "score": s}
                for e, s in zip(mention["ids"][:top_k], mention["scores"][:top_k])]

    # --- the API -------------------------------------------------------------------------

    def prepare(self, job: LinkJob | AnswerJob) -> tuple[LinkJob | AnswerJob, list[Window]]:
        """The job's model inputs; refuses (RequestError) what cannot be cut into windows, so
        that a bad request never reaches (and fails) a batch of good ones."""
        if isinstance(job, LinkJob):
            return job, self._windows(0, job.text, job.spans)
        return job, [self._question_window(0, job.question)]

    def run(self, prepared: list[tuple[LinkJob | AnswerJob, list[Window]]]) -> list[dict]:
        """Answer a batch of prepared jobs with as few forward passes as possible (one per
        mode: detected mentions, given spans)."""
        self.sync_store()
        jobs, windows = [], []
        for n, (job, job_windows) in enumerate(prepared):
            jobs.append(job)
            windows += [dataclasses.replace(w, owner=n, spans=None if w.spans is None else list(w.spans))
                        for w in job_windows]
        questions = [w for w in windows if w.answer_at is not None]
        if questions:
            self._detect(questions)
        retrieve_k = max([self.config.retrieve_k, *(j.top_k for j in jobs)])
        results: dict[int, list[dict]] = {}
        for given in (False, True):  # detected mentions, then given spans (and questions)
            group = [w for w in windows if (w.spans is not None) == given]
            if group:
                results.update((id(w), r) for w, r in zip(group, self._run(group, given, retrieve_k)))
        outputs = []
        for n, job in enumerate(jobs):
            mine = [w for w in windows if w.owner == n]
            if isinstance(job, LinkJob):
                mentions = [self._mention(job.text, w, r, job.top_k) for w in mine for r in results[id(w)]]
                outputs.append({"text": job.text, "mentions": sorted(mentions, key=lambda x: x["start"])})
            else:
                outputs.append(self._answer(job, mine[0], results[id(mine[0])]))
        return outputs

    def link(self, text, spans=None, top_k=None) -> dict:
        """One text, unbatched: the /v1/link answer."""
        return self.run([self.prepare(self.link_job(text, spans, top_k))])[0]

    def answer(self, question, top_k=None) -> dict:
        return self.run([self.prepare(self.answer_job(question, top_k))])[0]

    def _mention(self, text: str, w: Window, r: dict, top_k: int) -> dict:
        s, t = r["span"]
        start, end = w.offsets[s][0], w.offsets[t][1]
        candidates = self._candidates(r, top_k)
        best = candidates[0] if candidates else {"entity_id": None, "title": None, "score": None}
        return {"start": start, "end": end, "text": text[start:end], **best,
                "md_conf": r["md_conf"], "candidates": candidates}

    def _answer(self, job: AnswerJob, w: Window, found: list[dict]) -> dict:
        answer = next(r for r in found if r["span"] == (w.answer_at, w.answer_at))
        linked = [self._mention(job.question, w, r, 1) for r in found if r is not answer]
        for item in linked:
            del item["candidates"]
        return {"question": job.question, "answers": self._candidates(answer, job.top_k), "question_entities": linked}

    # --- new entities --------------------------------------------------------------------

    def embed_entity(self, contexts: list[tuple[str, list[tuple[int, int]]]]) -> torch.Tensor:
        """The direction of the entity's example mentions' queries (the mean of the unit
        queries), [d], with norm new_entity_norm x the trained rows' mean norm (scores are dot
        products: the norm sets how often it wins)."""
        windows = []
        for n, (text, spans) in enumerate(contexts):
            windows += [w for w in self._windows(n, text, spans) if w.spans]
        if not windows:
            raise RequestError("no example mention fits the model's window")
        m = self.model
        ids, mask = self._pad(windows, m.config.pad_token_id)
        with torch.no_grad():
            out = m(ids, mask, mentions=Mentions.from_lists([w.spans for w in windows]).to(self.device))
        source = self.config.embed_source
        if source == "entity_pred" and out.entity_queries is None:
            source = "memory"
        parts = []
        if source in ("entity_pred", "both"):
            parts.append(out.entity_queries)
        if source in ("memory", "both"):
            parts.append(out.memory.pseudo_embeddings)
        vectors = torch.cat([p / p.norm(dim=-1, keepdim=True).clamp(min=1e-12) for p in parts])
        mean = vectors.mean(0)
        return mean / mean.norm().clamp(min=1e-12) * self.row_norm * self.config.new_entity_norm

    def add_entities(self, entities: list[dict], save: bool | None = None) -> list[dict]:
        """entities: [{"title": str, "contexts": [str | {"text": str, "spans": [[start, length]]}]}].
        A context given as a string has its mentions found by the title's (or the "aliases")
        occurrences. Returns [{"entity_id", "title", "mentions"}]. save: write to the entity
        store (default: when one is configured)."""
        if not isinstance(entities, list) or not entities:
            raise RequestError("entities must be a non-empty list")
        store = self.config.entity_store
        save = bool(store) if save is None else save
        if save and not store:
            raise RequestError("save: this server has no entity store configured (entity_store / --entity-store)")
        if store and not save:
            # The store numbers added entities for every replica (row i is entity base + i): an
            # unsaved one takes an id the store gives to the next saved entity, which this replica
            # then never loads, and its own next save writes the unsaved one over it.
            raise RequestError("save: false is refused while an entity store is configured: the store numbers "
                               "added entities for every replica (omit save, or serve without a store)")
        seen = set()
        prepared = []
        for i, item in enumerate(entities):
            if not isinstance(item, dict):
                raise RequestError(f"entity {i}: expected an object with title and contexts")
            title = item.get("title")
            if not isinstance(title, str) or not title.strip():
                raise RequestError(f"entity {i}: title must be a non-empty string")
            check_encodable(title, f"entity {i}: title")
            if title in seen:
                raise RequestError(f"entity {i}: {title!r} is given twice")
            seen.add(title)
            self._check_new_titles([title])  # early, before the model runs (again under the lock)
            aliases = item.get("aliases") or []
            if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
                raise RequestError(f"entity {i}: aliases must be a list of non-empty strings")
            for alias in aliases:
                check_encodable(alias, f"entity {i}: alias")
            contexts = item.get("contexts")
            if not isinstance(contexts, list) or not contexts:
                raise RequestError(f"entity {i}: contexts must be a non-empty list")
            if len(contexts) > self.config.max_contexts:
                raise RequestError(f"entity {i}: {len(contexts)} contexts, at most {self.config.max_contexts}")
            parsed = [self._context(i, j, c, [title, *aliases]) for j, c in enumerate(contexts)]
            prepared.append((title, parsed, aliases))
        rows = torch.stack([self.embed_entity(parsed) for _, parsed, _ in prepared])
        titles, aliases = [t for t, _, _ in prepared], [a for _, _, a in prepared]
        if save:
            # Replicas share the store: under its lock, take what others added first (ids are
            # positions in the store), then append ours and write it back.
            with self._store_lock():
                self.sync_store()
                self._check_new_titles(titles)
                ids = self._append(rows, titles, aliases)
                self._save_store()
        else:
            self._check_new_titles(titles)
            ids = self._append(rows, titles, aliases)
        return [{"entity_id": e, "title": t, "mentions": sum(len(s) for _, s in parsed)}
                for e, (t, parsed, _) in zip(ids, prepared)]

    def _context(self, i: int, j: int, context, names: list[str]) -> tuple[str, list[tuple[int, int]]]:
        where = f"entity {i}, context {j}"
        if isinstance(context, str):
            text = self.check_text(context, where)
            lowered, spans = text.lower(), []
            for name in sorted(names, key=len, reverse=True):
                at = lowered.find(name.lower())
                while at >= 0:
                    if all(at + len(name) <= s or at >= e for s, e in spans):
                        spans.append((at, at + len(name)))
                    at = lowered.find(name.lower(), at + 1)
            if not spans:
                raise RequestError(f"{where}: the text never names {names[0]!r} (give spans or aliases)")
            return text, sorted(spans)
        if isinstance(context, dict):
            text = self.check_text(context.get("text"), f"{where}: text")
            if context.get("spans") is None:
                raise RequestError(f"{where}: spans are required with a text object")
            return text, parse_spans(context["spans"], text, self.config.max_spans)
        raise RequestError(f"{where}: expected a string or {{\"text\", \"spans\"}}")

    def _check_new_titles(self, titles: list[str]) -> None:
        for title in titles:
            if title in self.title_ids:
                raise RequestError(f"{title!r} exists already (id {self.title_ids[title]})", 409)

    @contextlib.contextmanager
    def _store_lock(self):
        import fcntl

        store = Path(self.config.entity_store)
        store.mkdir(parents=True, exist_ok=True)
        with open(store / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _append(self, rows: torch.Tensor, titles: list[str], aliases: list[list[str]]) -> list[int]:
        ids = self.table.add_rows(rows)
        self.added_aliases.extend(aliases)
        for e, t in zip(ids, titles):
            self.titles.append(t)
            self.title_ids[t] = e
        return ids

    # --- the entity store ----------------------------------------------------------------

    def _save_store(self) -> None:
        from safetensors.torch import save_file

        store = Path(self.config.entity_store)
        store.mkdir(parents=True, exist_ok=True)
        added = self.table.weight[self.base_entities :].cpu().contiguous()
        meta = {"base_entities": self.base_entities, "dim": int(added.shape[1]), "model": self.files.source,
                "titles": self.titles[self.base_entities :], "aliases": self.added_aliases, "saved_at": time.time()}
        # Rows first, then the JSON that names them; both by rename, so a reader never sees half.
        tmp = store / f".{STORE_ROWS}.{os.getpid()}"
        save_file({"embeddings": added}, str(tmp))
        os.replace(tmp, store / STORE_ROWS)
        tmp = store / f".{STORE_JSON}.{os.getpid()}"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, store / STORE_JSON)
        self._store_stamp = (store / STORE_JSON).stat().st_mtime_ns

    def sync_store(self) -> None:
        """Load entities other replicas (or an earlier run) saved that this one lacks. Append-only:
        row i of the store is entity base_entities + i everywhere."""
        if not self.config.entity_store:
            return
        store = Path(self.config.entity_store)
        meta_path = store / STORE_JSON
        try:
            stamp = meta_path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if stamp == self._store_stamp:
            return
        from safetensors.torch import load_file

        meta = json.loads(meta_path.read_text())
        if meta["base_entities"] != self.base_entities or meta["dim"] != self.table.weight.shape[1]:
            raise ValueError(f"entity store {store} was made for a table of {meta['base_entities']} x {meta['dim']}, "
                             f"this model has {self.base_entities} x {self.table.weight.shape[1]}")
        rows = load_file(str(store / STORE_ROWS))["embeddings"]
        have = self.table.num_entities - self.base_entities
        if rows.shape[0] > have:
            # A title with a lone surrogate, saved before check_encodable refused them, failed
            # every response naming it: loaded with U+FFFD in its place, as a UTF-8 decoder would.
            titles = [re.sub("[\ud800-\udfff]", "\ufffd", t) for t in meta["titles"][have:]]
            aliases = meta.get("aliases") or [[] for _ in meta["titles"]]  # a store saved before aliases were kept
            self._append(rows[have:], titles, aliases[have:])
        self._store_stamp = stamp
