"""The two per-partition stages of the Wikipedia build. Plain functions (Ray calls them as
tasks in build.py); each writes its output atomically and then a JSON sidecar, whose presence
marks the partition complete so a rerun skips it.

parse_partition: dump partition -> parsed/part-NNNNN.parquet (article text + links) and
    part-NNNNN.json (redirects, link-target and anchor counts, what was skipped and why).
contexts_partition: parsed part + vocabulary -> shards/<split>/part-NNNNN.parquet of
    tokenized contexts with wordpiece-aligned mentions.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from eae_data.aliases import AliasMatcher
from eae_data.contexts import SOURCE_LINK, ContextBuilder, Span
from eae_data.constants import NULL_ENTITY
from eae_data.ner import DEFAULT_MODEL, load_detector, spacy_available
from eae_data.shards import CONTEXT_ID_STRIDE, SCHEMA, write_table_atomic, write_text_atomic
from eae_data.tokenizer import WordPieceTokenizer
from eae_data.wikidump import Partition, iter_pages
from eae_data.wikitext import normalize_title, parse_wikitext

SPLITS = ("train", "dev", "test")
PARSED_SCHEMA = pa.schema(
    [
        ("page_id", pa.int64()),
        ("title", pa.string()),
        ("text", pa.string()),
        ("link_starts", pa.list_(pa.int32())),
        ("link_ends", pa.list_(pa.int32())),
        ("link_targets", pa.list_(pa.string())),
    ]
)


def part_name(index: int) -> str:
    return f"part-{index:05d}"


def read_done(sidecar: Path, settings_key: str | None = None) -> dict | None:
    """The stats of a completed partition, or None when it must be (re)built."""
    if not sidecar.is_file():
        return None
    stats = json.loads(sidecar.read_text())
    if settings_key is not None and stats.get("settings_key") != settings_key:
        return None
    return stats


def parse_partition(partition: Partition, index: int, out_dir: str) -> dict:
    """Stage 1: read and parse one dump partition."""
    parsed = Path(out_dir) / "parsed"
    sidecar = parsed / f"{part_name(index)}.json"
    done = read_done(sidecar)
    if done is not None:
        return done

    read_stats: Counter = Counter()
    skipped_pages: dict[str, list[str]] = {}  # reason -> titles; the reader adds its own losses
    skipped_links: Counter = Counter()
    skipped_link_pages: dict[str, Counter] = {}
    redirects: dict[str, str] = {}
    target_counts: Counter = Counter()
    anchor_counts: Counter = Counter()
    counts = Counter()
    rows: dict[str, list] = {name: [] for name in PARSED_SCHEMA.names}

    def skip_page(reason: str, title: str) -> None:
        skipped_pages.setdefault(reason, []).append(title)

    for page in iter_pages(partition, read_stats, skipped_pages):
        counts["pages"] += 1
        if page.redirect is not None:
            source, target = normalize_title(page.title), normalize_title(page.redirect)
            if page.ns != 0:
                skip_page("non_article_redirect", page.title)
            elif source is None or target is None:
                skip_page("redirect_to_empty_title", page.title)
            else:
                redirects[source] = target
                counts["redirects"] += 1
            continue
        if page.ns != 0:
            skip_page("non_article_namespace", page.title)
            continue
        parsed_page = parse_wikitext(page.text)
        if not parsed_page.text.strip():
            skip_page("empty_page", page.title)
            continue
        counts["articles"] += 1
        counts["links"] += len(parsed_page.links)
        for reason, n in parsed_page.skipped.items():
            skipped_links[reason] += n
            skipped_link_pages.setdefault(reason, Counter())[page.title] += n
        title = normalize_title(page.title) or page.title
        rows["page_id"].append(page.page_id)
        rows["title"].append(title)
        rows["text"].append(parsed_page.text)
        rows["link_starts"].append([link.start for link in parsed_page.links])
        rows["link_ends"].append([link.end for link in parsed_page.links])
        rows["link_targets"].append([link.target for link in parsed_page.links])
        for link in parsed_page.links:
            target_counts[link.target] += 1
            anchor_counts[f"{link.anchor}\t{link.target}"] += 1

    write_table_atomic(pa.table(rows, schema=PARSED_SCHEMA), parsed / f"{part_name(index)}.parquet")
    stats = {
        "partition": index,
        "counts": dict(counts),
        "read": dict(read_stats),
        "skipped_pages": skipped_pages,
        "skipped_links": dict(skipped_links),
        "skipped_link_pages": {r: dict(c) for r, c in skipped_link_pages.items()},
        "redirects": redirects,
        "target_counts": dict(target_counts),
        "anchor_counts": dict(anchor_counts),
    }
    write_text_atomic(json.dumps(stats), sidecar)
    return stats


def split_of(page_id: int, dev_fraction: float, test_fraction: float) -> str:
    """Deterministic split by article: a hash of the page id, uniform in [0, 1)."""
    digest = hashlib.blake2b(str(page_id).encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    return "dev" if u < dev_fraction else "test" if u < dev_fraction + test_fraction else "train"


def contexts_partition(
    index: int,
    out_dir: str,
    entity_ids: dict[str, int],
    redirects: dict[str, str],
    aliases: list[str],
    settings: dict,
) -> dict:
    """Stage 2: contexts of one parsed partition, written as one shard per split."""
    out = Path(out_dir)
    sidecar = out / "shards" / f"{part_name(index)}.json"
    done = read_done(sidecar, settings["key"])
    if done is not None:
        return done

    builder = ContextBuilder(WordPieceTokenizer(), settings["chunk_bytes"], settings["max_length"],
                             settings["paragraph_contexts"])
    matcher = AliasMatcher(aliases) if settings["alias_mentions"] else None
    detector = None  # spaCy NER: "auto" uses it when installed, "none" never, else a model name
    if settings["ner"] != "none" and (settings["ner"] != "auto" or spacy_available()):
        detector = load_detector(DEFAULT_MODEL if settings["ner"] == "auto" else settings["ner"])
    parsed = pq.read_table(out / "parsed" / f"{part_name(index)}.parquet")
    rows = {split: {name: [] for name in SCHEMA.names} for split in SPLITS}
    counts: Counter = Counter()
    for article in parsed.to_pylist():
        spans = []
        for start, end, target in zip(article["link_starts"], article["link_ends"], article["link_targets"]):
            entity = entity_ids.get(redirects.get(target, target), NULL_ENTITY)
            counts["link_mentions_linked" if entity != NULL_ENTITY else "link_mentions_out_of_vocab"] += 1
            spans.append(Span(start, end, entity, SOURCE_LINK))
        if matcher is not None:
            spans += matcher.find(article["text"], spans)
        if detector is not None:
            spans += detector.find(article["text"], spans)
        split = split_of(article["page_id"], settings["dev_fraction"], settings["test_fraction"])
        counts[f"articles_{split}"] += 1
        table = rows[split]
        for chunk, ctx in enumerate(builder.build(article["text"], spans)):
            table["context_id"].append(article["page_id"] * CONTEXT_ID_STRIDE + chunk)
            table["article_id"].append(article["page_id"])
            table["article_title"].append(article["title"])
            table["chunk_index"].append(chunk)
            table["char_offset"].append(ctx.char_offset)
            table["text"].append(ctx.text)
            table["token_ids"].append(ctx.token_ids)
            table["token_starts"].append([s for s, _ in ctx.token_offsets])
            table["token_ends"].append([e for _, e in ctx.token_offsets])
            table["mention_starts"].append(ctx.mention_starts)
            table["mention_ends"].append(ctx.mention_ends)
            table["mention_entity_ids"].append(ctx.mention_entity_ids)
            table["mention_sources"].append(ctx.mention_sources)
            counts[f"contexts_{split}"] += 1
            counts["tokens"] += len(ctx.token_ids)
            for entity, source in zip(ctx.mention_entity_ids, ctx.mention_sources):
                kind = "linked" if entity != NULL_ENTITY else "unlinked"
                counts[f"mentions_{kind}"] += 1
                counts[f"mentions_source_{source}"] += 1
    for split in SPLITS:
        folder = out / "shards" / split
        for stale in folder.glob(f"{part_name(index)}-*.parquet"):  # from a run with other settings
            stale.unlink()
        table = pa.table(rows[split], schema=SCHEMA)
        # Files of at most shard_rows contexts: files are what training workers are dealt.
        for j, offset in enumerate(range(0, max(table.num_rows, 1), settings["shard_rows"])):
            write_table_atomic(table.slice(offset, settings["shard_rows"]), folder / f"{part_name(index)}-{j:04d}.parquet")
    stats = {
        "partition": index,
        "settings_key": settings["key"],
        "counts": dict(counts),
        "skipped_mentions": dict(builder.skipped),
        "truncated_contexts": builder.truncated_contexts,
    }
    write_text_atomic(json.dumps(stats), sidecar)
    return stats
