"""The `elmo` pipe's `store` setting: what stays on a Doc once the pipeline's
listeners have read its layers, and what DocBin then keeps."""

import numpy
import pytest
import spacy
from spacy.tokens import DocBin

from elmo_spacy.extensions import restore_views

from .conftest import SCALAR_MIX, TINY_BILM, examples, make_nlp

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width
TEXTS = ["Stocks fell sharply on Monday.", "Oil prices rose as markets fell in Tokyo ."]


@pytest.fixture(scope="module")
def reference(bilm_dir, corpus_dir):
    """What a pipeline that keeps every layer gives: the docs' layers, tensors and cats."""
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy")[:8])
    docs = list(nlp.pipe(TEXTS))
    return nlp, docs


def pipeline(reference, **elmo):
    """The reference pipeline's weights under other `elmo` settings."""
    nlp, _ = reference
    config = nlp.config.copy()
    config["components"]["elmo"].update(elmo)
    other = spacy.util.load_model_from_config(config, auto_fill=True)
    other.from_bytes(nlp.to_bytes())
    return other


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("store", ["layers", [2], [-1, 0], "tensor", "nothing"])
def test_what_each_store_keeps_on_the_doc_and_in_a_docbin(reference, store, dtype):
    _, expected = reference
    nlp = pipeline(reference, store=store, dtype=dtype)
    docs = list(nlp.pipe(TEXTS))
    for doc, full in zip(docs, expected):
        # the listener got every layer in float32, whatever the doc keeps
        assert doc.cats == full.cats
        if store == "nothing":
            assert doc._.elmo is None and doc.tensor.size == 0
            continue
        numpy.testing.assert_array_equal(doc.tensor, full.tensor)
        if store == "tensor":
            assert doc._.elmo is None
            continue
        rows = slice(None) if store == "layers" else [i % N_LAYERS for i in store]
        assert doc._.elmo.dtype == dtype
        numpy.testing.assert_array_equal(doc._.elmo, full._.elmo[rows].astype(dtype))
    stored = DocBin(store_user_data=True, docs=docs).to_bytes()
    for doc, back in zip(docs, DocBin().from_bytes(stored).get_docs(nlp.vocab)):
        if doc._.elmo is None:
            assert back._.elmo is None
        else:
            numpy.testing.assert_array_equal(back._.elmo, doc._.elmo)
            restore_views(back)
            if store == "layers":  # the mean of every layer, as before (of their rounding)
                tolerance = 0 if dtype == "float32" else 1e-2
                numpy.testing.assert_allclose(back.tensor, doc.tensor, rtol=0, atol=tolerance)


def test_docbins_shrink_with_what_is_kept(reference):
    sizes = {}
    for store in ("layers", [0], "tensor"):
        for dtype in ("float32", "float16"):
            docs = list(pipeline(reference, store=store, dtype=dtype).pipe(TEXTS))
            sizes[str(store), dtype] = len(DocBin(store_user_data=True, docs=docs).to_bytes())
    # DocBin compresses: each choice keeps about its share of the layers' bytes
    assert sizes["[0]", "float32"] < 0.5 * sizes["layers", "float32"]
    assert sizes["layers", "float16"] < 0.7 * sizes["layers", "float32"]
    assert sizes["tensor", "float32"] < 0.5 * sizes["[0]", "float32"]


def test_a_doc_that_keeps_fewer_layers_is_read_again_in_full(reference):
    """A listener never reads the cut layers: a pipe run again on the doc gets
    every layer from the elmo pipe."""
    _, expected = reference
    nlp = pipeline(reference, store=[0])
    doc = nlp(TEXTS[0])
    assert doc._.elmo.shape[0] == 1
    doc.cats = {}
    assert nlp.get_pipe("textcat")(doc).cats == expected[0].cats


def test_a_disabled_listener_leaves_every_layer_until_asked(reference):
    _, expected = reference
    nlp = pipeline(reference, store="tensor")
    with nlp.select_pipes(disable=["textcat"]):
        doc = nlp(TEXTS[0])
    numpy.testing.assert_array_equal(doc._.elmo, expected[0]._.elmo)  # nothing lost
    nlp.get_pipe("elmo").store_layers(doc)
    assert doc._.elmo is None
    numpy.testing.assert_array_equal(doc.tensor, expected[0].tensor)


def test_an_elmo_pipe_without_listeners_stores_at_once(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"store": [1], "dtype": "float16"})
    nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    assert nlp(TEXTS[0])._.elmo.shape == (1, 6, WIDTH)


def test_the_store_setting_is_checked_and_saved(bilm_dir, reference, tmp_path):
    with pytest.raises(ValueError, match=r"\[components.elmo\] store = 'some'"):
        spacy.blank("en").add_pipe("elmo", config={"store": "some"})
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"run": {"layers": [0, 1]}}, "store": [2]})
    with pytest.raises(ValueError, match=r"store = \[2\] names layers \[2\] that the pipe does"):
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    nlp = pipeline(reference, store=[2], dtype="float16")
    nlp.to_disk(tmp_path / "nlp")
    loaded = spacy.load(tmp_path / "nlp")
    assert loaded.get_pipe("elmo").cfg["store"] == [2]
    assert loaded(TEXTS[0])._.elmo.shape == (1, 6, WIDTH)
