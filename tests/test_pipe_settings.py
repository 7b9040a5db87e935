"""The `elmo` pipe's settings and the seams between it, its listeners and spaCy's loop."""

import copy
import os
import subprocess
import sys
import warnings

import numpy
import pytest
import spacy
import torch
from spacy.training import Example
from spacy.training.initialize import init_nlp
from spacy.training.loop import train as spacy_train_loop
from spacy.util import registry
from thinc.api import ConfigValidationError

from elmo_spacy.layers import ElmoListener, get_bilm

from .conftest import CONFIGS, SCALAR_MIX, TINY_BILM, examples, make_nlp
from .kernels import forced_kernel

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width


def test_keep_some_layers_in_float16(bilm_dir, corpus_dir):
    full = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    full.initialize(lambda: examples(full, corpus_dir / "train.spacy"))
    nlp = make_nlp(
        bilm_dir, SCALAR_MIX, 0.0, elmo={"dtype": "float16"}, elmo_model={"run": {"layers": [0, 2]}}
    )
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
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0, elmo_model={"run": {"layers": [2, 0]}})
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
    nlp.add_pipe("elmo", config={"model": {"run": {"layers": [0, 3]}}})
    with pytest.raises(ValueError, match=r"layers = \[0, 3\], but the biLM has 3 layers"):
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"run": {"layers": [2, -1]}}})
    with pytest.raises(ValueError, match="names a layer twice"):
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    with pytest.raises(ValueError, match="dtype = 'float64'"):
        spacy.blank("en").add_pipe("elmo", config={"dtype": "float64"})


@pytest.mark.parametrize("name", ["layers", "state", "warmup", "precision"])
def test_a_run_setting_has_one_home_the_run_block(name):
    """Given to the pipe, to its model block or to an ElmoTok2Vec.v1 block
    instead of the `run` block, the config does not validate."""
    value = {"layers": [0], "state": "primed", "warmup": ["a ."], "precision": "float32"}[name]
    for config in ({name: value}, {"model": {name: value}}):
        with pytest.raises(ConfigValidationError, match=f"unexpected argument: '{name}'"):
            spacy.blank("en").add_pipe("elmo", config=config)
    block = {
        "@architectures": "elmo_spacy.ElmoTok2Vec.v1",
        "bilm": {"@architectures": "elmo_spacy.ElmoBiLM.v1"},
        "mix": {"@architectures": "elmo_spacy.ScalarMix.v1"},
        name: value,
    }
    with pytest.raises(ConfigValidationError, match=f"unexpected argument: '{name}'"):
        registry.resolve({"model": block})


def test_run_settings_are_checked_where_they_are_given(bilm_dir):
    """A value of the wrong type fails the config's validation, which names
    the block; a value out of range names the setting."""
    nlp = spacy.blank("en")
    with pytest.raises(ConfigValidationError, match=r"model.run -> max_batch_tokens"):
        nlp.add_pipe("elmo", config={"model": {"run": {"max_batch_tokens": "many"}}})
    with pytest.raises(ValueError, match=r"run.max_batch_tokens = 0: give at least 1"):
        nlp.add_pipe("elmo", config={"model": {"run": {"max_batch_tokens": 0}}})
    with pytest.raises(ConfigValidationError, match="unexpected argument: 'windows'"):
        nlp.add_pipe("elmo", config={"model": {"run": {"windows": 8}}})


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
    assert len(elmo.frozen_cache) == 0 and elmo.frozen_cache.size == 0


def test_no_cache_means_no_rounding(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    elmo = nlp.get_pipe("elmo")
    elmo.frozen_cache.max_size = 0
    train = examples(nlp, corpus_dir / "train.spacy")[:4]
    nlp.initialize(lambda: train)
    docs = [eg.predicted for eg in train]
    assert all(
        numpy.array_equal(a, b)
        for a, b in zip(
            elmo.frozen_cache.get_or_compute(docs, elmo.predict, elmo.model.ops), elmo.predict(docs)
        )
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
    with forced_kernel("fused"), warnings.catch_warnings():  # torch's nn.LSTM
        warnings.simplefilter("error")
        nlp("No warning from the LSTM with projections, please.")


def _bilm_grads(bilm) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in bilm.named_parameters() if p.grad is not None}


def test_two_pipes_listening_to_one_elmo_pipe_both_reach_its_weights(bilm_dir, corpus_dir):
    """The biLM's gradient for a batch is the sum of what each listener sends."""
    overrides = {"paths.bilm": str(bilm_dir), "components.textcat.model.tok2vec.grad_factor": 1.0}
    config = spacy.util.load_config(CONFIGS / "textcat_tiny.cfg", overrides=overrides)
    second = copy.deepcopy(dict(config["components"]["textcat"]))
    second["model"]["tok2vec"]["grad_factor"] = 0.5
    config["components"]["textcat2"] = second
    config["nlp"]["pipeline"] = ["elmo", "textcat", "textcat2"]
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    train = examples(nlp, corpus_dir / "train.spacy")
    nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    assert elmo.listening_components == ["textcat", "textcat2"]
    bilm = get_bilm(elmo.model)
    batch = train[:4]
    docs = [eg.predicted for eg in batch]
    rng = numpy.random.default_rng(0)
    shapes = [(N_LAYERS, len(doc), WIDTH) for doc in docs]
    sent = {
        listener: [rng.normal(size=shape).astype("f") for shape in shapes]
        for listener in elmo.listeners
    }

    def gradient(senders) -> dict[str, torch.Tensor]:
        bilm.zero_grad(set_to_none=True)
        elmo.update(batch, drop=0.0)  # broadcasts the batch; no sgd: the grads stay
        for listener in elmo.listeners:  # the last one's backprop runs the biLM's
            outputs, backprop = listener(docs, is_train=True)
            backprop(sent[listener] if listener in senders else [0 * d for d in outputs])
        return _bilm_grads(bilm)

    first, second = elmo.listeners
    both, alone_1, alone_2 = gradient({first, second}), gradient({first}), gradient({second})
    assert both.keys() == alone_1.keys() == alone_2.keys()
    assert "encoder.projection.weight" in both and "forward_lstm.layers.1.weight_hh_l0" in both
    for name in both:
        torch.testing.assert_close(both[name], alone_1[name] + alone_2[name], rtol=1e-3, atol=1e-5)
    assert not torch.allclose(
        both["encoder.projection.weight"], alone_1["encoder.projection.weight"]
    )
    assert not torch.allclose(
        both["encoder.projection.weight"], alone_2["encoder.projection.weight"]
    )


def _count_rows(bilm) -> list[int]:
    """The rows (pieces of docs) of each batch that `bilm` runs, from now on."""
    rows, batch = [], bilm.batch

    def counting_batch(tokens, *args, **kwargs):
        rows.append(len(tokens))
        return batch(tokens, *args, **kwargs)

    bilm.batch = counting_batch
    return rows


def test_a_small_max_batch_tokens_gives_what_a_large_one_gives(bilm_dir, corpus_dir):
    texts = [eg.reference.text for eg in examples(spacy.blank("en"), corpus_dir / "dev.spacy")]
    texts += ["", "Short.", " ".join(["Markets rallied again ."] * 40)]
    results, rows = {}, {}
    for max_batch_tokens in (4096, 16):
        nlp = spacy.blank("en")
        elmo = nlp.add_pipe(
            "elmo", config={"model": {"run": {"max_batch_tokens": max_batch_tokens}}}
        )
        elmo.initialize(lambda: [], bilm_path=str(bilm_dir))
        rows[max_batch_tokens] = _count_rows(get_bilm(elmo.model))
        results[max_batch_tokens] = [doc._.elmo for doc in nlp.pipe(texts, batch_size=64)]
    assert max(rows[16]) < max(rows[4096]) and len(rows[16]) > len(rows[4096])
    assert len(results[16]) == len(texts)
    for small, large in zip(results[16], results[4096]):
        assert small.shape == large.shape
        numpy.testing.assert_allclose(small, large, rtol=1e-5, atol=1e-5)


def test_fine_tuning_runs_a_doc_longer_than_the_window_in_the_windows_of_prediction(
    bilm_dir, corpus_dir
):
    """A doc longer than the window runs in the same pieces in training as in
    prediction (each token sees the same context, memory stays bounded), and
    its gradient reaches the biLM from past the first window."""
    nlp = make_nlp(
        bilm_dir, SCALAR_MIX, 1.0, elmo_model={"run": {"window": 40, "window_overlap": 8}}
    )
    train = examples(nlp, corpus_dir / "train.spacy")
    nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    text = " ".join(["Oil", "prices", "rose", "as", "markets", "fell", "."] * 30)
    doc = nlp.make_doc(text)
    example = Example(doc, nlp.make_doc(text))
    example.reference.cats = dict(train[0].reference.cats)
    whole = spacy.blank("en")
    whole.add_pipe("elmo").initialize(lambda: [], bilm_path=str(bilm_dir))  # window 1024
    bilm = get_bilm(elmo.model)
    bilm.zero_grad(set_to_none=True)
    elmo.update([example], drop=0.0)
    (listener,) = elmo.listeners
    (outputs,), backprop = listener([doc], is_train=True)
    assert outputs.shape == (N_LAYERS, 210, WIDTH)
    numpy.testing.assert_allclose(outputs, nlp(text)._.elmo, rtol=1e-4, atol=1e-5)
    assert not numpy.allclose(outputs, whole(text)._.elmo, atol=1e-5)  # not the whole doc
    d_outputs = numpy.zeros_like(outputs)
    d_outputs[:, -1] = 1.0  # the last token only, far past the first window
    backprop([d_outputs])
    grads = _bilm_grads(bilm)
    assert all(torch.isfinite(g).all() for g in grads.values())
    for name in ("encoder.projection.weight", "forward_lstm.layers.0.weight_ih_l0"):
        assert grads[name].abs().sum() > 0
