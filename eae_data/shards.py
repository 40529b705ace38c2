"""The pretraining data format: Parquet shards of tokenized, entity-linked contexts.

One row per context (~500 bytes of an article, at most 128 wordpieces):

| column               | type          | meaning                                                    |
|----------------------|---------------|------------------------------------------------------------|
| context_id           | int64         | article_id * 100_000 + chunk_index, unique in the corpus   |
| article_id           | int64         | Wikipedia page id                                          |
| article_title        | string        | Wikipedia title                                            |
| chunk_index          | int32         | position of the context in its article                     |
| char_offset          | int64         | where `text` starts in the article's plain text            |
| text                 | string        | the context's plain text                                   |
| token_ids            | list<int32>   | [CLS] wordpieces [SEP], bert-base-uncased ids              |
| token_starts         | list<int32>   | character offset of each wordpiece in `text` (0 for specials) |
| token_ends           | list<int32>   | end offset (exclusive)                                     |
| mention_starts       | list<int32>   | first wordpiece of each mention                            |
| mention_ends         | list<int32>   | last wordpiece (inclusive)                                 |
| mention_entity_ids   | list<int32>   | entity id, or -1 (the null entity) when unlinked           |
| mention_sources      | list<int8>    | 0 hyperlink, 1 alias-table match, 2 NER                    |

Mentions never overlap and are sorted by start. Shards are written atomically (a temporary
file renamed into place), so a file with the final name is always complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CONTEXT_ID_STRIDE = 100_000

SCHEMA = pa.schema(
    [
        ("context_id", pa.int64()),
        ("article_id", pa.int64()),
        ("article_title", pa.string()),
        ("chunk_index", pa.int32()),
        ("char_offset", pa.int64()),
        ("text", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("token_starts", pa.list_(pa.int32())),
        ("token_ends", pa.list_(pa.int32())),
        ("mention_starts", pa.list_(pa.int32())),
        ("mention_ends", pa.list_(pa.int32())),
        ("mention_entity_ids", pa.list_(pa.int32())),
        ("mention_sources", pa.list_(pa.int8())),
    ]
)

# Rows per Parquet row group: small enough for streaming readers to start fast.
ROW_GROUP_SIZE = 2048


def write_table_atomic(table: pa.Table, path: str | Path, row_group_size: int = ROW_GROUP_SIZE) -> None:
    """Write `table` to `path` through a temporary file in the same folder, then rename it:
    a killed writer leaves only a `.tmp` file, never a half shard under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)


def write_text_atomic(text: str, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def shard_files(data_dir: str | Path, split: str) -> list[str]:
    """A split's shard files (shards/<split>/part-*.parquet) that hold rows, in name order."""
    files = sorted(str(p) for p in (Path(data_dir) / "shards" / split).glob("part-*.parquet"))
    return [f for f in files if _rows(f) > 0]


def _rows(file: str) -> int:
    """A shard's row count; a file that is not Parquet (empty, truncated) is refused by name."""
    try:
        return pq.read_metadata(file).num_rows
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{file}: not a readable Parquet shard ({error}); rebuild the data: `eae data build --out` a new directory") from None


def files_for_rank(files: list[str], seed: int, epoch: int, rank: int, world_size: int) -> list[str]:
    """The whole files `rank` of `world_size` reads in `epoch`: a seeded shuffle, dealt round-robin."""
    order = np.random.default_rng([seed, epoch]).permutation(len(files))
    return [files[i] for i in order[rank::world_size]]


def rows_per_rank(files: list[str], seed: int, epoch: int, world_size: int) -> list[int]:
    """Contexts each rank is dealt in this epoch (whole files per rank), by rank."""
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    return [sum(rows[f] for f in files_for_rank(files, seed, epoch, r, world_size)) for r in range(world_size)]
