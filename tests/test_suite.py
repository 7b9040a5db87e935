"""The test suite's own rules. The plugin's tests (the files directly in this
folder, conftest.py and the fixture modules included) use nothing of the study
(scripts/): the study's tests are in tests/study/, which `make test` runs too.
None of them imports the benchmarks, and only those that `make test` leaves
out run a benchmark script. pytest says why a test was skipped."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

TESTS = Path(__file__).parent
STUDY, BENCHMARKS = "scripts", "benchmarks"
IMPORTERS = {"import_module", "__import__", "importorskip", "run_module"}  # name a module


def imported(tree: ast.AST) -> set[str]:
    """The top-level packages of every absolute import in `tree`, a function's
    own included, and of the modules that importlib, pytest.importorskip or
    runpy are given by name."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func.attr if isinstance(node.func, ast.Attribute) else None
            function = node.func.id if isinstance(node.func, ast.Name) else function
            if function in IMPORTERS and isinstance(node.args[0].value, str):
                names.add(node.args[0].value.split(".")[0])
    return names


def strings(tree: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def names_the_study(tree: ast.AST) -> bool:
    """Imports `scripts`, or names one of its modules or registered functions
    (`python -m scripts`, "scripts.TextCatBiLSTM.v1" in a config)."""
    return STUDY in imported(tree) or any(
        s == STUDY or s.startswith(f"{STUDY}.") for s in strings(tree)
    )


def left_out_of_make_test(tree: ast.Module) -> bool:
    """The module's `pytestmark` has `pytest.mark.benchmark` or `pytest.mark.slow`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
            return bool(marks & {"benchmark", "slow"})
    return False


def plugin_test_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


def test_the_rules_catch_what_they_look_for():
    for source in [
        "import scripts",
        "import scripts.components as components",
        "from scripts.evaluate import read_scalar_mix",
        "def test():\n    from scripts import commands",
        "importlib.import_module('scripts.compare')",
        "pytest.importorskip('scripts')",
        "run([sys.executable, '-m', 'scripts', 'train'])",
        "HEAD = {'@architectures': 'scripts.TextCatBiLSTM.v1', 'hidden_width': 8}",
    ]:
        assert names_the_study(ast.parse(source)), source
    for source in [
        "from .conftest import run",
        "from . import conftest",
        "# right-to-left and CJK scripts",
        "TEXT = 'the benchmark scripts'",
        "code = \"assert not any(name.startswith('scripts') for name in sys.modules)\"",
    ]:
        assert not names_the_study(ast.parse(source)), source
    assert imported(ast.parse("from benchmarks.memory import main")) == {BENCHMARKS}
    assert left_out_of_make_test(ast.parse("pytestmark = [pytest.mark.slow, skip_on_mac]"))
    assert left_out_of_make_test(ast.parse("pytestmark = pytest.mark.benchmark"))
    assert not left_out_of_make_test(ast.parse("pytestmark = pytest.mark.gpu"))


def test_the_plugins_tests_use_nothing_of_the_study():
    files = plugin_test_files()
    assert {"conftest.py", "fixture_corpus.py", Path(__file__).name} <= {p.name for p in files}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        assert STUDY not in imported(tree), (
            f"{path} imports the study: its tests go in tests/study/"
        )
        if path != Path(__file__):  # this file names the study to look for it
            assert not names_the_study(tree), (
                f"{path} names the study: its tests go in tests/study/"
            )


def test_the_plugins_tests_import_no_benchmark_and_run_one_only_outside_make_test():
    for path in plugin_test_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        assert BENCHMARKS not in imported(tree), path
        runs_one = any(s == BENCHMARKS or s.startswith(f"{BENCHMARKS}/") for s in strings(tree))
        if runs_one and path != Path(__file__):  # this file names them to look for them
            assert left_out_of_make_test(tree), f"{path}: pytestmark needs benchmark or slow"


def test_make_test_runs_the_studys_tests_too(pytestconfig):
    assert Path(pytestconfig.inipath) == ROOT / "pyproject.toml"
    assert pytestconfig.getini("testpaths") == ["tests"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test: .*\n\t\$\(BIN\)/python -m pytest -q\n", makefile, re.M)
    study = TESTS / "study"
    assert (study / "__init__.py").is_file() and len(list(study.glob("test_*.py"))) >= 5


def test_the_default_pytest_output_says_why_tests_were_skipped(tmp_path):
    """`make test` (pytest -q) showed `sssssss` and no reason: addopts has -rs."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.skip(reason='the AllenNLP fixtures are not here')\n"
        "def test_skipped():\n"
        "    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED [1] test_skips.py:4: the AllenNLP fixtures are not here" in result.stdout
