"""Each run setting's default is written once, in `RunSettings`: a literal
default of one of its fields anywhere else in the package (a parameter's
default, a config dict, a keyword, a command-line option, a config string)
fails here, naming the file and line."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import elmo_spacy
from elmo_spacy.bilm.runner import RUN_DEFAULTS, RunSettings

PACKAGE = Path(elmo_spacy.__file__).parent
HOME = PACKAGE / "bilm" / "runner.py"
# Pretraining's [training] precision is a setting of its own (what the
# training step computes in), not the run setting of the same name.
OTHERS = {PACKAGE / "pretrain" / "config.py"}
DEFAULTS = {
    f.name: getattr(RUN_DEFAULTS, f.name)
    for f in dataclasses.fields(RunSettings)
    if f.compare and getattr(RUN_DEFAULTS, f.name) is not None  # None: "not given" everywhere
}


def restated_defaults(source: str) -> list[str]:
    """Where `source` writes one of DEFAULTS' values for its field, as "line: what"."""
    found = []

    def literal(node: ast.AST | None, name: str) -> bool:
        if isinstance(node, ast.Call) and node.args:  # typer.Option(default, ...)
            node = node.args[0]
        return (
            isinstance(node, ast.Constant)
            and node.value == DEFAULTS[name]
            and (type(node.value) is type(DEFAULTS[name]))
        )

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args]
            pairs = list(zip(args[len(args) - len(node.args.defaults) :], node.args.defaults))
            pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d]
            for arg, default in pairs:
                if arg.arg in DEFAULTS and literal(default, arg.arg):
                    found.append(f"{default.lineno}: {arg.arg} = {ast.unparse(default)}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (
                    isinstance(key, ast.Constant)
                    and key.value in DEFAULTS
                    and literal(value, key.value)
                ):
                    found.append(f"{key.lineno}: {key.value!r}: {ast.unparse(value)}")
        elif (
            isinstance(node, ast.keyword) and node.arg in DEFAULTS and literal(node.value, node.arg)
        ):
            found.append(f"{node.lineno}: {node.arg}={ast.unparse(node.value)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            for name, value in DEFAULTS.items():
                shown = f'"{value}"' if isinstance(value, str) else str(value)
                if re.search(rf"^\s*{name}\s*=\s*{re.escape(shown)}\s*$", node.value, re.M):
                    found.append(f"{node.lineno}: {name} = {shown} in a config string")
    return found


def test_every_run_setting_has_a_default_to_check():
    assert set(DEFAULTS) == {"state", "precision", "max_batch_tokens", "window", "window_overlap"}


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if p != HOME and p not in OTHERS),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_run_setting_default_is_written_twice(path):
    found = restated_defaults(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(PACKAGE)} restates RunSettings' defaults: {found}"


def test_the_check_finds_each_way_of_writing_a_default_again():
    source = '''
def f(state: str = "zero", window=1024): ...
CONFIG = {"precision": "float32"}
RunSettings(max_batch_tokens=4096)
def cli(window_overlap: int = typer.Option(64, help="")): ...
MODEL = """
[model]
max_batch_tokens = 4096
"""
def fine(state: str = RUN_DEFAULTS.state, window=2048, layers=None): ...
'''
    assert sorted(line.split(":")[0] for line in restated_defaults(source)) == [
        "2",
        "2",
        "3",
        "4",
        "5",
        "6",
    ]
