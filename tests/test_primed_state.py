"""state = "primed": every sentence starts from the LSTM state that a warm-up
text leaves. Deterministic, the same in the pipe and the Embedder, kept by
a saved pipeline, recomputed when the weights change, and closer to the
reference ELMo's carried-state outputs than zero state."""

import copy

import numpy
import pytest
import spacy
import torch
from spacy.tokens import Doc

from elmo_spacy import Embedder
from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.bilm.runner import DEFAULT_WARMUP, Runner, RunSettings
from elmo_spacy.layers import get_bilm, get_runner

from .conftest import SCALAR_MIX, TINY_BILM, examples, make_nlp
from .test_embed import tiny_bilm_dir  # noqa: F401  (a fixture)

SENTENCES = [
    "The bank raised interest rates on Monday .".split(),
    "She sat on the bank of the river .".split(),
    [],
    "Oil prices rose again after the storm , traders said .".split(),
]
WARMUP = ["Markets were calm .", "Traders waited for the report ."]


@pytest.fixture()
def bilm() -> BiLM:
    torch.manual_seed(1)
    return BiLM(TINY_BILM, WordVocab.specials_only(), with_softmax=False).eval()


def test_the_primed_state_is_what_the_warmup_leaves(bilm):
    warmup = [s.split() for s in WARMUP]
    primed = bilm.primed_states(warmup)
    bilm.stateful = True  # the reference's carried state, one row
    with torch.inference_mode():
        for sentence in warmup:
            bilm(bilm.batch([sentence]))
    carried, bilm.stateful = bilm.carried.states, False
    for direction in ("forward", "backward"):
        assert len(primed[direction]) == TINY_BILM.n_layers
        for (h, c), (h_carried, c_carried) in zip(primed[direction], carried[direction]):
            assert h.shape == (1, TINY_BILM.projection_dim) and c.shape == (1, TINY_BILM.lstm_dim)
            torch.testing.assert_close(h, h_carried, rtol=0, atol=1e-6)
            torch.testing.assert_close(c, c_carried, rtol=0, atol=1e-6)
    assert bilm.primed_states(warmup) is primed  # kept while the weights stay
    with pytest.raises(ValueError, match="at least one warm-up sentence"):
        bilm.primed_states([])


def test_primed_vectors_do_not_depend_on_the_batch(bilm):
    embedder = Embedder(bilm, state="primed")
    together = embedder.embed(SENTENCES)
    backwards = Embedder(bilm, state="primed", max_batch_tokens=10).embed(SENTENCES[::-1])
    for sentence, a, b in zip(SENTENCES, together, backwards[::-1]):
        numpy.testing.assert_allclose(a, b, atol=1e-6)
        numpy.testing.assert_allclose(embedder.embed_sentence(sentence), a, atol=1e-6)
    assert together[2].shape == (TINY_BILM.n_layers + 1, 0, TINY_BILM.width)


def test_primed_state_moves_the_lstm_layers_only(bilm):
    zero = Embedder(bilm).embed(SENTENCES)
    primed = Embedder(bilm, state="primed").embed(SENTENCES)
    other = Embedder(bilm, state="primed", warmup=WARMUP).embed(SENTENCES)
    for z, p, o in zip(zero[:2], primed[:2], other[:2]):
        numpy.testing.assert_allclose(p[0], z[0], atol=1e-6)  # the token encoding
        for layer in range(1, TINY_BILM.n_layers + 1):
            assert not numpy.allclose(p[layer], z[layer], atol=1e-3)
            assert not numpy.allclose(p[layer], o[layer], atol=1e-3)


def test_the_primed_state_follows_the_weights(bilm):
    embedder = Embedder(bilm, state="primed")
    before = embedder.embed(SENTENCES[:1])[0]
    with torch.no_grad():  # an update torch sees (a new tensor version)
        bilm.forward_lstm.layers[0].weight_hh_l0.mul_(1.5)
    moved = embedder.embed(SENTENCES[:1])[0]
    fresh = Embedder(copy.deepcopy(bilm), state="primed").embed(SENTENCES[:1])[0]
    numpy.testing.assert_array_equal(moved, fresh)
    assert not numpy.allclose(moved[1:], before[1:], atol=1e-4)
    # An update torch cannot see (thinc writes weights through numpy), then
    # weights_changed(), as the pipe's optimiser step calls it.
    bilm.backward_lstm.layers[1].weight_ih_l0.detach().numpy()[...] *= 0.5
    bilm.weights_changed()
    fresh = Embedder(copy.deepcopy(bilm), state="primed").embed(SENTENCES[:1])[0]
    numpy.testing.assert_array_equal(embedder.embed(SENTENCES[:1])[0], fresh)


def test_the_pipe_and_the_embedder_agree_and_a_saved_pipe_keeps_the_state(
    tiny_bilm_dir,  # noqa: F811
    tmp_path,
):
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"run": {"state": "primed", "warmup": WARMUP}}})
    elmo.initialize(lambda: [], bilm_path=tiny_bilm_dir)
    docs = list(nlp.pipe(Doc(nlp.vocab, words=s) for s in SENTENCES))
    expected = Embedder(tiny_bilm_dir, state="primed", warmup=WARMUP).embed(SENTENCES)
    for doc, array in zip(docs, expected):
        numpy.testing.assert_array_equal(doc._.elmo, array)
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    loaded_settings = get_runner(loaded.get_pipe("elmo").model).settings
    assert loaded_settings.state == "primed"
    assert [" ".join(sentence) for sentence in loaded_settings.warmup] == WARMUP
    for doc in docs:
        numpy.testing.assert_array_equal(
            loaded(Doc(loaded.vocab, words=[t.text for t in doc]))._.elmo, doc._.elmo
        )
    # The config is the settings' one home: an override at loading wins over the saved one.
    overrides = {"components": {"elmo": {"model": {"run": {"state": "zero"}}}}}
    zero_nlp = spacy.load(tmp_path / "pipeline", config=overrides)
    assert get_runner(zero_nlp.get_pipe("elmo").model).settings.state == "zero"
    zero = zero_nlp(Doc(zero_nlp.vocab, words=SENTENCES[0]))._.elmo
    numpy.testing.assert_array_equal(zero, Embedder(tiny_bilm_dir).embed_sentence(SENTENCES[0]))
    # A pipe made with zero state keeps it when it reads another pipe's bytes (the biLM).
    copy_nlp = spacy.blank("en")
    copy_nlp.add_pipe("elmo").from_bytes(elmo.to_bytes())
    assert get_runner(copy_nlp.get_pipe("elmo").model).settings.state == "zero"
    saved = spacy.util.load_config(tmp_path / "pipeline" / "config.cfg")  # what to_disk saves
    assert saved["components"]["elmo"]["model"]["run"]["state"] == "primed"
    assert saved["components"]["elmo"]["model"]["run"]["warmup"] == WARMUP


def test_fine_tuning_recomputes_the_primed_state(tiny_bilm_dir, corpus_dir):  # noqa: F811
    nlp = make_nlp(
        tiny_bilm_dir, SCALAR_MIX, grad_factor=1.0, elmo_model={"run": {"state": "primed"}}
    )
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    nlp("Oil rose.")  # primes in inference mode, before the training steps
    default = [s.split() for s in DEFAULT_WARMUP]
    before = {
        k: [tuple(p.clone() for p in s) for s in v] for k, v in bilm.primed_states(default).items()
    }
    # As in test_fine_tuning_through_some_layers: the third update moves the biLM.
    for start in range(0, 24, 8):
        nlp.update(train[start : start + 8], sgd=optimizer)
    after = bilm.primed_states(default)
    assert not torch.equal(before["forward"][0][0], after["forward"][0][0])
    doc = nlp("Stocks fell sharply on Monday.")
    # The pipe's vectors are those of the updated weights, primed afresh.
    still = copy.deepcopy(bilm)
    fresh = Runner(still, RunSettings(state="primed")).embed([[t.text for t in doc]])[0]
    numpy.testing.assert_array_equal(doc._.elmo, fresh)


def test_bad_state_settings_are_refused():
    with pytest.raises(ValueError, match=r"run.state = 'warm': use one of"):
        spacy.blank("en").add_pipe("elmo", config={"model": {"run": {"state": "warm"}}})
    with pytest.raises(ValueError, match="run.warmup must be a list of sentences"):
        spacy.blank("en").add_pipe(
            "elmo", config={"model": {"run": {"warmup": "Markets were calm ."}}}
        )
    with pytest.raises(ValueError, match="warmup holds no token"):
        spacy.blank("en").add_pipe(
            "elmo", config={"model": {"run": {"state": "primed", "warmup": [" "]}}}
        )
