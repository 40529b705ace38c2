"""The README and docs/ cannot drift from the code.

Every command shown in a code block of README.md or docs/*.md, and every inline command in
their tables, is checked: `eae ...` (also `.venv/bin/eae`, and `ray job submit ... -- python
jobs/X.py ...`, which hands its arguments to an `eae` command) must parse with the real `eae`
parser and name repository files that exist; `python benchmarks/...` and `scripts/...` must
exist. `.ci/run` must run exactly the README's test command, the README must have its quick
start (which `scripts/readme-commands` runs for real before a release), and every relative link
must resolve, anchors included. Fast: no command is run here.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from eae_platform.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Directories of the repository: a command's argument under one of them must exist.
REPO_DIRS = ("configs/", "tune_spaces/", "serve_apps/", "benchmarks/", "jobs/", "scripts/", "experiments/",
             "tests/", "eae_data/", "eae_model/", "platform/")
# Placeholders written in the docs where a number is needed.
PLACEHOLDERS = {"N": "1"}


def _load_readme_commands():
    path = REPO / "scripts" / "readme-commands"
    loader = importlib.machinery.SourceFileLoader("readme_commands", str(path))
    spec = importlib.util.spec_from_loader("readme_commands", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


RC = _load_readme_commands()


def _table_commands(text: str) -> list[str]:
    """Inline code spans of table rows (outside code blocks)."""
    out, in_block = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block and line.startswith("|"):
            out += re.findall(r"`([^`]+)`", line)
    return out


def _shown_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line shown in the pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        name = page.relative_to(REPO).as_posix()
        for block in RC.code_blocks(text):
            for cmd in RC.commands(block):
                found.append((f"{name} (code block)", cmd))
        for cmd in _table_commands(text):
            found.append((f"{name} (table)", cmd))
    return found


def _normalise(cmd: str) -> list[str]:
    """Tokens of a documented command: comments dropped, optional `[--flag ...]` groups taken,
    `a|b` alternatives reduced to the first, `...` dropped, placeholders filled in."""
    cmd = re.sub(r"\[(--[^\]]*)\]", r"\1", cmd)
    tokens = shlex.split(cmd, comments=True)
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):  # VAR=value prefixes
        tokens.pop(0)
    out = []
    for token in tokens:
        if token == "...":
            continue
        if "|" in token and not token.startswith("{"):
            token = token.split("|")[0]
        out.append(PLACEHOLDERS.get(token, token))
    return out


def _job_commands() -> dict[str, list[str]]:
    """jobs/X.py -> the eae argv prefix it runs (read from its `main([...` call)."""
    jobs = {}
    for path in (REPO / "jobs").glob("*.py"):
        m = re.search(r"main\(\[([^\]]*?)\*sys\.argv", path.read_text())
        if m:
            jobs[f"jobs/{path.name}"] = re.findall(r"\"([^\"]+)\"", m.group(1))
    return jobs


JOBS = _job_commands()


def _eae_argv(tokens: list[str]) -> list[str] | None:
    """The eae argv of a command, None when it is no eae command."""
    if tokens and tokens[0] in ("eae", ".venv/bin/eae"):
        return tokens[1:]
    if tokens[:3] == ["ray", "job", "submit"] and "--" in tokens:
        rest = tokens[tokens.index("--") + 1:]
        if len(rest) >= 2 and rest[0] in ("python", "python3") and rest[1] in JOBS:
            return JOBS[rest[1]] + rest[2:]
    return None


def _parse(argv: list[str]) -> str | None:
    """None when the real parser accepts argv, else its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit_.code}"
    return None


def _missing_files(tokens: list[str]) -> list[str]:
    missing = []
    for token in tokens:
        for part in re.split(r"[=:,]", token):
            if part.startswith(REPO_DIRS) and not (REPO / part.removesuffix("...").rstrip("/")).exists():
                missing.append(part)
    return missing


def check_command(cmd: str, name_ok: bool = False) -> list[str]:
    """What is wrong with one documented command (empty when nothing). With `name_ok` (a table
    cell), a bare command name such as `eae compare` may lack its required arguments."""
    try:
        tokens = _normalise(cmd)
    except ValueError as error:  # not shell: a diagram or an equation in a code block, unless it starts like a command
        return [f"a shell cannot split it: {error}"] if re.match(r"(\.venv/bin/)?eae |ray job |scripts/", cmd) else []
    if not tokens:
        return []
    problems = []
    argv = _eae_argv(tokens)
    if argv is not None:
        message = _parse(argv)
        bare_name = all(re.fullmatch(r"[a-z][a-z_]*", t) for t in argv)
        if message and not (name_ok and bare_name and "arguments are required" in message):
            problems.append(f"the eae parser refuses it: {message}")
    elif tokens[0] in ("python", "python3", ".venv/bin/python") and len(tokens) > 1 and tokens[1].endswith(".py"):
        pass  # the script's path is checked below
    elif tokens[0].startswith("scripts/"):
        path = REPO / tokens[0].removesuffix("...")
        if not (path.is_dir() or path.is_file() and path.stat().st_mode & 0o111):
            problems.append(f"{tokens[0]} is not an executable file")
    problems += [f"names {p}, which does not exist" for p in _missing_files(tokens)]
    return problems


SHOWN = _shown_commands()


def test_the_pages_show_eae_commands():
    """The extraction finds what it should (else the checks below check nothing)."""
    eae = [cmd for _, cmd in SHOWN if re.match(r"(\.venv/bin/)?eae ", cmd)]
    assert len(eae) >= 30, eae
    assert any(where.startswith("README.md (table)") for where, cmd in SHOWN if cmd.startswith("eae "))


def test_every_shown_command_parses_and_names_real_files():
    problems = [f"{where}: `{cmd}`: {p}" for where, cmd in SHOWN
                for p in check_command(cmd, name_ok=where.endswith("(table)"))]
    assert not problems, "\n".join(problems)


def test_a_drifted_command_is_caught():
    """The checker itself: a renamed flag, a bad choice and a missing config are each reported."""
    assert check_command("eae pretrain --preset tiny --data runs/data --max-steps 100") == []
    assert check_command("eae pretrain --preset tiny --dataset runs/data")
    assert check_command("eae eval maskd --model runs/models/eae")
    assert check_command("eae pretrain --config configs/no-such-file.yaml")
    assert check_command("ray job submit --working-dir . -- python jobs/pretrain.py --max-steps many")


def test_ci_runs_exactly_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    m = re.search(r"^\*\*Test\*\*.*?\n```bash\n(.+?)\n```", readme, re.M | re.S)
    assert m, "README.md has no **Test** block"
    command = m.group(1).strip()
    assert command == "scripts/test"
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert f"exec {command}" in ci or command in ci, ci


def test_the_quick_start_is_there_for_scripts_readme_commands():
    cmds = RC.quick_start()
    eae = [c.split()[1] for c in cmds if c.startswith("eae ")]
    for stage in ("data", "pretrain", "eval", "finetune", "serve"):
        assert stage in eae, (stage, cmds)
    assert all(not check_command(c) for c in cmds)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen, in_block = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block and re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    links, in_block = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif not in_block:
            line = re.sub(r"`[^`]*`", "", line)
            links += re.findall(r"\]\(([^)\s]+)\)", line)
    return links


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http:, https:, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
