"""Wikitext articles for the synthetic world, in the style of English Wikipedia.

An article has a {{Short description}}, an infobox, a lead whose first sentence names the
entity in bold and states its lead fact, sections for its other facts, sentences that list
entities whose facts point at it ("Notable people born in X include ..."), a See also list, a
<ref> and {{Reflist}}, and categories. Links are [[Title]], [[Title|short name]] or
[[Redirect alias]], mixed the way Wikipedia mixes them.

Each fact's sentence (`fact_sentence`) depends only on the world and the fact, so it is both
written into the subject's article and exported as the fact's evidence. With `renderings` R > 1
an article restates all its facts R - 1 more times (`restatement`), each time in its own order and
wording and naming its subject in full: a fact read in one wording only is memorised with the
text around it but is not recalled from another wording (Allen-Zhu & Li, "Physics of Language
Models: Part 3.1", 2023), so varied restatements make the knowledge extractable. None of them
uses a probe's wording (eae_platform.evaluate.probes.SYNTH_TEMPLATES), so recall is never a copy. Everything else an
article draws (which entities to list, link forms) comes from a generator seeded by the world's
seed and the entity id: articles can be rendered in any order, or in parallel.
"""

from __future__ import annotations

import random

from eae_data.synth.world import Entity, Fact, World

# Sentences stating a fact in its subject's article: the relation's, or the (relation, kind)'s.
# {o} is the link to the object; {bold} the bold name that opens a lead.
SENTENCES: dict[str | tuple[str, str], tuple[str, ...]] = {
    "citizen_of": ("{bold} {is} {a_kind} and a citizen of {o}.",
                   "{bold} {is} {a_kind} from {o}.",
                   "{bold} {is} {a_kind} who {holds} the citizenship of {o}."),
    "born_in": ("{short} was born in {o}.",
                "{He} was born in {o} in {year}.",
                "{short} was born in {o}, a city in {o_country}."),
    "educated_at": ("{He} studied at {o}.", "{short} was educated at {o}.", "{He} attended {o}."),
    "employer": ("{He} worked for {o}.", "{short} was employed by {o}.", "{He} later joined {o}."),
    ("located_in", "capital"): ("{bold} is the capital of {o}.",
                                "{bold} is the capital and largest city of {o}."),
    "located_in": ("{bold} is a city in {o}.",
                   "{bold} is a city located in {o}.",
                   "{bold} is a town in {o}."),
    "on_river": ("The city lies on the {o}.",
                 "{short} is situated on the banks of the {o}.",
                 "The {o} flows through the city."),
    "capital": ("Its capital is {o}.",
                "The capital of {short} is {o}.",
                "{short}'s capital and largest city is {o}."),
    "flows_through": ("{bold} is a river in {o}.",
                      "{bold} is a river that flows through {o}.",
                      "{bold} is a major river of {o}."),
    ("headquartered_in", "company"): ("{bold} is {a_industry} company headquartered in {o}.",
                                      "{bold} is {a_industry} company based in {o}."),
    ("headquartered_in", "university"): ("{bold} is a university in {o}.",
                                         "{bold} is a public research university located in {o}."),
    "founded_by": ("It was founded by {o} in {year}.",
                   "{short} was established in {year} by {o}.",
                   "{o} founded {short} in {year}."),
    "author": ("{bold} is a {year} {genre} novel by {o}.",
               "{bold} is {a_genre} novel written by {o} and published in {year}.",
               "{bold} is a novel by {o}, first published in {year}."),
    "director": ("{bold} is a {year} {genre} film directed by {o}.",
                 "{bold} is {a_genre} film directed by {o}, released in {year}."),
    "based_on": ("It is based on the novel {o} by {o_author}.",
                 "The film is an adaptation of the novel {o}."),
    "set_in": ("The story is set in {o}.", "It takes place in {o}.", "The {kind} is set in {o}."),
}

# Restatements: {s} is the subject's name, {o} the link to the object.
RESTATE: dict[str, tuple[str, ...]] = {
    "located_in": ("{s} lies in {o}.", "{s} is located in {o}.", "{s} is a settlement in {o}."),
    "on_river": ("{s} is a city on the {o}.", "The {o} runs through {s}.", "{s} sits on the banks of the {o}."),
    "capital": ("{s} has its capital at {o}.", "The seat of government of {s} is {o}.", "{s} is governed from {o}."),
    "flows_through": ("{s} is a river of {o}.", "{s} runs across {o}.", "{s} crosses {o}."),
    "citizen_of": ("{s} is a national of {o}.", "{s} has the citizenship of {o}.", "{s} holds a passport of {o}."),
    "born_in": ("{s} is a native of {o}.", "{s} came into the world in {o}.", "The birthplace of {s} is {o}."),
    "educated_at": ("{s} is a graduate of {o}.", "{s} was educated at {o}.", "{s} attended {o}."),
    "employer": ("{s} was employed by {o}.", "{s} held a position at {o}.", "{s} was on the staff of {o}."),
    "headquartered_in": ("{s} is based in {o}.", "{s} has its headquarters in {o}.", "The head office of {s} is in {o}."),
    "founded_by": ("{o} founded {s}.", "{s} was established by {o}.", "{s} owes its founding to {o}."),
    "author": ("{o} wrote {s}.", "{s} is a novel by {o}.", "{s} is the work of the writer {o}."),
    "director": ("{o} directed {s}.", "{s} is a film by {o}.", "{s} was made by the director {o}."),
    "based_on": ("{s} adapts {o}.", "{s} is an adaptation of {o}.", "{s} is the film version of {o}."),
    "set_in": ("{s} takes place in {o}.", "The story of {s} unfolds in {o}.", "{s} has {o} as its setting."),
}
RESTATE_HEADINGS = ("Overview", "Summary", "Key facts", "Profile", "At a glance", "In brief", "Facts", "Notes")

# Sentences in the object's article listing the subjects of its incoming facts.
INVERSE = {
    "born_in": "Notable people born in {short} include {list}.",
    "citizen_of": "Notable citizens include {list}.",
    "located_in": "Cities in {short} include {list}.",
    "flows_through": "Rivers of {short} include the {list}.",
    "on_river": "Cities on the river include {list}.",
    "headquartered_in": "Organisations based in the city include {list}.",
    "set_in": "Works set in {short} include {list}.",
    "founded_by": "{He} founded {list}.",
    "author": "{His} novels include {list}.",
    "director": "{He} directed {list}.",
    "educated_at": "Notable alumni include {list}.",
    "employer": "Notable employees have included {list}.",
    "based_on": "Film adaptations include {list}.",
}
MAX_LISTED = 5  # a popular city has thousands of births; the article names a few

# Sentences about attributes, not facts (no question asks for them).
ATTRIBUTES = {
    "state": "{bold} is a sovereign state.",
    "population": "It has a population of {population}.",
    "length": "It is {length_km} km long.",
}

# Per type: (section heading, items); None heads the lead. An item is a relation (the facts
# of the entity), "~relation" (facts pointing at it) or an ATTRIBUTES key.
LAYOUT = {
    "person": ((None, ("citizen_of",)),
               ("Early life", ("born_in", "educated_at")),
               ("Career", ("employer", "~founded_by", "~author", "~director"))),
    "city": ((None, ("located_in", "population")),
             ("Geography", ("on_river",)),
             ("Economy", ("~headquartered_in",)),
             ("Notable people", ("~born_in",)),
             ("In fiction", ("~set_in",))),
    "country": ((None, ("state", "capital")),
                ("Geography", ("~located_in", "~flows_through")),
                ("People", ("~citizen_of",))),
    "river": ((None, ("flows_through", "length")), ("Course", ("~on_river",))),
    "organisation": ((None, ("headquartered_in",)),
                     ("History", ("founded_by",)),
                     ("People", ("~educated_at", "~employer"))),
    "work": ((None, ("author", "director")),
             ("Setting", ("set_in",)),
             ("Adaptations", ("based_on", "~based_on"))),
}

INFOBOX = {"person": "Infobox person", "capital": "Infobox settlement", "city": "Infobox settlement",
           "country": "Infobox country", "river": "Infobox river", "company": "Infobox company",
           "university": "Infobox university", "novel": "Infobox book", "film": "Infobox film"}
INFOBOX_KEYS = {"born_in": "birth_place", "citizen_of": "nationality", "educated_at": "alma_mater",
                "employer": "employer", "located_in": "subdivision_name", "on_river": "river",
                "capital": "capital", "flows_through": "country", "headquartered_in": "location",
                "founded_by": "founder", "author": "author", "director": "director",
                "based_on": "based_on", "set_in": "setting"}

PRONOUNS = {"female": {"He": "She", "he": "she", "His": "Her"}, "male": {"He": "He", "he": "he", "His": "His"}}

# Link forms, weighted: mostly the title, sometimes the short name piped, rarely a redirect.
LINK_FORMS = ("title",) * 7 + ("short", "short", "alias")


def link(e: Entity, form: str = "title") -> str:
    """A wikilink to `e`; forms it lacks (no alias, no distinct short name) fall back to the title."""
    if form == "alias" and e.aliases:
        return f"[[{e.aliases[0]}]]"
    if form == "short" and e.short != e.name:
        return f"[[{e.title}|{e.short}]]"
    return f"[[{e.title}]]" if e.title == e.name else f"[[{e.title}|{e.name}]]"


def choose(variant: int, slot: int, options: tuple):
    """One of `options` picked by byte `slot` of a fact's random `variant`."""
    return options[(variant >> (8 * slot)) % len(options)]


def fact_sentence(world: World, fact: Fact) -> str:
    """The sentence stating `fact` in its subject's article, with a link to its object."""
    s, o = world.entities[fact.subject], world.entities[fact.object]
    template = choose(fact.variant, 0, SENTENCES.get((fact.relation, s.kind)) or SENTENCES[fact.relation])
    fields = _fields(world, s)
    if "{o_country}" in template:
        fields["o_country"] = link(world.object_of(o, "located_in"))
    if "{o_author}" in template:
        fields["o_author"] = link(world.object_of(o, "author"))
    return template.format(o=link(o, choose(fact.variant, 1, LINK_FORMS)), **fields)


def restatement(world: World, e: Entity, r: int) -> str:
    """`e`'s facts stated again (r >= 1: the r-th restatement), shuffled, with fresh wording and
    link forms; "" for an entity without facts. Seeded by (world seed, entity, r) alone."""
    rng = random.Random(f"{world.seed}:{e.id}:restatement{r}")
    facts = list(world.subject_facts[e.id])
    rng.shuffle(facts)
    return " ".join(rng.choice(RESTATE[f.relation]).format(
        s=e.name, o=link(world.entities[f.object], rng.choice(LINK_FORMS))) for f in facts)


def render_article(world: World, e: Entity, renderings: int = 1) -> str:
    """The full wikitext of `e`'s article, its facts stated `renderings` times in all."""
    rng = random.Random(f"{world.seed}:{e.id}")
    fields = _fields(world, e)
    facts = {f.relation: f for f in world.subject_facts[e.id]}  # functional: one per relation
    incoming: dict[str, list[Fact]] = {}
    for f in world.object_facts[e.id]:
        incoming.setdefault(f.relation, []).append(f)

    parts = [f"{{{{Short description|{_description(world, e)}}}}}", _infobox(world, e)]
    cite = f'<ref name="src{e.id}">{{{{cite web |title={e.name} |publisher=Synthetic Gazette}}}}</ref>'
    for heading, items in LAYOUT[e.type]:
        sentences = []
        for item in items:
            if item in facts:
                sentences.append(fact_sentence(world, facts[item]))
            elif item.startswith("~") and item[1:] in incoming:
                listed = _sample(rng, incoming[item[1:]])
                names = [link(world.entities[f.subject], rng.choice(LINK_FORMS)) for f in listed]
                sentences.append(INVERSE[item[1:]].format(list=_enumerate(names), **fields))
            elif item in ATTRIBUTES:
                sentences.append(ATTRIBUTES[item].format(**fields))
        if not sentences:
            continue
        if heading is None:
            sentences[0] += cite
            parts.append(" ".join(sentences))
        else:
            parts.append(f"== {heading} ==\n" + " ".join(sentences))

    for r in range(1, renderings):
        if text := restatement(world, e, r):
            parts.append(f"== {RESTATE_HEADINGS[(r - 1) % len(RESTATE_HEADINGS)]} ==\n{text}")

    same_type = world.by_type[e.type]  # sample three: at most one of them is e itself
    others = [x for x in rng.sample(same_type, min(3, len(same_type))) if x is not e][:2]
    see_also = sorted(others, key=lambda x: x.id)
    parts.append("== See also ==\n" + "\n".join(f"* {link(x)}" for x in see_also))
    parts.append("== References ==\n{{Reflist}}")
    parts.append("\n".join(f"[[Category:{c}]]" for c in _categories(world, e)))
    return "\n\n".join(parts) + "\n"


def render_redirect(target: Entity) -> str:
    return f"#REDIRECT [[{target.title}]] {{{{R from alternative name}}}}"


def _fields(world: World, e: Entity) -> dict[str, str]:
    """What templates may say about `e`: its names, pronouns, tense, attributes."""
    alias = e.aliases[0] if e.aliases else None
    fields = {"name": e.name, "short": e.short, "kind": e.kind, "year": str(e.year),
              "He": "It", "he": "it", "His": "Its", "is": "is", "holds": "holds"}
    if e.type == "person":
        fields.update(PRONOUNS[str(e.attrs["gender"])])
        if "death" in e.attrs:
            fields.update({"is": "was", "holds": "held"})
        fields["bold"] = f"'''{e.name}''' ({_life(e)})"
        fields["a_kind"] = _a(e.kind)
    elif e.type == "city":
        fields["bold"] = f"'''{e.name}'''" + (f" (formerly '''{alias}''')" if alias else "")
        fields["population"] = f"{e.attrs['population']:,}"
    elif e.type == "country":
        fields["bold"] = f"'''{e.name}'''" + (f", officially the '''{alias}'''," if alias else "")
    elif e.type == "river":
        fields["bold"] = f"The '''{e.name}'''" + (f" (also '''{alias}''')" if alias else "")
        fields["length_km"] = str(e.attrs["length_km"])
    elif e.type == "organisation":
        fields["bold"] = f"'''{e.name}'''" + (f" ('''{alias}''')" if alias else "")
        if e.kind == "company":
            fields["a_industry"] = _a(str(e.attrs["industry"]))
    else:  # work: bold italics, as Wikipedia sets titles of works
        fields["bold"] = f"'''''{e.name}'''''"
        fields["genre"] = str(e.attrs["genre"])
        fields["a_genre"] = _a(fields["genre"])
    return fields


def _life(person: Entity) -> str:
    death = person.attrs.get("death")
    return f"{person.year}-{death}" if death else f"born {person.year}"


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _sample(rng: random.Random, facts: list[Fact]) -> list[Fact]:
    return facts if len(facts) <= MAX_LISTED else sorted(rng.sample(facts, MAX_LISTED), key=lambda f: f.id)


def _enumerate(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _infobox(world: World, e: Entity) -> str:
    rows = [("name", e.name)]
    if e.type == "person":
        rows.append(("birth_date", f"{{{{birth year|{e.year}}}}}"))
        if "death" in e.attrs:
            rows.append(("death_date", f"{{{{death year|{e.attrs['death']}}}}}"))
        rows.append(("occupation", e.kind.capitalize()))
    elif e.year:
        key = {"film": "released", "novel": "published"}.get(e.kind, "founded")
        rows.append((key, str(e.year)))
    for key in ("population", "length_km", "industry", "genre"):
        if key in e.attrs:
            rows.append((key, str(e.attrs[key])))
    for f in world.subject_facts[e.id]:
        o = world.entities[f.object]
        value = link(o)
        if f.relation == "based_on":  # a nested template, as real film infoboxes have
            value = f"{{{{based on|{link(o)}|{link(world.object_of(o, 'author'))}}}}}"
        elif f.relation == "born_in":
            value = f"{link(o)}, {link(world.object_of(o, 'located_in'))}"
        rows.append((INFOBOX_KEYS[f.relation], value))
    name = INFOBOX.get(e.kind) or INFOBOX[e.type]
    return f"{{{{{name}\n" + "".join(f"| {k} = {v}\n" for k, v in rows) + "}}"


def _description(world: World, e: Entity) -> str:
    related = {f.relation: world.entities[f.object].name for f in world.subject_facts[e.id]}
    if e.type == "person":
        return f"{e.kind.capitalize()} ({_life(e)})"
    if e.type == "city":
        return f"{'Capital of' if e.kind == 'capital' else 'City in'} {related['located_in']}"
    if e.type == "country":
        return "Sovereign state"
    if e.type == "river":
        return f"River in {related['flows_through']}"
    if e.kind == "company":
        return f"{str(e.attrs['industry']).capitalize()} company"
    if e.kind == "university":
        return f"University in {related['headquartered_in']}"
    creator = related.get("author") or related["director"]
    return f"{e.year} {e.kind} by {creator}"


def _categories(world: World, e: Entity) -> list[str]:
    related = {f.relation: world.entities[f.object].title for f in world.subject_facts[e.id]}
    if e.type == "person":
        cats = [f"{e.year} births"] + ([f"{e.attrs['death']} deaths"] if "death" in e.attrs else [])
        return cats + [f"{e.kind.capitalize()}s", f"People from {related['born_in']}"]
    if e.type == "city":
        cats = [f"Cities in {related['located_in']}"] + (["Capitals"] if e.kind == "capital" else [])
        return cats + ([f"Populated places on the {related['on_river']}"] if "on_river" in related else [])
    if e.type == "country":
        return ["Countries", "Sovereign states"]
    if e.type == "river":
        return [f"Rivers of {related['flows_through']}"]
    if e.kind == "company":
        return [f"Companies based in {related['headquartered_in']}", f"Companies established in {e.year}"]
    if e.kind == "university":
        return [f"Universities in {related['headquartered_in']}",
                f"Educational institutions established in {e.year}"]
    if e.kind == "novel":
        cats = [f"{e.year} novels", f"Novels by {related['author']}"]
        return cats + ([f"Novels set in {related['set_in']}"] if "set_in" in related else [])
    cats = [f"{e.year} films", f"Films directed by {related['director']}"]
    return cats + (["Films based on novels"] if "based_on" in related else [])
