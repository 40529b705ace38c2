"""docs/results.md's tables against the committed stores, section by section: each "## " section's
`experiments/results_tables.py` commands run as written (from the repository root, with
R=docs/results and the block's plain NAME=value lines before them; a --figure goes to a scratch
directory, so no committed figure is rewritten), and every "x [lo, hi]" of the section's tables
(a mean or a gap) is looked up in what they printed, whole numbers only, a mean with or without
its "± sd". A table may quote another section's figure: one that the other checked sections'
commands printed is counted apart, not as missing.

    .venv/bin/python experiments/check_results_doc.py                  # every section (~4 minutes)
    .venv/bin/python experiments/check_results_doc.py "Round 38" "Real text"   # sections whose heading starts so

Prints one line a section (intervals found of those in its tables; why some commands could not
run as written: --answer-frequency reads a world's shards, and is dropped where they are not at
the path the command names (`STUDY=/tmp/af WORLDS="5000r4 20000r4 100000r4"
experiments/regime/data.sh` rebuilds them, seeded, and a link at the other paths named serves),
and a store under runs/ is one the reader makes), then each interval that no checked section's
commands printed. Exits 1 when a section whose commands all ran has one.
tests/test_results_doc.py checks the real-text section so in CI; the whole doc takes minutes.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "results.md"
INTERVAL = re.compile(r"[+-]?\d+\.\d \[[+-]?\d+\.\d, [+-]?\d+\.\d\]")  # "x [lo, hi]": a mean or a gap
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Check:
    """One section's check: its tables' intervals, those its commands did not print, and why
    some commands could not run as written."""
    heading: str
    intervals: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    commands: int = 0
    problems: list[str] = field(default_factory=list)
    printed: str = ""  # what its commands printed (a mean also without its "± sd")


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each "## " section."""
    starts = [m.start() for m in re.finditer(r"^## ", text, re.M)] + [len(text)]
    return [(text[a:b].splitlines()[0][3:], text[a:b]) for a, b in zip(starts, starts[1:])]


def tables(text: str) -> list[str]:
    """The markdown tables in text, each as its lines joined."""
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            found.append("\n".join(rows))
            rows = []
    return found


def _assigns_only(line: str) -> bool:
    """`A=$R/x.tar.xz Q=...` or `export S=...`: names a block's later commands read; never a
    command (`STUDY=... experiments/regime/collect.sh` is one)."""
    try:
        words = shlex.split(line.split(" #")[0])
    except ValueError:
        return False
    words = words[1:] if words[:1] == ["export"] else words
    return bool(words) and all(ASSIGNMENT.match(w) for w in words) and "$(" not in line


def block_commands(block: str, scratch: Path) -> tuple[list[str], list[str]]:
    """A bash block's results_tables.py commands, each as a script of its own (R=docs/results and
    the block's plain assignments before it first), and what had to change: --answer-frequency
    dropped where its world's shards are not there, --figure sent to scratch."""
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    assigns, scripts, changed = ["R=docs/results"], [], []
    for line in lines:
        if "results_tables.py" in line:
            command = line.split(" #")[0]
            for arg, where in re.findall(r"( --answer-frequency \S+=(\S+))", command):
                if not (REPO / where).is_dir():  # the world's shards, which experiments/regime/data.sh rebuilds
                    command = command.replace(arg, "")
                    if (why := f"--answer-frequency dropped: no {where}") not in changed:
                        changed.append(why)
            command = re.sub(r"--figure \S+", f"--figure {scratch}/figure.svg", command)
            scripts.append("\n".join(assigns + [command.replace(".venv/bin/python", shlex.quote(sys.executable))]))
        elif _assigns_only(line):
            assigns.append(line.split(" #")[0])
    return scripts, changed


def check_section(heading: str, body: str) -> Check:
    """Run the section's commands, then find each interval of its tables in their output."""
    check = Check(heading, intervals=INTERVAL.findall("\n".join(tables(body)).replace("−", "-").replace("**", "")))
    printed = ""
    with tempfile.TemporaryDirectory() as scratch:
        for block in BLOCK.findall(body):
            scripts, changed = block_commands(block, Path(scratch))
            check.problems += [c for c in changed if c not in check.problems]
            for script in scripts:
                check.commands += 1
                run = subprocess.run(["bash", "-eu", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=900)
                printed += run.stdout
                if run.returncode:
                    why = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
                    check.problems.append(f"a command failed: {why[:150]}")
    check.printed = printed + re.sub(r" ± \d+\.\d", "", printed)  # a mean quoted without its sd
    check.missing = [iv for iv in check.intervals if not found(iv, check.printed)]
    return check


def found(interval: str, printed: str) -> bool:
    """Whole numbers only: "4.0 [2.4, 5.7]" is not found inside "14.0 [2.4, 5.7]"."""
    return re.search(r"(?<![\d.])" + re.escape(interval), printed) is not None


def main(argv: list[str]) -> int:
    checks = [check_section(heading, body) for heading, body in sections(DOC.read_text())
              if (not argv or any(heading.startswith(a) for a in argv)) and "results_tables.py" in "".join(BLOCK.findall(body))]
    everything = "".join(c.printed for c in checks)  # a table may quote another section's figure
    failed = 0
    for c in checks:
        quoted = [iv for iv in c.missing if found(iv, everything)]
        unprinted = [iv for iv in c.missing if iv not in quoted]
        why = f" ({'; '.join(c.problems)})" if c.problems else ""
        more = f", {len(quoted)} more printed by other sections' commands" if quoted else ""
        print(f"{len(c.intervals) - len(c.missing)} of {len(c.intervals)} found{more}, {c.commands} command(s): {c.heading[:80]}{why}")
        for iv in unprinted:
            print(f"    not printed: {iv}")
        failed += bool(unprinted and not c.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
