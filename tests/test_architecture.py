"""The import rules of docs/architecture.md, checked by reading the source (nothing is imported).

Every .py file of a package is parsed with `ast` and every import in it is collected, those
inside functions, methods and `if TYPE_CHECKING:` blocks included, and so are
`importlib.import_module("...")` and `__import__("...")` calls with a literal name:
  - eae_data imports neither torch, Ray, the model (eae_model) nor the platform (eae_platform);
  - eae_model imports neither Ray, MLflow, FastAPI nor the platform;
  - no module of the project imports a private name (`_x`, dunders aside) from another one;
  - the modules of eae_model.kernels import each other without a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Where the project's modules are, and the top-level names they are imported by.
SOURCES = ["eae_data", "eae_model", "platform/eae_platform", "tests", "benchmarks", "experiments", "jobs", "scripts"]
PROJECT = {"eae_data", "eae_model", "eae_platform", "tests", "benchmarks", "experiments", "jobs", "scripts"}
FORBIDDEN = {
    "eae_data": {"torch", "ray", "eae_model", "eae_platform"},
    "eae_model": {"ray", "mlflow", "fastapi", "eae_platform"},
}


def imported_modules(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, at any depth. Relative imports
    (`from . import x`) stay inside their own package and are left out."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def violations(package: str, forbidden: set[str]) -> list[str]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no .py files under {package}/"
    out = []
    for path in files:
        for line, module in imported_modules(path.read_text(), str(path)):
            if module.split(".")[0] in forbidden:
                out.append(f"{path.relative_to(REPO)}:{line}: imports {module}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_architecture(package):
    found = violations(package, FORBIDDEN[package])
    assert not found, (f"{package} may not import {', '.join(sorted(FORBIDDEN[package]))} "
                       "(docs/architecture.md):\n" + "\n".join(found))


def test_the_checker_sees_imports_at_any_depth():
    source = (
        "import os\n"
        "from . import sibling\n"
        "def f():\n"
        "    import ray.train\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from torch.nn import functional\n"
        "    return importlib.import_module('mlflow')\n"
    )
    assert sorted(imported_modules(source)) == [(1, "os"), (4, "ray.train"), (7, "torch.nn"), (8, "mlflow")]


# ----------------------------------------------------------------------------- private names, cycles


def module_of(path: Path) -> str:
    """The dotted name a .py file under REPO is imported as (platform/ is a folder, not a package)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "platform":
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> list[Path]:
    files = sorted(f for folder in SOURCES for f in (REPO / folder).rglob("*.py"))
    assert files, "no .py files in the project"
    return files


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module of a `from ... import`, relative ones resolved against `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(source: str, module: str = "m", is_package: bool = False, filename: str = "<source>") -> list[str]:
    """'line: from X import _y' for every private name (leading underscore, dunders aside) that
    `source`, the module `module`, imports from a module of the project, at any depth."""
    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, is_package)
            if target.split(".")[0] in PROJECT or node.level:
                found += [f"{node.lineno}: from {target} import {a.name}" for a in node.names if private(a.name)]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in PROJECT and any(private(p) for p in a.name.split("."))]
    return found


def import_graph(sources: dict[str, str], packages: frozenset = frozenset()) -> dict[str, set[str]]:
    """module -> the modules among `sources` (name -> source; `packages`: the names that are
    packages, their __init__) that it imports, at any depth: `from P import m` of a module m
    counts as importing P.m (not P), of any other name as importing P."""
    graph = {}
    for module, source in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(source, module)):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, module in packages)
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names}
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`, each as a path that ends where it starts, one per set of
    modules."""
    found, seen = [], set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph[path[-1]]):
            if nxt == path[0]:
                if frozenset(path) not in seen:
                    seen.add(frozenset(path))
                    found.append(path + [nxt])
            elif nxt not in path and nxt > path[0]:  # each cycle from its smallest module only
                walk(path + [nxt])

    for start in sorted(graph):
        walk([start])
    return found


def test_no_module_imports_a_private_name_from_another():
    found = []
    for path in project_files():
        found += [f"{path.relative_to(REPO)}:{hit}"
                  for hit in private_imports(path.read_text(), module_of(path), path.name == "__init__.py", str(path))]
    assert not found, ("private names imported across modules: make them public in the module that "
                       "owns them (eae_model/kernels/common.py for the kernels' shared helpers):\n" + "\n".join(found))


def test_the_kernels_import_each_other_without_a_cycle():
    folder = REPO / "eae_model" / "kernels"
    files = sorted(folder.glob("*.py"))
    assert files, "no eae_model/kernels/"
    sources = {module_of(f): f.read_text() for f in files}
    found = cycles(import_graph(sources, frozenset({"eae_model.kernels"})))
    assert not found, "import cycles in eae_model.kernels (shared names go to kernels.common):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_the_checkers_catch_the_old_kernels():
    """The kernels before eae_model.kernels: topk_kernels imported private helpers of
    triton_kernels, and it and hopper_kernels imported each other (one side inside a function)."""
    old = {
        "eae_model.triton_kernels": "import triton\ndef _check(H, E): ...\n",
        "eae_model.topk_kernels": (
            "from eae_model.triton_kernels import INTERPRET, _check, _multiprocessors, _tuned, m_key\n"
            "TILE_ROWS = 128\n"
            "def tile_top2(H, E):\n"
            "    from eae_model import hopper_kernels\n"
        ),
        "eae_model.hopper_kernels": "from eae_model.topk_kernels import TILE_ROWS\n",
        "eae_model.exact_topk": "def tile_top_k():\n    from eae_model.topk_kernels import TILE_ROWS, tile_top2\n",
    }
    assert private_imports(old["eae_model.topk_kernels"], "eae_model.topk_kernels") == [
        "1: from eae_model.triton_kernels import _check", "1: from eae_model.triton_kernels import _multiprocessors",
        "1: from eae_model.triton_kernels import _tuned"]
    assert private_imports("def f():\n    from .common import _x, __version__\n", "eae_model.kernels.topk") == [
        "2: from eae_model.kernels.common import _x"]
    assert private_imports("from os import _exit\nfrom torch import _C\nimport eae_model._hidden\n") == [
        "3: import eae_model._hidden"]
    assert cycles(import_graph(old)) == [["eae_model.hopper_kernels", "eae_model.topk_kernels", "eae_model.hopper_kernels"]]
    assert cycles(import_graph({"p": "from p import a\n", "p.a": "from . import b\n", "p.b": "import p.a\n"},
                               frozenset({"p"}))) == [["p.a", "p.b", "p.a"]]
