"""Answer strings -> entity ids of the model's vocabulary (the paper uses SLING's phrase table;
we use what the data build knows: titles, redirects and hyperlink anchor texts).

For each answer string, in order, the first of:
  1. a title of the vocabulary, as written or with its first letter upper-cased (MediaWiki);
  2. a redirect to such a title;
  3. an anchor text linked to vocabulary entities (the entity it links to most often);
  4. the same three after TriviaQA normalisation (case, punctuation, articles).
The vocabulary files (entities.parquet, aliases.parquet, redirects.parquet) are written by
`eae data build` and copied into every model directory pretraining writes.
"""

from __future__ import annotations

from pathlib import Path

from eae_data.constants import VOCAB_FILES
from eae_data.qa.examples import QAExample, normalize_answer


class AnswerResolver:
    def __init__(self, titles: list[str], aliases: list[tuple[str, int, int]] = (), redirects: dict[str, str] | None = None):
        """titles[i]: the title of entity i; aliases: (anchor text, entity id, count);
        redirects: alias title -> final title."""
        self.titles = titles
        ids = {t: i for i, t in enumerate(titles)}
        exact: dict[str, int] = dict(ids)
        for alias, title in (redirects or {}).items():
            if title in ids:
                exact.setdefault(alias, ids[title])
        best: dict[str, tuple[int, int]] = {}
        for alias, entity, count in aliases:
            if alias not in best or count > best[alias][1]:
                best[alias] = (entity, count)
        for alias, (entity, _) in best.items():
            exact.setdefault(alias, entity)
        self._exact = exact
        self._normalized: dict[str, int] = {}
        for name, entity in exact.items():  # titles first: they win normalised clashes
            self._normalized.setdefault(normalize_answer(name), entity)

    @classmethod
    def from_dir(cls, directory: str | Path) -> "AnswerResolver":
        import pyarrow.parquet as pq

        directory = Path(directory)
        missing = [f for f in VOCAB_FILES if not (directory / f).is_file()]
        if "entities.parquet" in missing:
            raise FileNotFoundError(
                f"{directory} has no entities.parquet: answers cannot be resolved to entity ids without the "
                "entity vocabulary the model was pretrained with (an `eae data build` output directory, or a "
                "model directory written by `eae pretrain`)"
            )
        entities = pq.read_table(directory / "entities.parquet").sort_by("entity_id")
        titles = entities.column("title").to_pylist()
        aliases, redirects = [], {}
        if "aliases.parquet" not in missing:
            t = pq.read_table(directory / "aliases.parquet")
            aliases = list(zip(*(t.column(c).to_pylist() for c in ("alias", "entity_id", "count"))))
        if "redirects.parquet" not in missing:
            t = pq.read_table(directory / "redirects.parquet")
            redirects = dict(zip(t.column("alias").to_pylist(), t.column("title").to_pylist()))
        return cls(titles, aliases, redirects)

    def __len__(self) -> int:
        return len(self.titles)

    def names(self) -> list[str]:
        """Every name that resolves exactly: titles, redirects and anchor texts."""
        return list(self._exact)

    def entity_id(self, name: str) -> int | None:
        name = " ".join(name.split())
        if not name:
            return None
        for candidate in (name, name[:1].upper() + name[1:]):
            if candidate in self._exact:
                return self._exact[candidate]
        return self._normalized.get(normalize_answer(name))

    def resolve(self, answers: list[str]) -> int | None:
        """The entity of the first answer string that resolves, or None."""
        for answer in answers:
            entity = self.entity_id(answer)
            if entity is not None:
                return entity
        return None

    def resolve_all(self, examples: list[QAExample]) -> int:
        """Set `answer_id` on each example; returns how many resolved."""
        n = 0
        for ex in examples:
            ex.answer_id = self.resolve(ex.answers)
            n += ex.answer_id is not None
        return n

    def matches(self, entity: int, answers: list[str]) -> bool:
        """Exact match of a predicted entity: its title equals an answer after normalisation, or
        an answer resolves to it."""
        title = normalize_answer(self.titles[entity]) if 0 <= entity < len(self.titles) else None
        return any(normalize_answer(a) == title or self.entity_id(a) == entity for a in answers)
