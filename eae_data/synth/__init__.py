"""A deterministic synthetic world for controlled experiments (issue 3, item 5).

Typed entities (people, cities, countries, rivers, organisations, works) with invented names,
functional facts between them (born_in, located_in, capital, author, ...), a Wikipedia-style
MediaWiki dump that states every fact in its subject's article with a link to its object, and
closed-book questions split so that no dev/test fact, nor its converse, is ever asked in train.

    write_world(out_dir, num_entities, seed, renderings=1) -> WorldSummary   # all files, see output.py
    build_world(num_entities, seed) -> World                   # in memory
    render_article(world, entity, renderings=1), restatement(world, entity, r), fact_sentence(world, fact), make_question(world, fact)

The same (num_entities, seed) always gives the same bytes (on one Python version: the draws
come from random.Random). Pure Python: no Ray, no torch.

Deliberate ambiguity (everything else is unique): people share surnames, and later mentions
may call them by surname alone ([[Arlo Venn|Venn]]); a film adapted from a novel shares its
name, its page title is "Name (film)".
"""

from eae_data.synth.articles import fact_sentence, link, render_article, render_redirect, restatement
from eae_data.synth.output import WorldSummary, summarize, write_dump, write_world
from eae_data.synth.questions import make_question
from eae_data.synth.world import MIN_ENTITIES, RELATIONS, Entity, Fact, World, build_world, type_counts

__all__ = ["MIN_ENTITIES", "RELATIONS", "Entity", "Fact", "World", "WorldSummary", "build_world",
           "fact_sentence", "link", "make_question", "render_article", "render_redirect", "restatement", "summarize",
           "type_counts", "write_dump", "write_world"]
