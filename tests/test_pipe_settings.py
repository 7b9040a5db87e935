"""The `elmo` pipe's settings and the seams between it, its listeners and spaCy's loop."""

import os
import subprocess
import sys
import warnings

import numpy
import pytest
import spacy
import torch
from spacy.training.initialize import init_nlp
from spacy.training.loop import train as spacy_train_loop

from elmo_spacy.layers import ElmoListener, get_bilm

from .conftest import CONFIGS, SCALAR_MIX, TINY_BILM, examples, make_nlp

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width


def test_keep_some_layers_in_float16(bilm_dir, corpus_dir):
    full = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    full.initialize(lambda: examples(full, corpus_dir / "train.spacy"))
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    nlp.get_pipe("elmo").layers = [0, 2]
    nlp.get_pipe("elmo").dtype = "float16"
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    text = "Stocks fell sharply on Monday."
    doc = nlp(text)
    assert doc._.elmo.shape == (2, len(doc), WIDTH) and doc._.elmo.dtype == numpy.float16
    numpy.testing.assert_allclose(doc._.elmo, full(text)._.elmo[[0, 2]], rtol=1e-3, atol=1e-3)
    assert doc[1]._.elmo.shape == (2, WIDTH)
    assert doc[1].vector.dtype == numpy.float32
    listener = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener")
    assert listener.get_dim("n_output_layers") == 2
    nlp.update(train[:8], sgd=optimizer)
    assert sum(nlp(text).cats.values()) == pytest.approx(1.0, abs=1e-5)


def test_fine_tuning_through_some_layers(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0)
    nlp.get_pipe("elmo").layers = [2, 0]
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    # nlp.update applies the biLM's gradient one call late, and the first is zero (the
    # textcat's output layer starts at zero): the third call moves the biLM.
    for start in range(0, 24, 8):
        nlp.update(train[start : start + 8], sgd=optimizer)
    after = bilm.state_dict()
    # The gradient of both kept layers reaches the biLM: the LSTMs and the token encoder move.
    assert not torch.equal(
        before["backward_lstm.layers.1.weight_hh_l0"], after["backward_lstm.layers.1.weight_hh_l0"]
    )
    assert not torch.equal(before["encoder.projection.weight"], after["encoder.projection.weight"])


def test_layers_the_biLM_does_not_have_are_refused(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"layers": [0, 3]})
    with pytest.raises(ValueError, match=r"layers = \[0, 3\], but the biLM has 3 layers"):
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"layers": [2, -1]})
    with pytest.raises(ValueError, match="names a layer twice"):
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    with pytest.raises(ValueError, match="dtype = 'float64'"):
        spacy.blank("en").add_pipe("elmo", config={"dtype": "float64"})


def test_exclude_is_honoured(bilm_dir, tmp_path):
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo")
    nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    assert len(elmo.to_bytes(exclude=["bilm"])) < 100 < len(elmo.to_bytes())
    elmo.to_disk(tmp_path / "elmo", exclude=["bilm"])
    assert not (tmp_path / "elmo" / "bilm").exists()
    elmo.to_disk(tmp_path / "elmo")
    other = spacy.blank("en").add_pipe("elmo", config={"model": {"bilm": {"projection_dim": 4}}})
    other.model.initialize(X=[nlp.make_doc("a b")])
    other.from_disk(tmp_path / "elmo", exclude=["bilm"])
    assert other.model.get_dim("nO") == 8  # kept its own biLM
    other.from_bytes(elmo.to_bytes(), exclude=["bilm"])
    assert other.model.get_dim("nO") == 8
    other.from_bytes(elmo.to_bytes())
    assert other.model.get_dim("nO") == WIDTH


def test_listener_forgets_the_batch_after_backprop(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    nlp.update(train[:8], sgd=optimizer)
    listener = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener")
    assert isinstance(listener, ElmoListener)
    assert listener._outputs is None and listener._backprop is None


def test_scalar_mix_dropout_only_in_training(bilm_dir, corpus_dir):
    mix = {**SCALAR_MIX, "dropout": 0.5}
    nlp = make_nlp(bilm_dir, mix, 0.0)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    tok2vec = nlp.get_pipe("textcat").model.get_ref("tok2vec")
    docs = [nlp("Stocks fell sharply on Monday.")]
    predicted = tok2vec.predict(docs)[0]
    assert numpy.array_equal(predicted, tok2vec.predict(docs)[0])
    trained, backprop = tok2vec.begin_update(docs)
    dropped = trained[0] == 0
    assert 0.3 < dropped.mean() < 0.7
    numpy.testing.assert_allclose(trained[0][~dropped], 2 * predicted[~dropped], rtol=1e-5)


def test_training_cache_is_released_when_training_ends(bilm_dir, corpus_dir):
    overrides = {
        "paths.bilm": str(bilm_dir),
        "paths.train": str(corpus_dir / "train.spacy"),
        "paths.dev": str(corpus_dir / "dev.spacy"),
        "components.textcat.model.tok2vec.grad_factor": 0.0,
        "training.max_steps": 6,
        "training.eval_frequency": 3,
    }
    nlp = init_nlp(spacy.util.load_config(CONFIGS / "textcat_tiny.cfg", overrides=overrides))
    elmo = nlp.get_pipe("elmo")
    sizes = []
    real_update = elmo.update
    elmo.update = lambda *a, **k: (real_update(*a, **k), sizes.append(len(elmo.frozen_cache)))[0]
    spacy_train_loop(nlp, None)
    assert max(sizes) > 0 and elmo.frozen_cache.hits + elmo.frozen_cache.misses > 0
    assert len(elmo.frozen_cache) == 0 and elmo.frozen_cache.nbytes == 0


def test_no_cache_means_no_rounding(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    elmo = nlp.get_pipe("elmo")
    elmo.frozen_cache.max_bytes = 0
    train = examples(nlp, corpus_dir / "train.spacy")[:4]
    nlp.initialize(lambda: train)
    docs = [eg.predicted for eg in train]
    assert all(
        numpy.array_equal(a, b)
        for a, b in zip(elmo.frozen_cache.get_or_compute(docs, elmo.predict), elmo.predict(docs))
    )
    assert len(elmo.frozen_cache) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_importing_the_plugin_leaves_forked_children_alone():
    code = (
        "import os, sys, torch, elmo_spacy\n"
        "torch.set_num_threads(2)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(torch.get_num_threads())\n"
        "print(os.waitpid(pid, 0)[1] >> 8)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_no_onednn_projection_warning(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    bilm.forward_lstm.kernel = bilm.backward_lstm.kernel = "fused"  # torch's nn.LSTM
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nlp("No warning from the LSTM with projections, please.")
