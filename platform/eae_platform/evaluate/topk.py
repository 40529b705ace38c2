"""Top-K retrieval at inference (paper Table 7): one trained model, evaluated with the
memory reading only the K best entities (K = 1, 10, 100, all), on masked hyperlink
prediction (entity accuracy, token accuracy, perplexity) and, given a QA model and dataset,
QA exact match. Logged as `topk/<K>/<metric>`, the names `eae compare` reads.

Models without an entity memory (No-EaE, MM) do not depend on K: every K gives the same
numbers, which is itself a check.
"""

from __future__ import annotations

from eae_platform.finetune.compare import topk_key


def run(config) -> dict:
    from eae_platform.evaluate.common import device, load, tracker
    from eae_platform.evaluate.masked import evaluate_split

    dev = device()
    ks = config.k_values()
    model, _ = load(config.model, config.mlflow_uri, dev)
    metrics: dict[str, float] = {}
    for label, k in ks:
        m = evaluate_split(model, config.data, config.split, dev, config.batch_size, config.seed, config.mask_rate,
                           config.max_batches, k=k, mask_draws=config.mask_draws)
        for name in ("entity_accuracy", "token_accuracy", "perplexity"):
            if name in m:
                metrics[topk_key(label, name)] = m[name]
    counts = {"data/masked_tokens": m["tokens"], "data/masked_entities": m["entities"]}
    if config.qa_data:
        metrics.update(qa_em_by_k(config, ks, dev))
        counts["data/qa_questions"] = metrics.pop("_questions")
    del model
    with tracker(config, {"eae.model": config.model}) as t:
        t.log_metrics({**metrics, **counts}, step=0)
        run_id = t.run_id
    return {"metrics": metrics, "counts": counts, "run_id": run_id}


def qa_em_by_k(config, ks, dev) -> dict[str, float]:
    """QA EM of the QA model (config.qa_model, else config.model) on config.split of
    config.qa_data for every K (QATask.evaluate's k)."""
    from eae_platform.evaluate.common import load
    from eae_platform.finetune.config import FinetuneConfig
    from eae_platform.finetune.qa import QATask

    model, vocab_dir = load(config.qa_model or config.model, config.mlflow_uri, dev)
    if model.entity_pred is None:
        raise ValueError("the QA model has no EntityPred head: QA EM needs EaE or No-EaE")
    task = QATask(FinetuneConfig(data=config.qa_data, eval_batch_size=max(config.batch_size, 64)), vocab_dir,
                  model.config.max_length)
    out = {}
    for label, k in ks:
        # QATask.evaluate reads k=None as "the model's k_inference": all entities is k = N,
        # which retrieves every entity, the same softmax as k = None in the model.
        result, _ = task.evaluate(model, config.split, dev, k=k if k is not None else model.config.num_entities)
        out[topk_key(label, "qa_em")] = result["em"]
        out["_questions"] = result["questions"]
    return out
