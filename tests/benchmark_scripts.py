"""The benchmark scripts as modules, for the tests of the study's benchmarks."""

import importlib.util
from types import ModuleType

import pytest

from .conftest import ROOT


def load_benchmark(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/NAME.py as a module (the benchmarks are scripts, not a
    package), with benchmarks/ on sys.path for the modules it imports."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    return benchmark
