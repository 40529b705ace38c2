"""Tests of experiments/, whose scripts are not a package: experiment() loads one as a module."""

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def experiment(name: str):
    """experiments/NAME.py as a fresh module (each call runs it anew, so a test may set its
    globals), registered in sys.modules, where a dataclass of it looks its module up."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
