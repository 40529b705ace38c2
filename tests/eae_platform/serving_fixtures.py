"""A small saved EaE model with an entity vocabulary, for the serving tests (random weights:
these tests check the API's behaviour, not linking quality)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eae_model.checkpoint import save_model
from eae_model.config import load_config
from eae_model.model import EaEModel


def title(i: int) -> str:
    return f"Entity number {i}"


def aliases(i: int) -> list[str]:
    """Entity i's aliases in aliases.parquet, most frequent first."""
    return [f"E{i}", f"number {i}"]


def make_model_dir(directory: Path, max_length: int = 64, seed: int = 0, corpus: str | None = "wikipedia",
                   num_entities: int | None = None) -> Path:
    """The tiny preset (512 x 32 entities, or `num_entities` x 32) with `max_length`, saved with
    entities.parquet (its titles said to come from `corpus`, as `eae data build` records it;
    None: not recorded) and aliases.parquet."""
    from eae_platform.preprocess.build import CORPUS_KEY

    torch.manual_seed(seed)
    overrides = [f"max_length={max_length}"] + ([f"num_entities={num_entities}"] if num_entities else [])
    model = EaEModel(load_config("tiny", overrides=overrides))
    save_model(model, directory)
    n = model.config.num_entities
    entities = pa.table({"entity_id": pa.array(range(n), pa.int32()), "title": [title(i) for i in range(n)],
                         "count": pa.array([1] * n, pa.int64())})
    pq.write_table(entities.replace_schema_metadata({CORPUS_KEY: corpus} if corpus else None), directory / "entities.parquet")
    pq.write_table(pa.table({"alias": [a for i in range(n) for a in aliases(i)],
                             "entity_id": pa.array([i for i in range(n) for _ in aliases(i)], pa.int32()),
                             "count": pa.array([c for _ in range(n) for c in (5, 2)], pa.int64())}),
                   directory / "aliases.parquet")
    return directory
