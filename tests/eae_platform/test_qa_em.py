"""QA exact match and its oracle (finetune.qa.QATask) on a hand-built dataset: a four-entity
vocabulary, six dev questions, and a real tiny EaEModel whose weights are set by hand so that
its top entity at every answer position is known (Paris). Which questions are right, and the
EM and oracle fractions, are worked out by hand; unresolved dev questions count against EM."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from eae_model.config import load_config
from eae_model.model import EaEModel
from eae_platform.finetune.config import load_finetune_config
from eae_platform.finetune.qa import QATask

TITLES = ["Paris", "River Thames", "France", "The Beatles"]
# (question, answer, aliases, split): the model predicts Paris (entity 0) for each.
QUESTIONS = [
    ("Which city is the capital of France?", "Paris", [], "train"),
    ("Where is the lost city?", "Atlantis", [], "train"),  # unresolved: dropped from train
    ("What is the capital of France?", "Paris", [], "dev"),  # title: right
    ("Which city is called the City of Light?", "the city of light", [], "dev"),  # normalised alias: right
    ("Where is the Louvre?", "Atlantis", ["Paris, France"], "dev"),  # the second alias, a redirect: right
    ("Which river flows through London?", "River Thames", [], "dev"),  # resolves to 1: wrong
    ("Where is the lost city?", "Atlantis", [], "dev"),  # unresolved: wrong
    ("Where is the city of gold?", "El Dorado", ["Eldorado"], "dev"),  # unresolved: wrong
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qa-em")
    (tmp / "world").mkdir()
    (tmp / "world" / "questions.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "question": q, "answer": a, "answer_aliases": aliases, "split": split}) + "\n"
        for i, (q, a, aliases, split) in enumerate(QUESTIONS)))
    pq.write_table(pa.table({"entity_id": [0, 1, 2, 3], "title": TITLES, "count": [9, 5, 4, 3]}),
                   tmp / "entities.parquet")
    pq.write_table(pa.table({"alias": ["Thames", "City of Light"], "entity_id": [1, 0], "count": [7, 2]}),
                   tmp / "aliases.parquet")
    pq.write_table(pa.table({"alias": ["Paris, France"], "title": ["Paris"]}), tmp / "redirects.parquet")
    config = load_finetune_config(None, [], init="unused", data=f"synth:{tmp / 'world'}", mentions="none")
    return QATask(config, tmp, max_length=32)


@pytest.fixture(scope="module")
def paris_model():
    """A tiny EaE whose top entity is Paris at every position, by construction: the last
    layer's output LayerNorm has weight 0 and bias 1, so X4 = 1 everywhere; EntityPred's
    h' = W'_f [x4_s || x4_t] with W'_f's first row 1 / (2 H) and the others 0 is (1, 0, 0, 0);
    E = I scores it (1, 0, 0, 0): entity 0."""
    model = EaEModel(load_config("tiny", overrides=["num_entities=4", "entity_dim=4", "max_length=32"])).eval()
    hidden = model.config.hidden_size
    with torch.no_grad():
        norm = model.transformer_l1.layers[-1].ffn_norm
        norm.weight.zero_()
        norm.bias.fill_(1.0)
        w = model.entity_pred.project_query.weight  # [entity_dim, 2 H]
        w.zero_()
        w[0].fill_(1.0 / (2 * hidden))
    model.set_entity_embeddings(torch.eye(4))
    return model


def test_unresolved_training_questions_are_dropped_but_dev_questions_all_count(task):
    """Train: 2 questions, 1 resolves, the other is dropped. Dev: 6 questions, 4 resolve
    (Paris; the city of light -> Paris; Paris, France -> Paris; River Thames), and all 6 stay:
    oracle = 4 / 6."""
    assert len(task.examples["train"]) == 1 and task.counts["data/train_dropped_unresolved"] == 1
    assert [ex.answer_id for ex in task.examples["dev"]] == [0, 0, 0, 1, None, None]
    assert task.oracle("dev") == pytest.approx(4 / 6, abs=1e-12)
    assert math.isnan(task.oracle("test"))  # no test question: not 0 / 0


def test_exact_match_and_oracle(task, paris_model):
    """The model answers Paris everywhere: right for the title, the normalised alias and the
    redirect (3), wrong for River Thames and the two unresolved questions (3).
    EM = 3 / 6 = 0.5 <= oracle 4 / 6; the unresolved questions are in the denominator."""
    metrics, predictions = task.evaluate(paris_model, "dev", torch.device("cpu"))
    assert [p["prediction"] for p in predictions] == ["Paris"] * 6
    assert all(p["top_k"][0] == ["Paris", 1.0] and p["top_k"][1][1] == 0.0 for p in predictions)
    assert [p["correct"] for p in predictions] == [True, True, True, False, False, False]
    assert metrics["questions"] == 6
    assert metrics["em"] == pytest.approx(3 / 6, abs=1e-12)
    assert metrics["oracle"] == pytest.approx(4 / 6, abs=1e-12)
