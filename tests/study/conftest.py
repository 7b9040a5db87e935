"""Helpers of the study's tests (tests/study/): the fixture corpus as the
study writes it, the study's commands run as project.yml runs them, and a
small block of the study's classifier head.

The tiny biLM of tests/conftest.py serves these tests too (one per session,
pretrained on whichever fixture corpus was asked for first)."""

import subprocess
import sys
from pathlib import Path

import pytest
import spacy

from scripts.agnews import CLASS_NAMES
from scripts.agnews_corpus import build_corpus

from .. import conftest
from ..conftest import DATA, ROOT


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """train.spacy, dev.spacy and pretrain.txt from the fixture CSV (120
    rows), written by the study's `build_corpus`, as `python -m scripts
    corpus` writes the real ones (a fifth of each class held out, seeded)."""
    out = tmp_path_factory.mktemp("study-corpus")
    build_corpus(
        spacy.blank("en"),
        DATA / "train.csv",
        out,
        unlabeled=DATA / "unlabeled.txt",
        class_names=CLASS_NAMES,
        dev_fraction=0.2,
        seed=0,
    )
    return out


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run a command as a user does: `scripts ...` is the study (`python -m
    scripts ...` from the repository root); anything else as tests/conftest.py's
    `run` does (`elmo-spacy ...`, the plugin's console script, or as given)."""
    if args[0] == "scripts":
        args = (sys.executable, "-m", "scripts", *args[1:])
        kwargs.setdefault("cwd", ROOT)
    return conftest.run(*args, **kwargs)


def run_workflow(tmp_path, workflow: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`spacy project run WORKFLOW` on a copy of the project (project.yml,
    configs, the study and its test data) in `tmp_path`, with `env`."""
    import shutil

    for name in ("project.yml", "configs", "scripts", "tests/data"):
        source = ROOT / name
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    command = [sys.executable, "-m", "spacy", "project", "run", workflow, str(tmp_path)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path
    )


def with_bag_of_words(linear_model_dropout: float = 0.0) -> dict:
    """A small block of the study's head (`scripts.TextCatBiLSTM.v1`; the test
    that uses it imports `scripts`, which registers it) with a bag-of-bigrams
    linear model."""
    return {
        "@architectures": "scripts.TextCatBiLSTM.v1",
        "hidden_width": 8,
        "mlp_width": 8,
        "linear_model_dropout": linear_model_dropout,
        "linear_model": {
            "@architectures": "spacy.TextCatBOW.v3",
            "exclusive_classes": True,
            "ngram_size": 2,
            "no_output_layer": True,
            "length": 1024,
        },
    }
