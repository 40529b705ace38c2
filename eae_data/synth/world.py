"""The synthetic world: typed entities and the facts that relate them.

Every relation is functional (one object per subject and relation), so each fact answers one
question with one entity. Facts are internally consistent: a capital lies in its country, a
city on a river of its own country, a person studied at a university founded before they
were 18, a film is made after the novel it adapts, works appear while their creator is alive.
None of it is true of the real world: the names are invented (see names.py).

Popularity is heavy-tailed (a Pareto weight per entity): popular cities get many births,
popular writers many novels, as on Wikipedia, so answer frequencies are skewed, not uniform.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from bisect import bisect_right
from dataclasses import dataclass, field

from eae_data.synth import names

# Share of each entity type; every type gets at least MIN_PER_TYPE, people take the rest.
TYPE_SHARES = (("country", 0.02), ("city", 0.15), ("river", 0.04), ("organisation", 0.12),
               ("work", 0.20), ("person", 0.47))
MIN_PER_TYPE = 2
MIN_ENTITIES = 50

# name: (subject type, object type). The order is the order of a subject's facts.
RELATIONS = {
    "located_in": ("city", "country"),
    "on_river": ("city", "river"),
    "capital": ("country", "city"),
    "flows_through": ("river", "country"),
    "citizen_of": ("person", "country"),
    "born_in": ("person", "city"),
    "educated_at": ("person", "organisation"),
    "employer": ("person", "organisation"),
    "headquartered_in": ("organisation", "city"),
    "founded_by": ("organisation", "person"),
    "author": ("work", "person"),
    "director": ("work", "person"),
    "based_on": ("work", "work"),
    "set_in": ("work", "city"),
}
_RELATION_ORDER = {name: i for i, name in enumerate(RELATIONS)}

SPLITS = (("train", 0.8), ("dev", 0.1), ("test", 0.1))

OTHER_OCCUPATIONS = ("painter", "composer", "physicist", "politician", "architect", "actor",
                     "mathematician", "journalist", "engineer", "photographer")
GENRES = ("mystery", "science fiction", "historical", "romance", "adventure", "crime", "fantasy",
          "war", "comedy", "horror")
LAST_YEAR = 2024


@dataclass(slots=True)
class Entity:
    id: int
    type: str
    weight: float  # popularity: how likely it is picked as a fact's object
    kind: str = ""  # occupation | capital, city | company, university | novel, film | = type
    name: str = ""  # as prose writes it
    title: str = ""  # its page title: the name, but "X (film)" for a film named after its novel
    aliases: list[str] = field(default_factory=list)  # each also a redirect page to the title
    short: str = ""  # how later mentions call it (surname, acronym, ...); may be ambiguous
    year: int = 0  # birth, founding, publication or release year; 0 for places
    attrs: dict[str, object] = field(default_factory=dict)  # gender, death, population, genre, ...


@dataclass(slots=True)
class Fact:
    id: int
    subject: int
    relation: str
    object: int
    split: str
    variant: int  # random bits that choose the wording: sentence template, link form, question


@dataclass
class World:
    seed: int
    entities: list[Entity]  # entities[i].id == i
    facts: list[Fact]  # facts[i].id == i, sorted by subject then relation

    def __post_init__(self) -> None:
        self.subject_facts: list[list[Fact]] = [[] for _ in self.entities]
        self.object_facts: list[list[Fact]] = [[] for _ in self.entities]
        for f in self.facts:
            self.subject_facts[f.subject].append(f)
            self.object_facts[f.object].append(f)
        self.by_type = {t: [e for e in self.entities if e.type == t] for t, _ in TYPE_SHARES}

    def object_of(self, entity: Entity, relation: str) -> Entity | None:
        for f in self.subject_facts[entity.id]:
            if f.relation == relation:
                return self.entities[f.object]
        return None

    def redirects(self) -> list[tuple[str, Entity]]:
        """(alias, target) for every alias, in entity order."""
        return [(alias, e) for e in self.entities for alias in e.aliases]


def type_counts(num_entities: int) -> dict[str, int]:
    """How many entities of each type a world of `num_entities` has."""
    if isinstance(num_entities, bool) or not isinstance(num_entities, int):
        raise ValueError(f"num_entities must be an int, got {num_entities!r}")
    if num_entities < MIN_ENTITIES:
        raise ValueError(f"num_entities must be at least {MIN_ENTITIES} (every type needs "
                         f"{MIN_PER_TYPE} entities), got {num_entities}")
    counts = {t: max(MIN_PER_TYPE, int(share * num_entities)) for t, share in TYPE_SHARES if t != "person"}
    counts["person"] = num_entities - sum(counts.values())
    return counts


def split_of(seed: int, a: int, b: int) -> str:
    """The split of every fact between entities a and b, in either direction.

    Splitting by unordered entity pair rather than by fact keeps a fact's converse out of the
    other splits: "the capital of X is C" (X capital C) and "C lies in X" (C located_in X)
    always land together. A hash rather than a draw from the world's generator, so a fact's
    split does not depend on how many facts were drawn before it.
    """
    lo, hi = min(a, b), max(a, b)
    digest = hashlib.blake2b(f"{seed}:{lo}:{hi}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    for split, share in SPLITS:
        if u < share:
            return split
        u -= share
    return SPLITS[-1][0]


def build_world(num_entities: int, seed: int) -> World:
    """The world of `num_entities` entities for `seed`: the same for the same arguments."""
    counts = type_counts(num_entities)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return _Builder(counts, seed).build()


class _Picker:
    """Popularity-weighted draws, optionally among items with year <= a bound."""

    def __init__(self, items: list[Entity]) -> None:
        self.items = sorted(items, key=lambda e: (e.year, e.id))
        self.years = [e.year for e in self.items]
        self.cumulative = list(itertools.accumulate(e.weight for e in self.items))

    def pick(self, rng: random.Random, max_year: int | None = None) -> Entity | None:
        k = len(self.items) if max_year is None else bisect_right(self.years, max_year)
        if k == 0:
            return None
        r = rng.random() * self.cumulative[k - 1]
        return self.items[bisect_right(self.cumulative, r, 0, k - 1)]


class _Builder:
    """Draws the world type by type, always in entity-id order, from one generator."""

    def __init__(self, counts: dict[str, int], seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.names = names.Registry()
        types = [t for t, _ in TYPE_SHARES for _ in range(counts[t])]
        self.rng.shuffle(types)  # interleave types, so any prefix of the ids is a mixed sample
        self.entities = [Entity(i, t, weight=self.rng.paretovariate(1.5)) for i, t in enumerate(types)]
        self.of_type = {t: [e for e in self.entities if e.type == t] for t, _ in TYPE_SHARES}
        self.facts: list[Fact] = []
        self.country_of: dict[int, Entity] = {}  # city or river id -> its country
        self.creators: dict[str, _Picker] = {}  # occupation -> its people, once drawn

    def build(self) -> World:
        self._countries_and_cities()
        self._rivers()
        self._people()
        self._organisations()
        self._affiliations()
        self._works()
        self.facts.sort(key=lambda f: (f.subject, _RELATION_ORDER[f.relation]))
        for i, f in enumerate(self.facts):
            f.id = i
        return World(self.seed, self.entities, self.facts)

    def _fact(self, subject: Entity, relation: str, obj: Entity) -> None:
        split = split_of(self.seed, subject.id, obj.id)
        self.facts.append(Fact(-1, subject.id, relation, obj.id, split, self.rng.getrandbits(32)))

    def _alias(self, entity: Entity, alias: str) -> None:
        if self.names.claim(alias):
            entity.aliases.append(alias)

    def _countries_and_cities(self) -> None:
        rng, countries, cities = self.rng, self.of_type["country"], self.of_type["city"]
        for c in countries:
            c.kind = "country"
            c.name = c.title = c.short = self.names.unique(rng, names.country_name)
            self._alias(c, names.state_form(rng, c.name))
        country_picker = _Picker(countries)
        for i, city in enumerate(cities):
            city.name = city.title = city.short = self.names.unique(rng, names.city_name)
            if rng.random() < 0.3:
                self._alias(city, names.city_name(rng))  # a former name
            # The first cities are the capitals, one per country (cities >= countries always).
            if i < len(countries):
                country, city.kind = countries[i], "capital"
                city.weight *= 5
                city.attrs["population"] = rng.randrange(1_000_000, 5_000_000, 1000)  # the largest city
                self._fact(country, "capital", city)
            else:
                country, city.kind = country_picker.pick(rng), "city"
                city.attrs["population"] = rng.randrange(5_000, 900_000, 100)
            self.country_of[city.id] = country
            self._fact(city, "located_in", country)

    def _rivers(self) -> None:
        rng, rivers = self.rng, self.of_type["river"]
        country_picker = _Picker(self.of_type["country"])
        for r in rivers:
            r.kind = "river"
            r.name = r.title = self.names.unique(rng, names.river_name)
            r.short = r.name.removesuffix(" River")
            if rng.random() < 0.3:
                self._alias(r, f"River {r.short}")
            r.attrs["length_km"] = rng.randint(40, 3000)
            self.country_of[r.id] = country_picker.pick(rng)
            self._fact(r, "flows_through", self.country_of[r.id])
        # A city lies only on a river of its own country.
        by_country: dict[int, list[Entity]] = {}
        for r in rivers:
            by_country.setdefault(self.country_of[r.id].id, []).append(r)
        pickers = {country: _Picker(rs) for country, rs in by_country.items()}
        for city in self.of_type["city"]:
            picker = pickers.get(self.country_of[city.id].id)
            if picker is not None and rng.random() < 0.4:
                self._fact(city, "on_river", picker.pick(rng))

    def _people(self) -> None:
        rng, people = self.rng, self.of_type["person"]
        n = len(people)
        # Small pools: surnames are shared (ambiguous short mentions), full names never are.
        pool = max(20, 3 * int(n**0.5))
        given = {g: [names.given_name(rng, g) for _ in range(pool)] for g in ("female", "male")}
        family = [names.surname(rng) for _ in range(max(10, n // 3))]
        quotas = [("writer", 0.15), ("film director", 0.08), ("entrepreneur", 0.1)]
        occupations = [occ for occ, share in quotas for _ in range(max(1, round(share * n)))]
        city_picker, country_picker = _Picker(self.of_type["city"]), _Picker(self.of_type["country"])
        for i, p in enumerate(people):
            p.kind = occupations[i] if i < len(occupations) else rng.choice(OTHER_OCCUPATIONS)
            gender = rng.choice(("female", "male"))
            p.name = p.title = self.names.unique(
                rng, lambda r: f"{r.choice(given[gender])} {r.choice(family)}")
            first, p.short = p.name.split(" ", 1)
            if rng.random() < 0.5:
                self._alias(p, f"{first[0]}. {p.short}")
            p.year = rng.randint(1800, 1995)
            p.attrs["gender"] = gender
            if p.year < 1930:
                p.attrs["death"] = min(p.year + rng.randint(40, 95), LAST_YEAR - 1)
            city = city_picker.pick(rng)
            # Mostly citizens of their birth country, as a model might (wrongly) assume.
            country = self.country_of[city.id] if rng.random() < 0.85 else country_picker.pick(rng)
            self._fact(p, "citizen_of", country)
            self._fact(p, "born_in", city)
        self.creators = {occ: _Picker([p for p in people if p.kind == occ]) for occ, _ in quotas}

    def _active_year(self, person: Entity) -> int:
        """A year in which `person` worked: from age 20 to 75 or death."""
        end = min(int(person.attrs.get("death", LAST_YEAR)), person.year + 75, LAST_YEAR)
        return self.rng.randint(person.year + 20, end)

    def _organisations(self) -> None:
        rng, city_picker = self.rng, _Picker(self.of_type["city"])
        for o in self.of_type["organisation"]:
            o.kind = "university" if rng.random() < 0.35 else "company"
            if o.kind == "university":
                o.name = o.title = self.names.unique(rng, names.university_name)
                self._alias(o, names.acronym(o.name))
            else:
                industry = o.attrs["industry"] = rng.choice(tuple(names.INDUSTRIES))
                o.name = o.title = self.names.unique(rng, lambda r: names.company_name(r, industry))
                if "&" not in o.name:
                    self._alias(o, o.name.split()[0])
            o.short = o.aliases[0] if o.aliases else o.name
            founder = self.creators["entrepreneur"].pick(rng)
            o.year = self._active_year(founder)
            self._fact(o, "headquartered_in", city_picker.pick(rng))
            self._fact(o, "founded_by", founder)

    def _affiliations(self) -> None:
        rng, orgs = self.rng, self.of_type["organisation"]
        universities = _Picker([o for o in orgs if o.kind == "university"])
        companies = _Picker([o for o in orgs if o.kind == "company"])
        for p in self.of_type["person"]:
            if rng.random() < 0.5 and (u := universities.pick(rng, max_year=p.year + 18)):
                self._fact(p, "educated_at", u)
            last = min(p.year + 60, int(p.attrs.get("death", LAST_YEAR)))
            if rng.random() < 0.4 and (c := companies.pick(rng, max_year=last)):
                self._fact(p, "employer", c)

    def _works(self) -> None:
        rng, city_picker = self.rng, _Picker(self.of_type["city"])
        works = self.of_type["work"]
        for w in works:
            w.kind = "novel" if rng.random() < 0.55 else "film"
            w.attrs["genre"] = rng.choice(GENRES)
        # Novels first: a film may be named after the novel it adapts.
        for w in (w for w in works if w.kind == "novel"):
            author = self.creators["writer"].pick(rng)
            w.year = self._active_year(author)
            w.name = w.title = self.names.unique(rng, names.work_name)
            self._fact(w, "author", author)
        novels = _Picker([w for w in works if w.kind == "novel"])
        for w in (w for w in works if w.kind == "film"):
            director = self.creators["film director"].pick(rng)
            w.year = self._active_year(director)
            novel = novels.pick(rng, max_year=w.year - 1) if rng.random() < 0.3 else None
            # Deliberate ambiguity: the film shares its novel's name, its title disambiguates.
            if novel is not None and self.names.claim(f"{novel.name} (film)"):
                w.name, w.title = novel.name, f"{novel.name} (film)"
                self._fact(w, "based_on", novel)
            else:
                w.name = w.title = self.names.unique(rng, names.work_name)
            self._fact(w, "director", director)
        for w in works:
            w.short = w.name
            if rng.random() < 0.5:
                self._fact(w, "set_in", city_picker.pick(rng))
