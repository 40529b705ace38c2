"""The import rules of docs/architecture.md, checked by reading the source (nothing is imported).

Every .py file of a package is parsed with `ast` and every import in it is collected, those
inside functions, methods and `if TYPE_CHECKING:` blocks included, and so are
`importlib.import_module("...")` and `__import__("...")` calls with a literal name:
  - eae_data imports neither torch, Ray, the model (eae_model) nor the platform (eae_platform);
  - eae_model imports neither Ray, MLflow, FastAPI nor the platform.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
