from eae_data.aliases import AliasMatcher
from eae_data.contexts import SOURCE_ALIAS, Span


def spans_text(text, spans):
    return [text[s.start : s.end] for s in spans]


def test_longest_whole_word_case_sensitive_matches():
    m = AliasMatcher(["New York", "New York City", "York", "Paris"])
    text = "New York City is not Paris; new york is lowercase; Yorkshire is not York."
    found = m.find(text, [])
    assert spans_text(text, found) == ["New York City", "Paris", "York"]
    assert all(s.entity_id == -1 and s.source == SOURCE_ALIAS for s in found)


def test_never_overlaps_existing_mentions():
    m = AliasMatcher(["Abraham Lincoln", "Lincoln"])
    text = "Abraham Lincoln met Lincoln."
    taken = [Span(0, 7, 1)]  # "Abraham" already a link
    assert spans_text(text, m.find(text, taken)) == ["Lincoln", "Lincoln"]
    taken = [Span(8, 15, 1)]  # "Lincoln" of the first name is taken
    assert spans_text(text, m.find(text, taken)) == ["Lincoln"]
    assert m.find(text, taken)[0].start == 20


def test_only_proper_name_aliases():
    m = AliasMatcher(["the", "The", "In", "apple", "X", "1984", "O'Brien", "U.S."])
    assert len(m) == 3  # 1984, O'Brien, U.S.
    text = "In 1984 O'Brien went to the U.S. and ate an apple."
    assert spans_text(text, m.find(text, [])) == ["1984", "O'Brien", "U.S"]


def test_empty_table():
    assert AliasMatcher([]).find("Anything at all", []) == []
