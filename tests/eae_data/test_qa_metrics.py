"""What decides a QA exact match, on hand-built cases: the TriviaQA/SQuAD answer normalisation
(`normalize_answer`) and `AnswerResolver.matches`, which finetune.qa's EM counts for the top
entity of each question. The expected strings and verdicts are written out by hand."""

import pytest

from eae_data.qa.examples import normalize_answer
from eae_data.qa.resolve import AnswerResolver


@pytest.mark.parametrize("text, expected", [
    ("Paris", "paris"),  # case
    ("  PARIS,   France!  ", "paris france"),  # punctuation deleted, whitespace collapsed
    ("The Beatles", "beatles"),  # a leading article
    ("An apple a day", "apple day"),  # every whole-word article, anywhere
    ("Theatre Anathema", "theatre anathema"),  # articles inside words stay
    ("U.S.A.", "usa"),  # punctuation is deleted, not replaced by a space
    ("rock-n-roll", "rocknroll"),
    ("Guns N' Roses", "guns n roses"),
    ("The", ""),  # nothing but an article
    ("", ""),
])
def test_normalize_answer(text, expected):
    """Lowercase, punctuation removed, the articles a/an/the removed as whole words, single
    spaces."""
    assert normalize_answer(text) == expected


@pytest.fixture
def resolver():
    """Entities 0 Paris, 1 River Thames, 2 France, 3 The Beatles; the anchor text "Thames"
    links to 1 seven times and to 2 once; "City of Light" links to 0; the redirect
    "Paris, France" points to Paris."""
    return AnswerResolver(
        ["Paris", "River Thames", "France", "The Beatles"],
        aliases=[("Thames", 1, 7), ("City of Light", 0, 2), ("Thames", 2, 1)],
        redirects={"Paris, France": "Paris"},
    )


@pytest.mark.parametrize("entity, answers", [
    (0, ["Paris"]),  # the title, as written
    (0, ["PARIS!"]),  # the title after normalisation (case, punctuation)
    (3, ["beatles"]),  # ... and articles
    (3, ["the Beatles."]),
    (0, ["City of Light"]),  # an anchor-text alias of the entity
    (0, ["the city of light"]),  # the alias after normalisation
    (0, ["Paris, France"]),  # a redirect to the entity's title
    (1, ["Atlantis", "Thames"]),  # any one of the answer's aliases; "Thames" is mostly River Thames
])
def test_exact_match(resolver, entity, answers):
    """A predicted entity is right when its title equals an answer string after
    normalisation, or an answer string resolves to it."""
    assert resolver.matches(entity, answers)


@pytest.mark.parametrize("entity, answers", [
    (2, ["Paris"]),  # a different entity
    (1, ["Paris", "City of Light", "Paris, France"]),  # none of the aliases names it
    (2, ["Thames"]),  # an anchor text resolves to its most frequent entity only (1, not 2)
    (0, ["Paris Hilton"]),  # a longer string is not a match
    (0, ["Atlantis"]),  # an answer outside the vocabulary matches nothing
    (7, ["Paris"]),  # an entity id outside the vocabulary
    (-1, ["Paris"]),
])
def test_wrong_answer(resolver, entity, answers):
    """Anything else is not an exact match."""
    assert not resolver.matches(entity, answers)


def test_a_title_equal_after_normalisation_matches_even_when_the_answer_resolves_elsewhere():
    """Titles "The Who" (0) and "Who" (1) both normalise to "who"; the answer "the who"
    resolves to the first (0), yet entity 1 is an exact match too, because its title equals the
    answer after normalisation. Entity 2 ("Whom") is not."""
    r = AnswerResolver(["The Who", "Who", "Whom"])
    assert r.entity_id("the who") == 0
    assert r.matches(0, ["the who"]) and r.matches(1, ["the who"]) and not r.matches(2, ["the who"])
