"""Deterministic made-up names: syllable words for people and places, English word patterns
for works, suffix patterns for organisations.

Invented names rather than real ones (GeoNames, ...) keep a model's prior knowledge from
pretrained weights or tokenizers out of controlled experiments: nothing about "Dravemouth" is
known before the synthetic corpus says it. Every name is plain ASCII letters, spaces, '-', '.'
and '&', so any WordPiece vocabulary tokenizes it and wikitext needs no escaping ('' and |
never occur).

`Registry` keeps titles and redirect aliases unique across the whole world (case-insensitive,
as MediaWiki folds the first letter and tokenizers are uncased).
"""

from __future__ import annotations

import random

ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r",
          "s", "st", "t", "th", "tr", "v", "w", "z")
# Repeats weight the draws: mostly plain vowels and open syllables, so names stay short.
VOWELS = ("a", "e", "i", "o", "u") * 3 + ("ae", "ai", "ea", "ou")
CODAS = ("",) * 8 + ("l", "n", "r", "s", "m", "nd", "rt", "sk")

FEMININE_ENDINGS = ("a", "ia", "ine", "elle", "ena", "is")
MASCULINE_ENDINGS = ("o", "an", "us", "ek", "er", "im")
SURNAME_SUFFIXES = ("", "", "", "son", "ez", "ini", "ov", "berg", "ski", "ard", "ley", "ens")
CITY_SUFFIXES = ("", "", "", "ton", "ford", "burg", "dale", "mouth", "grad", "polis", "haven")
COUNTRY_SUFFIXES = ("ia", "ia", "land", "stan", "ova", "ar", "ea")
STATE_FORMS = ("Republic of", "Kingdom of", "Federation of", "Commonwealth of", "Grand Duchy of")
# industry -> company name suffixes that fit it
INDUSTRIES = {"software": ("Systems", "Labs", "Software"), "shipping": ("Shipping", "Lines"),
              "mining": ("Mining", "Resources"), "textile": ("Textiles", "Mills"),
              "automotive": ("Motors", "Automotive"), "publishing": ("Press", "Books"),
              "banking": ("Bank", "Capital"), "aerospace": ("Aerospace", "Aviation"),
              "energy": ("Energy", "Power"), "food": ("Foods", "Kitchens"),
              "insurance": ("Insurance", "Assurance"), "electronics": ("Electronics", "Instruments")}
GENERIC_COMPANY_SUFFIXES = ("Group", "Holdings", "Industries", "Works")
WORK_ADJECTIVES = ("silent", "broken", "golden", "hidden", "last", "long", "northern", "distant",
                   "crimson", "quiet", "burning", "hollow", "iron", "endless", "forgotten", "wild",
                   "pale", "bitter", "frozen", "secret", "lonely", "final", "scarlet", "seventh",
                   "dark", "bright", "lost", "velvet", "glass", "winter")
WORK_NOUNS = ("harbour", "garden", "kingdom", "mirror", "road", "house", "crown", "letter",
              "season", "voyage", "shadow", "orchard", "bridge", "tower", "island", "machine",
              "daughter", "stranger", "silence", "storm", "night", "promise", "map", "lantern",
              "river", "station", "summer", "empire", "witness", "frontier")

MAX_ATTEMPTS = 10_000  # name spaces are millions wide; hitting this means a bug, not bad luck


class Registry:
    """Claims surface strings (titles, redirect aliases) so no two entities share one."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def claim(self, name: str) -> bool:
        key = name.lower()
        if key in self._taken:
            return False
        self._taken.add(key)
        return True

    def unique(self, rng: random.Random, make) -> str:
        """Draw `make(rng)` until the name is free, then claim it."""
        for _ in range(MAX_ATTEMPTS):
            name = make(rng)
            if self.claim(name):
                return name
        raise RuntimeError(f"no free name after {MAX_ATTEMPTS} draws")


def word(rng: random.Random, min_syllables: int = 2, max_syllables: int = 3) -> str:
    """A pronounceable capitalised word, e.g. 'Dravem', 'Tousk', 'Velarnio'."""
    n = rng.randint(min_syllables, max_syllables)
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n)).capitalize()


def _join(stem: str, suffix: str) -> str:
    """stem + suffix without a vowel pile-up at the seam: 'Gri' + 'ia' -> 'Gria'."""
    if suffix[:1] in ("a", "e", "i", "o", "u"):
        stem = stem.rstrip("aeiou") or stem
    return stem + suffix


def given_name(rng: random.Random, gender: str) -> str:
    endings = FEMININE_ENDINGS if gender == "female" else MASCULINE_ENDINGS
    return _join(word(rng, 1, 2), rng.choice(endings))


def surname(rng: random.Random) -> str:
    return _join(word(rng, 1, 2), rng.choice(SURNAME_SUFFIXES))


def city_name(rng: random.Random) -> str:
    suffix = rng.choice(CITY_SUFFIXES)
    return _join(word(rng, 1, 2), suffix) if suffix else word(rng)


def country_name(rng: random.Random) -> str:
    return _join(word(rng, 1, 2), rng.choice(COUNTRY_SUFFIXES))


def state_form(rng: random.Random, country: str) -> str:
    """The official long name, e.g. 'Republic of Tarvia'."""
    return f"{rng.choice(STATE_FORMS)} {country}"


def river_name(rng: random.Random) -> str:
    return f"{word(rng, 1, 2)} River"


def company_name(rng: random.Random, industry: str) -> str:
    # Some contain '&' on purpose: the XML writer and the wikitext parser must both handle it.
    if rng.random() < 0.1:
        return f"{word(rng)} & {word(rng)}"
    return f"{word(rng)} {rng.choice(INDUSTRIES[industry] + GENERIC_COMPANY_SUFFIXES)}"


def university_name(rng: random.Random) -> str:
    pattern = rng.choice(("University of {}", "{} University", "{} Institute of Technology", "{} College"))
    return pattern.format(word(rng))


def work_name(rng: random.Random) -> str:
    """A book or film title, e.g. 'The Silent Harbour', 'Lantern of Brouvik'."""
    adjective, noun = rng.choice(WORK_ADJECTIVES), rng.choice(WORK_NOUNS)
    pattern = rng.randrange(4)
    if pattern == 0:
        return f"The {adjective.capitalize()} {noun.capitalize()}"
    if pattern == 1:
        return f"{noun.capitalize()} of {word(rng)}"
    if pattern == 2:
        return f"The {noun.capitalize()} of {word(rng)}"
    return f"{adjective.capitalize()} {_plural(noun).capitalize()}"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith("s") else "s")


def acronym(name: str) -> str:
    """'Dravem Institute of Technology' -> 'DIT' (capitalised words only)."""
    return "".join(w[0] for w in name.split() if w[0].isupper())
