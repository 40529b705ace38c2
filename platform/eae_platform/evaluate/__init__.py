"""The paper's evaluation suite: `eae eval TASK` (one MLflow run per evaluation).

    masked     masked hyperlink prediction on a held-out split (Table 2)     masked.py
    topk       K = 1, 10, 100, all at inference, incl. QA EM (Table 7)        topk.py
    lama       zero-shot cloze probes, token and entity heads (Table 3)      lama.py, probes.py
    typing     entity typing, micro-F1 with a dev threshold (appendix)       entity_typing.py
    relations  relation extraction with entity markers, F1 (Table 9)         relations.py
    analysis   QA accuracy by answer frequency, mentions, length (Fig. 3)   analysis.py
    overlap    prediction overlap and oracle accuracy of two QA runs (T. 8)  analysis.py
"""

from __future__ import annotations

import importlib
import time

MODULES = {"masked": "masked", "topk": "topk", "lama": "lama", "typing": "entity_typing",
           "relations": "relations", "analysis": "analysis", "overlap": "analysis"}


def describe(config) -> str:
    """The line an evaluation starts with: the task, what it evaluates, its data, and its split
    where it reads one (lama, typing and relations read no one split: theirs said "(split test)")."""
    from eae_platform.evaluate.config import SPLIT_TASKS

    what = f"runs {config.runs}" if config.task in ("analysis", "overlap") else f"model {config.model}"
    data = config.data or config.qa_data  # overlap reads no data: only its runs' predictions
    return (f"evaluating {config.task}: {what}" + (f", data {data}" if data else "")
            + (f" (split {config.split})" if config.task in SPLIT_TASKS else ""))


def run(config) -> dict:
    """Run config.task; returns its summary ({metrics, run_id, ..., mlflow_unsent})."""
    from eae_platform.evaluate import common
    from eae_platform.progress import say

    module = importlib.import_module(f"eae_platform.evaluate.{MODULES[config.task]}")
    runner = getattr(module, "run_overlap" if config.task == "overlap" else "run")
    say(describe(config))
    started = time.perf_counter()
    common.unsent()  # none of an earlier evaluation in this process
    summary = runner(config)
    say(f"evaluated {config.task} in {time.perf_counter() - started:.1f} s")
    # what its MLflow runs (with eval.memory_off_run, two) could not log, for the command to say
    summary["mlflow_unsent"] = common.unsent()
    return summary
