"""The study's own pipeline parts (scripts/components.py)."""

import pytest
import spacy

from scripts.components import EveryDocTextCategorizer

from .conftest import CONFIGS, corpus_of, examples, make_nlp  # noqa: F401


def test_the_every_doc_textcat_scores_empty_docs_too(bilm_dir, corpus_dir):
    overrides = {"paths.bilm": str(bilm_dir)}
    config = spacy.util.load_config(CONFIGS / "textcat_scalar.cfg", overrides=overrides)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert isinstance(nlp.get_pipe("textcat"), EveryDocTextCategorizer)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    assert sum(nlp("").cats.values()) == pytest.approx(1.0, abs=1e-5)
    assert sum(nlp("Oil prices rose.").cats.values()) == pytest.approx(1.0, abs=1e-5)
