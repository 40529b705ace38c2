"""QA datasets in their official formats, read into one shape: `QAExample`.

Formats (`load_dataset(spec)`, spec = "FORMAT:PATH[,PATH...]"):
  synth:DIR                      `eae data synth` output: DIR/questions.jsonl with its splits
  fanoutqa[:FILE]                fanoutqa's dev file (default: the one in the installed
                                 package): its single-hop sub-questions (leaves of each
                                 decomposition) with a string answer; split by hashing the
                                 top-level question id, so sub-questions of one question share
                                 a split (the public test file has no answers)
  triviaqa:TRAIN,DEV[,TEST]      TriviaQA "unfiltered" JSON ({"Data": [{"Question",
                                 "QuestionId", "Answer": {"Value", "Aliases", ...}}]}).
                                 Open-domain practice (and the paper's): the official dev file is
                                 the test set, and dev is carved out of train unless given
  webquestions:TRAIN[,DEV],TEST  WebQuestions JSON ([{"utterance", "targetValue":
                                 "(list (description X) ...)", "url"}]); dev carved from train
                                 unless given

A record that cannot be read (no question text, no answer) is skipped and counted by reason in
`Dataset.skipped`; a file that is not in the format raises `QADataError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eae_data.packaged import package_file

SPLITS = ("train", "dev", "test")


class QADataError(ValueError):
    """A QA file or dataset spec that cannot be read."""


@dataclass
class QAExample:
    id: str
    question: str
    answers: list[str]  # the answer and its aliases, as given
    split: str
    answer_id: int | None = None  # filled by AnswerResolver (an id of the model's entity vocabulary)
    meta: dict = field(default_factory=dict)


@dataclass
class Dataset:
    name: str
    splits: dict[str, list[QAExample]]
    skipped: Counter = field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        return {s: len(self.splits.get(s, [])) for s in SPLITS}


def normalize_answer(text: str) -> str:
    """TriviaQA/SQuAD answer normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def bucket(key: str, salt: str = "") -> float:
    """A stable number in [0, 1) for `key` (split assignment that does not depend on file order)."""
    return int(hashlib.sha256(f"{salt}{key}".encode()).hexdigest()[:12], 16) / 16**12


def carve_dev(train: list[QAExample], fraction: float) -> tuple[list[QAExample], list[QAExample]]:
    """Move a stable `fraction` of train (by example id) to dev."""
    keep, dev = [], []
    for ex in train:
        (dev if bucket(ex.id, "dev") < fraction else keep).append(ex)
    for ex in dev:
        ex.split = "dev"
    return keep, dev


def _read_json(path: Path):
    if not path.is_file():
        raise QADataError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise QADataError(f"{path}: not valid UTF-8 JSON ({error})") from None


def _clean(text) -> str | None:
    return " ".join(text.split()) if isinstance(text, str) and text.strip() else None


def load_synth(directory: str | Path) -> Dataset:
    path = Path(directory) / "questions.jsonl"
    if not path.is_file():
        raise QADataError(f"{path}: not found (write a world with `eae data synth --out {directory}`)")
    data = Dataset("synth", {s: [] for s in SPLITS})
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            r = json.loads(line)
            ex = QAExample(r["id"], r["question"], [r["answer"], *r.get("answer_aliases", [])], r["split"],
                           meta={"relation": r.get("relation"), "subject": r.get("subject"),
                                 "subject_id": r.get("subject_id")})
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise QADataError(f"{path}:{n}: not a question record ({error!r})") from None
        if ex.split not in data.splits:
            raise QADataError(f"{path}:{n}: unknown split {ex.split!r}")
        data.splits[ex.split].append(ex)
    return data


def default_fanoutqa_path() -> Path:
    try:
        return package_file("fanoutqa", "fanoutqa==1.1.1", "data", "fanout-final-dev.json", what="fanoutqa's data ships")
    except FileNotFoundError as e:
        raise QADataError(str(e)) from None


def load_fanoutqa(path: str | Path | None = None, dev_fraction: float = 0.1, test_fraction: float = 0.1) -> Dataset:
    path = Path(path) if path else default_fanoutqa_path()
    records = _read_json(path)
    if not isinstance(records, list):
        raise QADataError(f"{path}: expected a JSON list of fanoutqa questions")
    data = Dataset("fanoutqa", {s: [] for s in SPLITS})

    def leaves(node):
        subs = node.get("decomposition") or []
        if not subs:
            yield node
        for sub in subs:
            yield from leaves(sub)

    for top in records:
        if not isinstance(top, dict) or "id" not in top:
            data.skipped["not_a_question"] += 1
            continue
        b = bucket(str(top["id"]), "fanoutqa")
        split = "test" if b < test_fraction else "dev" if b < test_fraction + dev_fraction else "train"
        for sub in top.get("decomposition") or []:
            for leaf in leaves(sub):
                question, answer = _clean(leaf.get("question")), leaf.get("answer")
                if question is None:
                    data.skipped["no_question"] += 1
                elif not isinstance(answer, str) or not answer.strip():
                    data.skipped["answer_not_a_string"] += 1  # lists, numbers, dicts: not one entity
                else:
                    evidence = (leaf.get("evidence") or {}).get("title")
                    data.splits[split].append(QAExample(str(leaf["id"]), question, [answer.strip()], split,
                                                        meta={"evidence": evidence, "parent": top["id"]}))
    return data


def _triviaqa_file(path: Path, split: str, skipped: Counter) -> list[QAExample]:
    blob = _read_json(path)
    if not isinstance(blob, dict) or not isinstance(blob.get("Data"), list):
        raise QADataError(f"{path}: not a TriviaQA file (expected an object with a `Data` list)")
    out = []
    for r in blob["Data"]:
        question = _clean(r.get("Question")) if isinstance(r, dict) else None
        answer = r.get("Answer") if isinstance(r, dict) else None
        if question is None:
            skipped["no_question"] += 1
            continue
        if not isinstance(answer, dict) or not _clean(answer.get("Value")):
            skipped["no_answer"] += 1
            continue
        answers = [answer["Value"], *(a for a in answer.get("Aliases", []) if isinstance(a, str))]
        if isinstance(answer.get("MatchedWikiEntityName"), str):
            answers.append(answer["MatchedWikiEntityName"])
        out.append(QAExample(str(r.get("QuestionId", f"{path.name}:{len(out)}")), question,
                             list(dict.fromkeys(answers)), split, meta={"type": answer.get("Type")}))
    return out


_DESCRIPTION = re.compile(r'\(description (?:"((?:[^"\\]|\\.)*)"|([^()"]+))\)')


def parse_target_value(text: str) -> list[str]:
    """WebQuestions' `(list (description "Jazmine Grace Grimaldi") (description Paris))` -> names."""
    return [(quoted or bare).replace('\\"', '"').strip() for quoted, bare in _DESCRIPTION.findall(text)]


def _webquestions_file(path: Path, split: str, skipped: Counter) -> list[QAExample]:
    blob = _read_json(path)
    if not isinstance(blob, list):
        raise QADataError(f"{path}: not a WebQuestions file (expected a JSON list)")
    out = []
    for i, r in enumerate(blob):
        question = _clean(r.get("utterance")) if isinstance(r, dict) else None
        if question is None:
            skipped["no_question"] += 1
            continue
        answers = parse_target_value(r.get("targetValue", "")) if isinstance(r.get("targetValue"), str) else []
        if not answers:
            skipped["no_answer"] += 1
            continue
        out.append(QAExample(f"{path.stem}:{i}", question, answers, split, meta={"url": r.get("url")}))
    return out


def _paths(spec: str, fmt: str, low: int, high: int) -> list[Path]:
    paths = [Path(p) for p in spec.split(",") if p] if spec else []
    if not low <= len(paths) <= high:
        raise QADataError(f"{fmt} needs {low}..{high} comma-separated files, got {len(paths)}: {spec!r}")
    return paths


def dataset_files(spec: str) -> tuple[str, list[Path]]:
    """(format, the files a spec reads): the format and the number of files checked, the files
    not opened."""
    if not spec:
        raise QADataError("no QA dataset given: synth:DIR, fanoutqa[:FILE], triviaqa:TRAIN,DEV[,TEST] or "
                          "webquestions:TRAIN[,DEV],TEST")
    fmt, _, rest = spec.partition(":")
    if fmt == "synth":
        if not rest:
            raise QADataError("synth needs a directory: synth:DIR")
        return fmt, [Path(rest) / "questions.jsonl"]
    if fmt == "fanoutqa":
        return fmt, [Path(rest) if rest else default_fanoutqa_path()]
    if fmt in ("triviaqa", "webquestions"):
        return fmt, _paths(rest, fmt, 2, 3)
    raise QADataError(f"unknown QA dataset format {fmt!r} in {spec!r}: use synth:DIR, fanoutqa[:FILE], "
                      "triviaqa:TRAIN,DEV[,TEST] or webquestions:TRAIN[,DEV],TEST")


def check_dataset(spec: str) -> None:
    """Raise QADataError for a spec whose format is unknown or whose files are missing, reading
    none of them: what a driver checks before it starts Ray tasks that read them."""
    fmt, paths = dataset_files(spec)
    for path in paths:
        if not path.is_file():
            hint = f" (write a world with `eae data synth --out {path.parent}`)" if fmt == "synth" else ""
            raise QADataError(f"{path}: not found{hint}")


def load_dataset(spec: str, dev_fraction: float = 0.1) -> Dataset:
    """Read a dataset from its spec (see the module docstring)."""
    fmt, paths = dataset_files(spec)
    if fmt == "synth":
        return load_synth(paths[0].parent)
    if fmt == "fanoutqa":
        return load_fanoutqa(paths[0], dev_fraction)
    read = _triviaqa_file if fmt == "triviaqa" else _webquestions_file
    data = Dataset(fmt, {s: [] for s in SPLITS})
    # Two files: train and the evaluation file (TriviaQA's official dev, WebQuestions' test).
    given = dict(zip(("train", "dev", "test"), paths)) if len(paths) == 3 else {"train": paths[0], "test": paths[1]}
    for split, path in given.items():
        data.splits[split] = read(path, split, data.skipped)
    if "dev" not in given:
        data.splits["train"], data.splits["dev"] = carve_dev(data.splits["train"], dev_fraction)
    return data
