"""The test suite's own rules and fixture. The plugin's tests (the modules
directly in this folder) hold nothing of the study (scripts/, tested in
tests/study/) or of the benchmarks; pytest says why a test was skipped; the
fixture corpus is what its docstring says."""

import importlib
import types

import pytest
from spacy.tokens import DocBin
from spacy.vocab import Vocab

from .conftest import CLASSES, TESTS


def origin(value: object) -> str:
    """The top-level package a module, or an object defined in one, comes from."""
    name = value.__name__ if isinstance(value, types.ModuleType) else None
    name = name or getattr(value, "__module__", None) or ""
    return name.split(".")[0]


def test_the_plugins_tests_hold_nothing_of_the_study_or_the_benchmarks():
    for path in sorted([*TESTS.glob("test_*.py"), TESTS / "conftest.py"]):
        try:
            module = importlib.import_module(f"tests.{path.stem}")
        except pytest.skip.Exception:  # a module that skips here (no Triton, no GPU...)
            continue
        held = {name for name, value in vars(module).items() if not name.startswith("__")}
        foreign = sorted(
            name for name in held if origin(vars(module)[name]) in {"scripts", "benchmarks"}
        )
        assert not foreign, f"{path.name} imports {foreign}: its tests go in tests/study/"


def test_the_default_pytest_output_says_why_tests_were_skipped(pytestconfig):
    """`make test` (pytest -q) showed `sssssss` and no reason: addopts has -rs."""
    assert "s" in pytestconfig.option.reportchars


def test_the_fixture_corpus_holds_out_dev_and_pretrains_on_train_only(corpus_dir):
    vocab = Vocab()
    docs = {
        name: list(DocBin().from_disk(corpus_dir / f"{name}.spacy").get_docs(vocab))
        for name in ("train", "dev")
    }
    assert (len(docs["train"]), len(docs["dev"])) == (96, 24)
    for split in docs.values():
        assert all(sorted(d.cats.values()) == [0.0, 0.0, 0.0, 1.0] for d in split)
    assert {c for d in docs["dev"] for c, v in d.cats.items() if v} == set(CLASSES)
    pretrain = (corpus_dir / "pretrain.txt").read_text(encoding="utf-8").splitlines()
    assert pretrain[: len(docs["train"])] == [d.text for d in docs["train"]]
    assert not {d.text for d in docs["dev"]} & set(pretrain)
    assert len(pretrain) > len(docs["train"]) and all(t.strip() for t in pretrain)
