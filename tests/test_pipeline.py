"""The `elmo` pipe, its listeners and the mixes inside spaCy pipelines."""

import subprocess
import sys

import numpy
import pytest
import spacy
import torch
from spacy.training import Example

from elmo_spacy.layers import get_bilm, layer_weights, scalar_mix_node

from .conftest import SCALAR_MIX, TINY_BILM, examples, make_nlp

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width
FROZEN = {"@architectures": "elmo_spacy.ScalarMix.v1", "trainable": False, "seed": 3}
LEARNED = {"@architectures": "elmo_spacy.LearnedMix.v1", "nO": 24}


@pytest.fixture(scope="module")
def trained(bilm_dir, corpus_dir):
    """A pipeline initialised on the fixture corpus and updated a few times."""
    nlp = make_nlp(bilm_dir, grad_factor=1.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    for start in range(0, 48, 16):
        nlp.update(train[start : start + 16], sgd=optimizer)
    return nlp


def bilm_weights(nlp):
    return {k: v.clone() for k, v in get_bilm(nlp.get_pipe("elmo").model).state_dict().items()}


def mix_params(nlp):
    mix = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("mix")
    return {
        (node.id, name): node.get_param(name).copy()
        for node in mix.walk()
        for name in node.param_names
    }


@pytest.mark.parametrize(
    "text,n_tokens",
    [
        ("", 0),
        ("   ", 1),
        ("Hello", 1),
        ("Stocks  fell\n\nsharply .", 6),
        ("word " * 700, 700),
        ("x" * 10_000, 1),
    ],
)
def test_layers_shape_and_alignment(trained, text, n_tokens):
    doc = trained(text)
    assert len(doc) == n_tokens
    assert doc._.elmo.shape == (N_LAYERS, n_tokens, WIDTH)
    assert doc._.elmo.dtype == numpy.float32
    assert numpy.isfinite(doc._.elmo).all()
    assert doc.tensor.shape == (n_tokens, WIDTH)
    assert sum(doc.cats.values()) == pytest.approx(1.0, abs=1e-5) or n_tokens == 0
    for token in doc:
        assert numpy.array_equal(token._.elmo, doc._.elmo[:, token.i])
    if n_tokens >= 2:
        span = doc[1:3]
        assert numpy.array_equal(span._.elmo, doc._.elmo[:, 1:3])


def test_docs_get_the_same_layers_alone_and_in_a_batch(trained):
    texts = ["A short one.", "", "A much longer text about the bank of a river " * 5]
    batched = list(trained.pipe(texts, batch_size=3))
    for text, doc in zip(texts, batched):
        numpy.testing.assert_allclose(trained(text)._.elmo, doc._.elmo, atol=1e-5)


def test_context_changes_lstm_layers_not_layer_zero(trained):
    river = trained("She sat on the bank of the river.")
    money = trained("The bank raised interest rates.")
    a, b = river[4]._.elmo, money[1]._.elmo
    assert river[4].text == money[1].text == "bank"
    numpy.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)  # up to float rounding
    for layer in range(1, N_LAYERS):
        assert not numpy.allclose(a[layer], b[layer], atol=1e-4)
    numpy.testing.assert_array_equal(a, trained("She sat on the bank of the river.")[4]._.elmo)


def test_vectors_and_similarity_use_the_default_mix(trained):
    doc = trained("Oil prices rose again.")
    numpy.testing.assert_allclose(doc[0].vector, doc._.elmo[:, 0].mean(axis=0), rtol=1e-6)
    numpy.testing.assert_allclose(doc.vector, doc.tensor.mean(axis=0), rtol=1e-5)
    numpy.testing.assert_allclose(doc[1:3].vector, doc.tensor[1:3].mean(axis=0), rtol=1e-5)
    assert doc.has_vector and doc[0].has_vector
    # spaCy's own similarity over the tensor, with its note that it is one (W007)
    with pytest.warns(UserWarning, match="W007"):
        assert -1.0 <= doc.similarity(trained("Gas prices fell.")) <= 1.0


def _update_once(nlp, corpus_dir):
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    before = (bilm_weights(nlp), mix_params(nlp))
    losses = {}
    # Three updates: the output layer starts at zero (no gradient reaches the
    # listener in step 1), and spaCy applies a listened-to pipe's gradients when
    # it finishes its next update.
    for start in range(0, 48, 16):
        nlp.update(train[start : start + 16], sgd=optimizer, losses=losses)
    return before, (bilm_weights(nlp), mix_params(nlp)), losses


def test_trainable_mix_and_finetuned_bilm_change(bilm_dir, corpus_dir):
    (bilm0, mix0), (bilm1, mix1), losses = _update_once(
        make_nlp(bilm_dir, SCALAR_MIX, 1.0), corpus_dir
    )
    assert mix0 and all(not numpy.array_equal(mix0[k], mix1[k]) for k in mix0)  # λ and γ
    assert any(not torch.equal(bilm0[k], bilm1[k]) for k in bilm0)
    assert losses["elmo"] > 0


def test_frozen_mix_and_frozen_bilm_stay_exactly_equal(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, FROZEN, 0.0)
    (bilm0, mix0), (bilm1, mix1), losses = _update_once(nlp, corpus_dir)
    for name in mix0:
        numpy.testing.assert_array_equal(mix0[name], mix1[name])
    for k in bilm0:
        assert torch.equal(bilm0[k], bilm1[k]), k
    # The frozen λ are seeded-random, not uniform, and the textcat itself learned.
    weights = layer_weights(nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("mix"))
    assert weights.std() > 0.01
    assert losses["textcat"] > 0


@pytest.mark.parametrize("nO,dropout", [(24, 0.0), (None, 0.0), (None, 0.1)])
def test_learned_mix_outputs_its_width_and_trains(bilm_dir, corpus_dir, nO, dropout):
    nlp = make_nlp(bilm_dir, {**LEARNED, "nO": nO, "dropout": dropout}, 0.0)
    _update_once(nlp, corpus_dir)
    tok2vec = nlp.get_pipe("textcat").model.get_ref("tok2vec")
    vectors = tok2vec.predict([nlp("Markets rallied on Friday.")])
    assert vectors[0].shape == (5, nO or WIDTH)


def test_learned_mix_takes_empty_docs(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, LEARNED, 0.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    docs = list(nlp.pipe(["Oil rose.", "", "  "]))  # a batch of empty docs alone gets no scores
    assert all(sum(doc.cats.values()) == pytest.approx(1.0, abs=1e-5) for doc in docs)
    empty = Example(nlp.make_doc(""), nlp.make_doc(""))
    empty.reference.cats = dict(train[0].reference.cats)
    before = mix_params(nlp)
    # The first update moves only the head (its output layer starts at zero);
    # the second reaches the mix.
    for example in train[:2]:
        losses = nlp.update([empty, example], sgd=optimizer)
        assert numpy.isfinite(losses["textcat"]) and losses["textcat"] > 0
    after = mix_params(nlp)
    assert any(not numpy.array_equal(before[k], after[k]) for k in before)  # the mix learns
    # A batch without a token: spaCy's textcat skips it (no loss, no error).
    assert nlp.update([empty], sgd=optimizer)["textcat"] == 0.0
    model = nlp.get_pipe("textcat").model
    for node in model.walk():  # no NaN from pooling or mixing zero tokens
        for name in node.param_names:
            if node.has_param(name):
                assert numpy.isfinite(node.get_param(name)).all(), (node.name, name)
    for doc in nlp.pipe(["", "Oil rose."]):
        assert sum(doc.cats.values()) == pytest.approx(1.0, abs=1e-5)


def test_type_cache_works_inside_the_pipe_and_never_goes_stale(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    encoded = []
    encode = bilm.encoder.forward
    bilm.encoder.forward = lambda ids, *rest: (encoded.append(len(ids)), encode(ids, *rest))[1]
    texts = [eg.reference.text for eg in train[:20]]
    first = [doc._.elmo for doc in nlp.pipe(texts)]
    assert encoded and not bilm.training  # the pipe leaves the biLM in eval mode
    encoded.clear()
    second = [doc._.elmo for doc in nlp.pipe(texts)]
    assert encoded == []  # every token string came from the cache
    assert all(numpy.array_equal(a, b) for a, b in zip(first, second))
    # A fine-tuning step (thinc writes the weights through numpy, which torch
    # does not see) empties the cache, also when the cache was filled between
    # the backward pass and the step (the first update moves only the head,
    # whose output layer starts at zero):
    nlp.update(train[:8], sgd=optimizer)
    nlp.update(train[8:16], sgd=None)
    list(nlp.pipe(texts))
    nlp.get_pipe("elmo").finish_update(optimizer)
    fresh = spacy.blank("en").from_config(nlp.config).from_bytes(nlp.to_bytes())
    for doc, text in zip(nlp.pipe(texts), texts):
        assert numpy.array_equal(doc._.elmo, fresh(text)._.elmo)


def test_a_biLM_frozen_after_fine_tuning_stays_still(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    nlp.update(train[:16], sgd=optimizer)
    nlp.update(train[16:32], sgd=optimizer)
    listener = nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener")
    listener.attrs["grad_factor"] = 0.0
    nlp.update(train[:16], sgd=optimizer)  # applies the last gradient (one update late)
    before = bilm_weights(nlp)
    for start in range(0, 48, 16):
        nlp.update(train[start : start + 16], sgd=optimizer)
    after = bilm_weights(nlp)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "architecture",
    [
        {
            "@architectures": "spacy.TextCatReduce.v1",
            "exclusive_classes": True,
            "use_reduce_first": False,
            "use_reduce_last": False,
            "use_reduce_max": True,
            "use_reduce_mean": True,
        },
        {
            "@architectures": "spacy.TextCatEnsemble.v2",
            "linear_model": {
                "@architectures": "spacy.TextCatBOW.v3",
                "exclusive_classes": True,
                "ngram_size": 1,
                "no_output_layer": False,
            },
        },
    ],
)
def test_listener_works_under_spacy_textcat_models(bilm_dir, corpus_dir, architecture):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0, textcat_model=architecture)
    (bilm0, _), (bilm1, _), _ = _update_once(nlp, corpus_dir)
    assert any(not torch.equal(bilm0[k], bilm1[k]) for k in bilm0)
    cats = nlp("Shares of Google rose.").cats
    assert sum(cats.values()) == pytest.approx(1.0, abs=1e-5)


def _params(model):
    return {(n.id, p): n.get_param(p).copy() for n in model.walk() for p in n.param_names}


def test_the_public_readers_of_the_mix_and_the_cache(trained):
    node = trained.get_pipe("textcat").model.get_ref("tok2vec").get_ref("mix")
    weights = layer_weights(scalar_mix_node(node))
    assert float(weights.sum()) == pytest.approx(1.0) and len(weights) == 3
    bilm = get_bilm(trained.get_pipe("elmo").model)
    bilm.weights_changed()
    assert bilm.cache_info() == {"types": 0, "primed": 0, "packed": 0}
    doc = trained("Oil rose and oil fell.")
    assert bilm.cache_info()["types"] == len({t.text for t in doc})


def test_round_trip_is_bit_identical(trained, tmp_path):
    texts = ["Oil prices rose again.", "", "The bank of the river flooded.\n\nAgain."]
    trained.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    for text in texts:
        a, b = trained(text), loaded(text)
        assert numpy.array_equal(a._.elmo, b._.elmo)
        assert a.cats == b.cats
    from_bytes = spacy.blank("en").from_config(trained.config).from_bytes(trained.to_bytes())
    assert numpy.array_equal(from_bytes(texts[0])._.elmo, trained(texts[0])._.elmo)
    assert from_bytes(texts[0]).cats == trained(texts[0]).cats


def test_multiprocessing_gives_the_same_results(trained):
    texts = [f"Story number {i} about markets and sport." for i in range(12)]
    single = list(trained.pipe(texts))
    double = list(trained.pipe(texts, n_process=2, batch_size=4))
    for a, b in zip(single, double):
        numpy.testing.assert_allclose(a._.elmo, b._.elmo, atol=1e-6)
        assert a.cats == pytest.approx(b.cats, abs=1e-6)


def test_multiprocessing_keeps_layers_and_tensor_beside_static_vectors(bilm_dir):
    """Docs come back from the workers as bytes, with the layers and the
    tensor; where the vocab has static vectors, `.vector` is spaCy's (the
    static vector) and the tensor the layers' mix, as with spaCy's tok2vec."""
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    nlp.vocab.set_vector("markets", numpy.ones(4, dtype="float32"))
    texts = [f"Story number {i} about markets." for i in range(4)]
    for doc in nlp.pipe(texts, n_process=2, batch_size=2):
        numpy.testing.assert_allclose(doc.tensor[4], doc._.elmo[:, 4].mean(axis=0), atol=1e-6)
        numpy.testing.assert_array_equal(doc[4].vector, numpy.ones(4, dtype="float32"))


def test_missing_upstream_gives_an_actionable_error(trained):
    with trained.select_pipes(disable=["elmo"]):
        # The listener computes the layers itself when doc._.elmo is missing.
        assert sum(trained("Oil rose.").cats.values()) == pytest.approx(1.0, abs=1e-5)
    nlp = spacy.blank("en")
    nlp.add_pipe("textcat", config={"model": trained.config["components"]["textcat"]["model"]})
    nlp.get_pipe("textcat").add_label("A")
    nlp.get_pipe("textcat").add_label("B")
    with pytest.raises(ValueError, match="Add an `elmo` pipe"):
        nlp.initialize()


def test_frozen_training_runs_the_bilm_once_per_doc(bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    train = examples(nlp, corpus_dir / "train.spacy")[:32]
    optimizer = nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    calls = []
    predict = elmo.predict
    elmo.predict = lambda docs: calls.append(len(docs)) or predict(docs)
    for _ in range(3):
        for start in range(0, 32, 16):
            nlp.update(train[start : start + 16], sgd=optimizer)
    assert sum(calls) == 32
    assert elmo.frozen_cache.hits == 64 and len(elmo.frozen_cache) == 32
    cached = elmo.frozen_cache.get_or_compute([train[0].predicted], predict, elmo.model.ops)[0]
    numpy.testing.assert_allclose(cached, predict([train[0].predicted])[0], rtol=2e-3, atol=2e-3)
    # Fine-tuning changes the biLM: the cache is emptied and not used.
    nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("listener").attrs["grad_factor"] = 1.0
    nlp.update(train[:16], sgd=optimizer)
    assert len(elmo.frozen_cache) == 0


def test_a_pipeline_initialised_by_a_named_loader_saves_and_reloads_in_a_fresh_process(
    bilm_dir, tmp_path
):
    """[initialize.components.elmo.bilm_loader] names the format; the saved
    pipeline carries the biLM, and loads anywhere without the loader's files."""
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"run": {"state": "primed", "layers": [2, 0]}}})
    loader = {"@misc": "elmo_spacy.BiLMFolder.v1", "path": str(bilm_dir)}
    nlp.config["initialize"]["components"]["elmo"] = {"bilm_loader": loader}
    nlp.initialize()
    text = "Stocks fell sharply on Monday."
    numpy.save(tmp_path / "expected.npy", nlp(text)._.elmo)
    nlp.to_disk(tmp_path / "pipeline")
    code = (
        "import numpy, spacy\n"
        f"nlp = spacy.load({str(tmp_path / 'pipeline')!r})\n"
        f"expected = numpy.load({str(tmp_path / 'expected.npy')!r})\n"
        f"assert numpy.array_equal(nlp({text!r})._.elmo, expected)\n"
        "assert nlp.config['components']['elmo']['model']['run']['layers'] == [2, 0]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
