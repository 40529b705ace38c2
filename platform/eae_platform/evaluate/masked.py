"""Masked hyperlink prediction (paper Table 2) on a held-out split of `eae data build` shards.

The split's contexts are masked as in pretraining (20% of mentions, every token of a chosen
mention replaced by [MASK]; seeded per context, so every model and every K sees the same
masks), the gold mention spans are given, and:

    entity accuracy   EntityPred's top entity == the gold entity, over masked linked mentions
    token accuracy    TokenPred's argmax == the original wordpiece, over masked tokens
    perplexity        exp(mean cross-entropy of TokenPred) over the same tokens

Models without EntityPred (MM) have no entity accuracy.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import pyarrow.parquet as pq
import torch

from eae_data.shards import shard_files
from eae_model.metrics import add_masked_prediction, masked_prediction_metrics
from eae_model.model import EaEModel
from eae_platform import task_stop
from eae_platform.pretrain import data

DEFAULT_K = object()  # the model's own k_inference


def split_batches(data_dir: str, split: str, batch_size: int, seed: int, mask_rate: float, num_entities: int | None,
                  max_batches: int = 0) -> Iterator[data.Batch]:
    """The split's contexts in file order, masked with the evaluation masking seed."""
    files = shard_files(data_dir, split)
    if not files:
        raise FileNotFoundError(f"no {split} shards under {data_dir}/shards/{split}: give an `eae data build` output")
    table = pq.read_table(files, columns=data.COLUMNS)
    n = 0
    for i in range(0, table.num_rows, batch_size):
        if max_batches and n >= max_batches:
            return
        rows = table.slice(i, batch_size).to_pydict()
        rows["context_id"] = np.asarray(rows["context_id"])
        yield data.collate(rows, seed, data.EVAL_EPOCH, mask_rate, num_entities)
        n += 1


@torch.no_grad()
def masked_metrics(model: EaEModel, batches, device: torch.device, k: int | None | object = DEFAULT_K) -> dict[str, float]:
    """entity_accuracy, token_accuracy, perplexity and their counts over `batches`.
    k: the memory's top-k (default: the model's k_inference; None: all entities)."""
    kwargs = {} if k is DEFAULT_K else {"k": k}
    sums: dict[str, float] = defaultdict(float)
    model.eval()
    for batch in batches:
        task_stop.check()  # the command was stopped
        batch = batch.to(device)
        # The spans without their entity ids: the metrics need no loss, and the entity-linking
        # losses are a softmax over all N entities for the memory and for EntityPred, which at
        # 100k entities took ~90% of an H200's time in this loop (benchmarks/bench_eval_shapes.py).
        # The forward's outputs are the same; the metrics read the ids from batch.mentions.
        out = model(batch.input_ids, batch.attention_mask, mentions=batch.mentions.spans(), mlm_labels=batch.mlm_labels,
                    **kwargs)
        add_masked_prediction(sums, model, out, batch.input_ids, batch.mentions, batch.mlm_labels)
    return {"tokens": sums["tokens"], "entities": sums["entities"], **masked_prediction_metrics(sums)}


def evaluate_split(model: EaEModel, data_dir: str, split: str, device: torch.device, batch_size: int = 32,
                   seed: int = 0, mask_rate: float = 0.2, max_batches: int = 0,
                   k: int | None | object = DEFAULT_K, mask_draws: int = 1) -> dict[str, float]:
    """masked_metrics on `split` of `data_dir` (k as in masked_metrics). mask_draws > 1 masks
    the split again with seeds seed + 1, ... and pools the counts: a small held-out split
    then scores most of its mentions instead of a fifth of them."""
    num_entities = model.config.num_entities if model.config.has_entity_table else None
    batches = itertools.chain.from_iterable(
        split_batches(data_dir, split, batch_size, seed + d, mask_rate, num_entities, max_batches)
        for d in range(mask_draws))
    return masked_metrics(model, batches, device, k)


def run(config) -> dict:
    """`eae eval masked`: Table 2's metrics of `config.model` on `config.split` of `config.data`,
    logged as `<split>/entity_accuracy`, `<split>/token_accuracy`, `<split>/perplexity`."""
    from eae_platform.evaluate.common import device, load, tracker

    dev = device()
    model, _ = load(config.model, config.mlflow_uri, dev, config.memory_off)
    metrics = evaluate_split(model, config.data, config.split, dev, config.batch_size, config.seed, config.mask_rate,
                             config.max_batches, mask_draws=config.mask_draws)
    if not metrics["tokens"]:
        raise ValueError(f"the {config.split} split of {config.data} has no masked token (too few mentions?)")
    logged = {f"{config.split}/{name}": value for name, value in metrics.items()}
    with tracker(config, {"eae.model": config.model}, model.config) as t:
        t.log_metrics(logged, step=0)
        run_id = t.run_id
    return {"metrics": logged, "run_id": run_id}
