"""The masked-prediction metrics (paper Table 2) of eae_model/metrics.py on tiny hand-built
batches: a real EaEModel whose entity table is a hand-chosen matrix, and model outputs whose
entity queries and token logits are set by hand, so every top-1 entity, every argmax token and
every token's log-probability is known without running the code under test. The expected
values are written out as the arithmetic that gives them."""

import math
from collections import defaultdict

import pytest
import torch

from eae_data.constants import CLS_TOKEN_ID, MASK_TOKEN_ID, NULL_ENTITY, SEP_TOKEN_ID
from eae_model.config import load_config
from eae_model.mentions import Mentions
from eae_model.metrics import add_masked_prediction, masked_prediction_metrics
from eae_model.model import IGNORE, EaEModel, EaEOutput

CLS, SEP, MASK = CLS_TOKEN_ID, SEP_TOKEN_ID, MASK_TOKEN_ID
# The entity table E, 8 x 4: entity j < 4 is the unit vector u_j, entity j >= 4 is -u_{j-4}.
# A query q = u_j scores 1 with entity j, 0 with the other unit vectors' entities and -1 with
# entity j + 4: its top-1 is j. A query -u_j has top-1 j + 4 by the same argument.
E = torch.cat([torch.eye(4), -torch.eye(4)])
LOG = math.log


def query_for(entity):
    """A query whose top-1 entity under E is `entity` (by hand, see E)."""
    return E[entity].clone()


@pytest.fixture(scope="module")
def model():
    m = EaEModel(load_config("tiny", overrides=["num_entities=8", "entity_dim=4"])).eval()
    m.set_entity_embeddings(E)
    assert m.config.mask_token_id == MASK
    return m


def output(mentions, queries=None, positions=None, logits=None, batch=2, length=6):
    """The model output add_masked_prediction reads: EntityPred's h' of every mention, and the
    masked positions with TokenPred's logits there (x1 and x4 are not read)."""
    x = torch.zeros(batch, length, 4)
    pos = None
    if positions is not None:
        pos = tuple(torch.tensor([bp[i] for bp in positions], dtype=torch.long) for i in (0, 1))
    q = None if queries is None else torch.stack([query_for(e) for e in queries])
    return EaEOutput(x1=x, x4=x, mentions=mentions, entity_queries=q, mlm_positions=pos, mlm_logits=logits)


def labels_at(positions, targets, batch=2, length=6):
    """mlm_labels: the target token at each masked position, IGNORE elsewhere."""
    labels = torch.full((batch, length), IGNORE)
    for (b, p), t in zip(positions, targets):
        labels[b, p] = t
    return labels


def log_probs(*probs, shift=5.0):
    """Logits whose softmax is exactly `probs` (each row sums to 1): log p plus a constant, which
    softmax ignores (so a metric that read raw logits as log-probabilities would be off)."""
    return torch.tensor([[LOG(p) + shift for p in row] for row in probs])


def run(model, ids, mentions, out, labels, sums=None):
    sums = defaultdict(float) if sums is None else sums
    add_masked_prediction(sums, model, out, torch.tensor(ids), mentions, labels)
    return sums


# ---- entity accuracy ---------------------------------------------------------------------


def test_visible_linked_mention_is_not_scored_even_when_right(model):
    """Only masked mentions (first token [MASK]) are scored: a visible linked mention whose
    top-1 is right must not count. Context 0: mention (1, 2) is masked, linked to 1, predicted
    5 (wrong); mention (3, 4) is visible (first token 7), linked to 2, predicted 2 (right).
    Scored: the masked one only, so entity accuracy 0 / 1 = 0 (it would be 1 / 2 if the
    visible one were scored)."""
    ids = [[CLS, MASK, MASK, 7, 8, SEP]]
    mentions = Mentions.from_lists([[(1, 2), (3, 4)]], [[1, 2]])
    out = output(mentions, queries=[5, 2], batch=1)
    sums = run(model, ids, mentions, out, labels_at([], [], batch=1))
    assert sums["entities"] == 1 and sums["entity_correct"] == 0
    assert masked_prediction_metrics(sums) == {"entity_accuracy": 0.0}


def test_visible_mention_with_a_masked_inner_token_is_not_scored(model):
    """'Masked' is decided by the mention's first token: a mention (2, 3) whose first token is
    visible and second is [MASK] is not scored. Masked mention (1, 1) -> entity 3, predicted 3:
    accuracy 1 / 1."""
    ids = [[CLS, MASK, 9, MASK, SEP, 0]]
    mentions = Mentions.from_lists([[(1, 1), (2, 3)]], [[3, 0]])
    out = output(mentions, queries=[3, 6], batch=1)  # the second is wrong (6 != 0): would give 1/2
    sums = run(model, ids, mentions, out, labels_at([], [], batch=1))
    assert (sums["entity_correct"], sums["entities"]) == (1, 1)
    assert masked_prediction_metrics(sums) == {"entity_accuracy": 1.0}


def test_masked_unlinked_mention_is_not_scored(model):
    """A masked mention linked to the null entity is not scored (there is no right answer):
    masked (1, 1) -> 0, predicted 0 (right); masked (3, 3) unlinked, predicted 4.
    Accuracy 1 / 1, not 1 / 2."""
    ids = [[CLS, MASK, 9, MASK, SEP, 0]]
    mentions = Mentions.from_lists([[(1, 1), (3, 3)]], [[0, NULL_ENTITY]])
    out = output(mentions, queries=[0, 4], batch=1)
    sums = run(model, ids, mentions, out, labels_at([], [], batch=1))
    assert (sums["entity_correct"], sums["entities"]) == (1, 1)
    assert masked_prediction_metrics(sums)["entity_accuracy"] == 1.0


def test_masked_linked_mentions_right_and_wrong(model):
    """Two contexts, five mentions, entity ids chosen so that top-1 is known from E:
        ctx 0 (1, 2) masked,  entity 1, top-1 1  -> right
        ctx 0 (3, 4) visible, entity 2, top-1 2  -> not scored
        ctx 1 (1, 1) masked,  entity 3, top-1 7  -> wrong
        ctx 1 (3, 3) masked,  unlinked, top-1 0  -> not scored
        ctx 1 (4, 4) masked,  entity 6, top-1 6  -> right
    entity accuracy = 2 / 3 (with the visible one it would be 3 / 4, with the unlinked 2 / 4)."""
    ids = [[CLS, MASK, MASK, 7, 8, SEP], [CLS, MASK, 9, MASK, MASK, SEP]]
    mentions = Mentions.from_lists([[(1, 2), (3, 4)], [(1, 1), (3, 3), (4, 4)]], [[1, 2], [3, NULL_ENTITY, 6]])
    out = output(mentions, queries=[1, 2, 7, 0, 6])
    sums = run(model, ids, mentions, out, labels_at([], []))
    assert (sums["entity_correct"], sums["entities"]) == (2, 3)
    assert masked_prediction_metrics(sums) == {"entity_accuracy": pytest.approx(2 / 3, abs=1e-12)}


def test_no_masked_linked_mention_gives_no_entity_accuracy(model):
    """Mentions exist but none is both masked and linked (one visible and linked, one masked
    and unlinked): 0 scored mentions, and no entity_accuracy key rather than 0 / 0."""
    ids = [[CLS, MASK, 9, 7, SEP, 0]]
    mentions = Mentions.from_lists([[(1, 1), (3, 3)]], [[NULL_ENTITY, 2]])
    out = output(mentions, queries=[0, 2], batch=1)
    sums = run(model, ids, mentions, out, labels_at([], [], batch=1))
    assert sums["entities"] == 0 and sums["entity_correct"] == 0
    assert "entity_accuracy" not in masked_prediction_metrics(sums)


# ---- token accuracy and perplexity --------------------------------------------------------


def test_token_accuracy_and_perplexity_over_masked_tokens(model):
    """Four masked tokens over a 4-token vocabulary, each row's softmax set exactly:
        (0, 1) p = (1/2, 1/4, 1/8, 1/8), target 0: NLL log 2, argmax 0 right
        (0, 2) p = (1/8, 1/2, 1/4, 1/8), target 1: NLL log 2, argmax 1 right
        (1, 1) p = (1/2, 1/4, 1/8, 1/8), target 3: NLL log 8, argmax 0 wrong
        (1, 3) p = (1/4, 1/8, 1/8, 1/2), target 2: NLL log 8, argmax 3 wrong
    token accuracy = 2 / 4; mean NLL = (log 2 + log 2 + log 8 + log 8) / 4 = 8 log 2 / 4 = 2 log 2,
    so perplexity = exp(2 log 2) = 4."""
    ids = [[CLS, MASK, MASK, 7, SEP, 0], [CLS, MASK, 9, MASK, SEP, 0]]
    positions = [(0, 1), (0, 2), (1, 1), (1, 3)]
    logits = log_probs((1 / 2, 1 / 4, 1 / 8, 1 / 8), (1 / 8, 1 / 2, 1 / 4, 1 / 8),
                       (1 / 2, 1 / 4, 1 / 8, 1 / 8), (1 / 4, 1 / 8, 1 / 8, 1 / 2))
    labels = labels_at(positions, [0, 1, 3, 2])
    sums = run(model, ids, Mentions.empty(), output(Mentions.empty(), positions=positions, logits=logits), labels)
    assert sums["tokens"] == 4 and sums["token_correct"] == 2
    assert sums["token_nll"] == pytest.approx(2 * LOG(2) + 2 * LOG(8), rel=1e-6)
    metrics = masked_prediction_metrics(sums)
    assert metrics == {"token_accuracy": 0.5, "perplexity": pytest.approx(4.0, rel=1e-6)}


def test_sums_over_two_batches_add_up(model):
    """The function accumulates into the dict, so metrics are pooled over batches, not averaged
    per batch. Batch 1: masked linked mentions right, wrong (1 / 2); masked tokens with NLL
    log 2 (right) and log 4 (wrong). Batch 2: one masked linked mention, right (1 / 1); one
    masked token with NLL log 2 (right).
    Pooled: entity accuracy (1 + 1) / (2 + 1) = 2 / 3 (the mean of per-batch 1/2 and 1 is 3/4);
    token accuracy (1 + 1) / (2 + 1) = 2 / 3; mean NLL (log 2 + log 4 + log 2) / 3 = 4 log 2 / 3,
    perplexity 2 ** (4 / 3)."""
    sums = defaultdict(float)
    ids1 = [[CLS, MASK, 7, MASK, SEP, 0]]
    m1 = Mentions.from_lists([[(1, 1), (3, 3)]], [[2, 3]])
    pos1 = [(0, 1), (0, 3)]
    logits1 = log_probs((1 / 2, 1 / 4, 1 / 4), (1 / 4, 1 / 2, 1 / 4))
    run(model, ids1, m1, output(m1, queries=[2, 1], positions=pos1, logits=logits1, batch=1),
        labels_at(pos1, [0, 2], batch=1), sums)
    assert (sums["entity_correct"], sums["entities"], sums["token_correct"], sums["tokens"]) == (1, 2, 1, 2)
    ids2 = [[CLS, 9, MASK, SEP, 0, 0]]
    m2 = Mentions.from_lists([[(2, 2)]], [[5]])
    pos2 = [(0, 2)]
    run(model, ids2, m2, output(m2, queries=[5], positions=pos2, logits=log_probs((1 / 4, 1 / 4, 1 / 2)), batch=1),
        labels_at(pos2, [2], batch=1), sums)
    assert (sums["entity_correct"], sums["entities"], sums["token_correct"], sums["tokens"]) == (2, 3, 2, 3)
    assert sums["token_nll"] == pytest.approx(LOG(2) + LOG(4) + LOG(2), rel=1e-6)
    metrics = masked_prediction_metrics(sums)
    assert metrics["entity_accuracy"] == pytest.approx(2 / 3, abs=1e-12)
    assert metrics["token_accuracy"] == pytest.approx(2 / 3, abs=1e-12)
    assert metrics["perplexity"] == pytest.approx(2 ** (4 / 3), rel=1e-6)


def test_perplexity_is_clamped_at_exp_50(model):
    """One masked token whose target has logit -100 against 0: NLL = log(1 + e^100) = 100 (to
    float precision), above the 50-nat clamp, so perplexity is exp(50), not exp(100)."""
    ids = [[CLS, MASK, SEP, 0, 0, 0]]
    positions = [(0, 1)]
    sums = run(model, ids, Mentions.empty(),
               output(Mentions.empty(), positions=positions, logits=torch.tensor([[0.0, -100.0]]), batch=1),
               labels_at(positions, [1], batch=1))
    assert sums["token_nll"] == pytest.approx(100.0, rel=1e-6)
    assert masked_prediction_metrics(sums) == {"token_accuracy": 0.0, "perplexity": pytest.approx(math.exp(50.0))}
    # below the clamp nothing changes: mean NLL 40 -> exp(40)
    below = masked_prediction_metrics({"token_nll": 80.0, "token_correct": 1.0, "tokens": 2.0})
    assert below == {"token_accuracy": 0.5, "perplexity": pytest.approx(math.exp(40.0))}


def test_no_masked_tokens_gives_no_token_metrics(model):
    """A batch with no masked token (empty logits) adds no tokens, and the metrics then have
    neither token_accuracy nor perplexity (not 0 / 0), while entity accuracy is still given
    (one masked linked mention, right: 1 / 1)."""
    ids = [[CLS, MASK, 7, SEP, 0, 0]]
    mentions = Mentions.from_lists([[(1, 1)]], [[4]])
    out = output(mentions, queries=[4], positions=[], logits=torch.zeros(0, 5), batch=1)
    sums = run(model, ids, mentions, out, labels_at([], [], batch=1))
    assert sums["tokens"] == 0
    assert masked_prediction_metrics(sums) == {"entity_accuracy": 1.0}


def test_metrics_of_empty_sums():
    """Nothing scored at all: no metric (and no division by zero)."""
    assert masked_prediction_metrics(defaultdict(float)) == {}
    assert masked_prediction_metrics({"token_nll": 0.0, "token_correct": 0.0, "tokens": 0.0,
                                      "entity_correct": 0.0, "entities": 0.0}) == {}
