"""Closed-book questions, one per fact: "Where was X born?" -> the birth city.

Two phrasings per relation, picked by the fact's random variant, so a model is asked in words
that are not copied from the articles' sentences. The question's split is its fact's (by
unordered entity pair, see world.split_of).
"""

from __future__ import annotations

from eae_data.synth.articles import choose
from eae_data.synth.world import Entity, Fact, World

QUESTIONS = {
    "located_in": ("Which country is {s} located in?", "In which country is the city of {s}?"),
    "on_river": ("Which river flows through {s}?", "On which river does {s} lie?"),
    "capital": ("What is the capital of {s}?", "Which city is the capital of {s}?"),
    "flows_through": ("Which country does {s} flow through?", "In which country is {s}?"),
    "citizen_of": ("Which country is {s} a citizen of?", "What is the nationality of {s}?"),
    "born_in": ("Where was {s} born?", "In which city was {s} born?"),
    "educated_at": ("Where did {s} study?", "Which university did {s} attend?"),
    "employer": ("Which company did {s} work for?", "Who employed {s}?"),
    "headquartered_in": ("In which city is {s} based?", "Where is {s} headquartered?"),
    "founded_by": ("Who founded {s}?", "Who established {s}?"),
    "author": ("Who wrote {s}?", "Who is the author of {s}?"),
    "director": ("Who directed {s}?", "Who was the director of {s}?"),
    "based_on": ("Which novel is {s} based on?", "{s} is an adaptation of which novel?"),
    "set_in": ("In which city is {s} set?", "Where does {s} take place?"),
}


def subject_phrase(e: Entity) -> str:
    """How a question names its subject: works by kind ("the film X", unambiguous even when a
    novel has the same name), rivers with "the", everything else by name."""
    if e.type == "work":
        return f"the {e.kind} {e.name}"
    if e.type == "river":
        return f"the {e.name}"
    return e.name


def answer_aliases(e: Entity) -> list[str]:
    """Other names that count as the answer: the name if the title differs, the redirect aliases.
    Not the short name: a surname is shared by several people."""
    return ([e.name] if e.name != e.title else []) + list(e.aliases)


def make_question(world: World, fact: Fact) -> dict:
    s, o = world.entities[fact.subject], world.entities[fact.object]
    text = choose(fact.variant, 2, QUESTIONS[fact.relation]).format(s=subject_phrase(s))
    return {
        "id": f"q{fact.id}",
        "question": text[0].upper() + text[1:],
        "answer": o.title,
        "answer_id": o.id,
        "answer_aliases": answer_aliases(o),
        "relation": fact.relation,
        "subject": s.title,
        "subject_id": s.id,
        "fact_id": fact.id,
        "split": fact.split,
    }
