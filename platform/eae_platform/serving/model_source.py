"""Where a served model comes from: `--model MODEL` is one of

  models:/<name>@<alias> (or models:/<name>/<version>)   a registered MLflow model, downloaded
                                                         from `mlflow_uri` (default: tracking_uri())
  DIR with model.safetensors + config.json                `eae pretrain --out DIR`, save_model
  DIR with model.safetensors + state.json                 a Ray Train checkpoint of `eae pretrain`

and its entity titles (id -> Wikipedia title) from, in order: `entities` (an entities.parquet
or the `eae data build` directory holding one), DIR/entities.parquet (what `eae pretrain --out`
copies from its data), the checkpoint's train.data/entities.parquet. Without any, titles are
null and say so in /readyz. Where the titles come from (`titles_corpus`: "wikipedia" or
"synthetic") is in entities.parquet's metadata, else in the manifest.json of its data directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENTITIES_FILE = "entities.parquet"


@dataclass
class ModelFiles:
    model_dir: Path  # a directory eae_model.checkpoint.load_model reads
    titles_file: Path | None  # an entities.parquet (entity_id, title), or None
    source: str  # what was asked for


def resolve(model: str, entities: str | None = None, mlflow_uri: str | None = None,
            cache_dir: str | Path | None = None) -> ModelFiles:
    """MODEL -> local files. Raises ValueError / FileNotFoundError with a clear message."""
    if model.startswith("models:/"):
        from eae_platform.tracking import download_model_dir

        dst = Path(cache_dir) if cache_dir else Path(tempfile.mkdtemp(prefix="eae-serve-"))
        model_dir = download_model_dir(model, dst, uri=mlflow_uri)
        checkpoint_data = None
    else:
        path = _local_path(model)
        model_dir, checkpoint_data = _local_model_dir(path)
    return ModelFiles(model_dir, titles_file(entities, model_dir, checkpoint_data), model)


def check_local(model: str, entities: str | None = None) -> None:
    """resolve's checks of a local model and its titles, without preparing its files (a
    checkpoint's linked directory): `eae serve` makes them before Ray starts."""
    path = _local_path(model)
    config = _checkpoint_config(path)
    titles_file(entities, path, config.get("train", {}).get("data") if config else None)


def _local_path(model: str) -> Path:
    path = Path(model).expanduser()
    expected = "expected models:/name@alias, an `eae pretrain --out` directory or a checkpoint directory"
    if path.is_file():  # "no such directory" for a file that is there sent one looking for a typo
        raise FileNotFoundError(f"model {model!r}: is a file, not a model directory ({expected})")
    if not path.is_dir():
        raise FileNotFoundError(f"model {model!r}: no such directory ({expected})")
    return path


def _checkpoint_config(path: Path) -> dict | None:
    """A Ray Train checkpoint's config (its state.json's); None for a model directory."""
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        return None
    state = path / "state.json"
    if (path / "model.safetensors").is_file() and state.is_file():
        return json.loads(state.read_text())["config"]
    raise FileNotFoundError(f"{path}: neither a model directory (model.safetensors + config.json) "
                            f"nor a pretraining checkpoint (model.safetensors + state.json)")


def _local_model_dir(path: Path) -> tuple[Path, str | None]:
    config = _checkpoint_config(path)
    if config is None:
        return path, None
    # A Ray Train checkpoint: the model config lives in state.json. Link its weights next to a
    # config.json in a fresh directory (the checkpoint itself stays untouched).
    out = Path(tempfile.mkdtemp(prefix="eae-checkpoint-"))
    (out / "config.json").write_text(json.dumps(config["model"]))
    for f in [path / "model.safetensors", *sorted(path.glob("entities-*.safetensors"))]:
        os.symlink(f.resolve(), out / f.name)
    return out, config.get("train", {}).get("data")


def titles_file(entities: str | None, model_dir: Path, checkpoint_data: str | None) -> Path | None:
    """The titles to serve: --entities (checked against the model's own vocabulary where it has
    one), else its directory's, else its checkpoint's data's; None: no titles."""
    own = next((c for c in (model_dir / ENTITIES_FILE, Path(checkpoint_data) / ENTITIES_FILE if checkpoint_data
                            else None) if c is not None and c.is_file()), None)
    if entities:
        p = Path(entities).expanduser()
        p = p / ENTITIES_FILE if p.is_dir() else p
        if not p.is_file():
            raise FileNotFoundError(f"entities {entities!r}: no {ENTITIES_FILE} there")
        if own is not None and own.resolve() != p.resolve():
            check_same_vocabulary(p, own)
        return p
    return own


def check_same_vocabulary(given: Path, own: Path) -> None:
    """`--entities` for a model that has a vocabulary of its own (its directory's, its checkpoint's
    data's) must give its ids the same titles: another data's vocabulary (the gensim sample's for
    a model of a synthetic world) was served, every title silently wrong."""
    import pyarrow.parquet as pq

    a, b = ({i: t for i, t in zip(*pq.read_table(p, columns=["entity_id", "title"]).to_pydict().values())}
            for p in (given, own))
    wrong = next((i for i in sorted(b) if i in a and a[i] != b[i]), None)
    if wrong is not None:
        raise ValueError(f"entities {str(given)!r}: entity {wrong} is {a[wrong]!r} there but {b[wrong]!r} in the "
                         f"model's own vocabulary ({own}): not the data it was trained on (leave --entities out)")


def read_titles(path: Path | None, num_entities: int) -> list[str | None]:
    """Title per entity id 0..num_entities-1 (None where the vocabulary has no such id)."""
    titles: list[str | None] = [None] * num_entities
    if path is None:
        return titles
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["entity_id", "title"])
    for i, title in zip(table.column("entity_id").to_pylist(), table.column("title").to_pylist()):
        if 0 <= i < num_entities:
            titles[i] = title
    return titles


def titles_corpus(path: Path | None) -> str | None:
    """"wikipedia", "synthetic" (a world of `eae data synth`) or None (unknown: a vocabulary
    built before `eae data build` recorded it)."""
    if path is None:
        return None
    import pyarrow.parquet as pq

    from eae_platform.preprocess.build import CORPUS_KEY

    metadata = pq.read_schema(path).metadata or {}
    if CORPUS_KEY.encode() in metadata:
        return metadata[CORPUS_KEY.encode()].decode()
    manifest = Path(path).parent / "manifest.json"
    return json.loads(manifest.read_text()).get("corpus") if manifest.is_file() else None


def read_aliases(path: Path | None):
    """The aliases.parquet beside a titles file as (entity ids, aliases), sorted by entity id
    and, within one, most frequent first; None where there is none."""
    aliases = Path(path).parent / "aliases.parquet" if path is not None else None
    if aliases is None or not aliases.is_file():
        return None
    import pyarrow.parquet as pq

    table = pq.read_table(aliases, columns=["alias", "entity_id", "count"])
    table = table.sort_by([("entity_id", "ascending"), ("count", "descending")])
    return table.column("entity_id").to_numpy(), table.column("alias").combine_chunks()
