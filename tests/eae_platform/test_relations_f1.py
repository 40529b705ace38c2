"""TACRED's micro precision, recall and F1 (evaluate.relations.f1_score) on hand-built label
lists: no_relation is never a hit and never a guess or a target; the fractions are worked out
by hand."""

import pytest

from eae_platform.evaluate.relations import NO_RELATION, f1_score

NR = NO_RELATION


def test_no_relation_is_excluded_from_hits_guesses_and_targets():
    """Five examples:
        gold       capital  capital  part_of  part_of  no_relation
        predicted  capital  part_of  part_of  no_rel.  no_relation
        hit        yes      no       yes      no       (not counted: no_relation)
    hits 2, guesses (predicted != no_relation) 3, targets (gold != no_relation) 4:
    P = 2/3, R = 2/4 = 1/2, F1 = 2 P R / (P + R) = (2/3) / (7/6) = 4/7."""
    gold = ["capital", "capital", "part_of", "part_of", NR]
    predicted = ["capital", "part_of", "part_of", NR, NR]
    scores = f1_score(predicted, gold)
    assert scores["precision"] == pytest.approx(2 / 3, abs=1e-12)
    assert scores["recall"] == pytest.approx(1 / 2, abs=1e-12)
    assert scores["f1"] == pytest.approx(4 / 7, abs=1e-12)


def test_a_relation_guessed_for_a_no_relation_pair_costs_precision():
    """gold (NR, NR, capital), predicted (capital, NR, capital): the first is a wrong guess,
    the second agrees on no_relation and counts for nothing. hits 1, guesses 2, targets 1:
    P = 1/2, R = 1, F1 = 2 (1/2)(1) / (3/2) = 2/3."""
    scores = f1_score(["capital", NR, "capital"], [NR, NR, "capital"])
    assert scores == pytest.approx({"precision": 1 / 2, "recall": 1.0, "f1": 2 / 3}, abs=1e-12)


def test_all_no_relation_predictions_score_zero():
    """Predicting no_relation everywhere guesses nothing: P = R = F1 = 0 (no 0 / 0), however
    many no_relation pairs it gets right."""
    gold = ["capital", NR, NR, NR, "part_of"]
    assert f1_score([NR] * 5, gold) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert f1_score([NR] * 3, [NR] * 3) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_perfect_predictions_and_wrong_relation_labels():
    """Every related pair right: P = R = F1 = 1. Every related pair given the other relation:
    3 guesses, 3 targets, 0 hits: all 0."""
    gold = ["capital", "part_of", NR, "capital"]
    assert f1_score(list(gold), gold) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    swapped = ["part_of", "capital", NR, "part_of"]
    assert f1_score(swapped, gold) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
