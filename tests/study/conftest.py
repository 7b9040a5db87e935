"""Helpers of the study's tests (tests/study/): the study's commands run as
project.yml runs them, and a small block of the study's classifier head.

The fixtures of tests/conftest.py (the tiny biLM, the fixture corpus) serve
these tests too."""

import subprocess
import sys

from .. import conftest
from ..conftest import ROOT


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run a command as a user does: `scripts ...` is the study (`python -m
    scripts ...` from the repository root); anything else as tests/conftest.py's
    `run` does (`elmo-spacy ...`, the plugin's console script, or as given)."""
    if args[0] == "scripts":
        args = (sys.executable, "-m", "scripts", *args[1:])
        kwargs.setdefault("cwd", ROOT)
    return conftest.run(*args, **kwargs)


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
