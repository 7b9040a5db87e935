"""The study's own pipeline parts (scripts/components.py)."""

import numpy
import pytest
import spacy

from scripts.components import EveryDocTextCategorizer

from ..conftest import (  # noqa: F401
    CONFIGS,
    SCALAR_MIX,
    corpus_of,
    examples,
    make_nlp,
)
from .conftest import with_bag_of_words


def test_the_every_doc_textcat_scores_empty_docs_too(bilm_dir, corpus_dir):
    overrides = {"paths.bilm": str(bilm_dir)}
    config = spacy.util.load_config(CONFIGS / "textcat_scalar.cfg", overrides=overrides)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert isinstance(nlp.get_pipe("textcat"), EveryDocTextCategorizer)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    assert sum(nlp("").cats.values()) == pytest.approx(1.0, abs=1e-5)
    assert sum(nlp("Oil prices rose.").cats.values()) == pytest.approx(1.0, abs=1e-5)


def _params(model):
    return {(n.id, p): n.get_param(p).copy() for n in model.walk() for p in n.param_names}


@pytest.mark.parametrize("linear_model_dropout", [0.0, 1.0])
def test_bag_of_words_scores_are_added_and_can_be_left_out(
    bilm_dir, corpus_dir, linear_model_dropout
):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0, textcat_model=with_bag_of_words(linear_model_dropout))
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    summed = next(n for n in nlp.get_pipe("textcat").model.walk() if n.name == "sum_scores")
    linear, deep = summed.layers
    linear0, deep0 = _params(linear), _params(deep)
    for start in range(0, 48, 16):
        nlp.update(train[start : start + 16], sgd=optimizer)
    linear_changed = [not numpy.array_equal(v, _params(linear)[k]) for k, v in linear0.items()]
    assert any(linear_changed) == (linear_model_dropout == 0.0)
    assert any(not numpy.array_equal(v, _params(deep)[k]) for k, v in deep0.items())
    # At prediction time both models' scores count, whatever the dropout.
    docs = [nlp.make_doc("Shares of Google rose."), nlp.make_doc("")]
    docs = [nlp.get_pipe("elmo")(doc) for doc in docs]
    scores = linear.predict(docs) + deep.predict(docs)
    expected = numpy.exp(scores) / numpy.exp(scores).sum(axis=1, keepdims=True)
    numpy.testing.assert_allclose(nlp.get_pipe("textcat").model.predict(docs), expected, rtol=1e-5)
    assert linear.predict(docs)[1].tolist() == [0.0] * len(nlp.get_pipe("textcat").labels)


def test_read_scalar_mix_gives_the_mix_as_numbers(bilm_dir, corpus_dir):
    from elmo_spacy.layers import layer_weights
    from scripts.evaluate import read_scalar_mix

    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy")[:8])
    mix = read_scalar_mix(nlp.get_pipe("textcat").model)
    node = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("mix")
    assert mix["layer_weights"] == pytest.approx(layer_weights(node).tolist())
    assert sum(mix["layer_weights"]) == pytest.approx(1.0) and len(mix["layer_weights"]) == 3
    assert mix["trainable"] is True and mix["gamma"] > 0 and mix["layer_norm"] is True
    bilstm_only = {"@architectures": "scripts.TextCatBiLSTM.v1", "hidden_width": 8}
    learned_mix = {"@architectures": "elmo_spacy.LearnedMix.v1", "nO": 24}
    learned = make_nlp(bilm_dir, learned_mix, 0.0, textcat_model=bilstm_only)
    assert read_scalar_mix(learned.get_pipe("textcat").model) is None
