"""Any text in, correct shapes out; the same seed gives the same model."""

import numpy
import pytest
import spacy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from spacy.tokens import Doc

from elmo_spacy.layers import get_bilm, get_runner
from elmo_spacy.pretrain import PretrainConfig, pretrain
from elmo_spacy.pretrain.texts import read_texts

from .conftest import (
    DATA,
    SCALAR_MIX,
    TINY_BILM,
    corpus_of,
    examples,
    make_nlp,
    tokenize,
)

N_LAYERS, WIDTH = TINY_BILM.n_layers + 1, TINY_BILM.width

# Pieces that have broken tokenizers and encoders elsewhere: white space and
# control characters, NUL, zero-width and combining marks, emoji sequences,
# right-to-left and CJK scripts, lone surrogates, AG News entity debris.
PIECES = [
    *["", " ", "\n", "\t", "\r\n", "\x00", "\x07", "\x1b[0m", "\u200b", "\u200f", "\ufeff"],
    *["e\u0301", "\u0915\u094d\u0937", "👍🏽", "🏳️‍🌈", "👨‍👩‍👧", "مرحبا بالعالم", "שָׁלוֹם"],
    *["東京の株価", "한국어", "\ud800", "\udfff", "bank", "Wall St.", "U.S.", "#36;", "&amp;"],
]
TEXTS = st.one_of(
    st.text(max_size=200),
    st.text(st.characters(categories=["Cc", "Cs", "Mn", "Zs", "So", "Lo", "Cf"]), max_size=100),
    st.lists(st.sampled_from(PIECES), max_size=60).map(" ".join),
    st.lists(st.sampled_from(PIECES), max_size=60).map("".join),
    st.integers(1, 10_000).map(lambda n: "x" * n),  # one token of up to 10,000 characters
)
# Tokens as another tokenizer might cut them (spaces inside, no spaces between).
FOREIGN_WORDS = st.lists(st.text(min_size=1, max_size=30), max_size=50)


def _examples(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# The default run draws 500 + 300 + 300 = 1,100 examples; `make test-slow` ten times more.
SCALE = [1, pytest.param(10, marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def nlp(bilm_dir, corpus_dir):
    """The tiny pipeline, briefly trained."""
    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    for start in range(0, 48, 16):
        nlp.update(train[start : start + 16], sgd=optimizer)
    return nlp


def check_doc(doc: Doc) -> None:
    assert doc._.elmo.shape == (N_LAYERS, len(doc), WIDTH)
    assert doc._.elmo.dtype == numpy.float32
    assert numpy.isfinite(doc._.elmo).all()
    assert doc.tensor.shape == (len(doc), WIDTH)
    scores = numpy.array(list(doc.cats.values()))
    assert len(scores) == 4 and numpy.isfinite(scores).all()
    # spaCy's textcat scores a batch of empty docs alone with zeros.
    assert scores.sum() == pytest.approx(1.0 if len(doc) or scores.any() else 0.0, abs=1e-5)


@pytest.mark.parametrize("scale", SCALE)
def test_any_text_gives_correct_shapes_and_cats(nlp, scale):
    @_examples(500 * scale)
    @given(TEXTS)
    def check(text):
        check_doc(nlp(text))

    check()


@pytest.mark.parametrize("scale", SCALE)
def test_any_batch_gives_the_same_as_one_doc_at_a_time(nlp, scale):
    @_examples(300 * scale)
    @given(st.lists(TEXTS, max_size=6))
    def check(texts):
        for text, doc in zip(texts, nlp.pipe(texts, batch_size=3), strict=True):
            check_doc(doc)
            alone = nlp(text)
            numpy.testing.assert_allclose(doc._.elmo, alone._.elmo, atol=1e-5)

    check()


@pytest.mark.parametrize("scale", SCALE)
def test_docs_from_another_tokenizer(nlp, scale):
    @_examples(300 * scale)
    @given(FOREIGN_WORDS, st.booleans())
    def check(words, spaces):
        doc = Doc(nlp.vocab, words=words, spaces=[spaces] * len(words))
        check_doc(nlp(doc))

    check()


def test_a_10000_token_doc(nlp):
    doc = nlp(" ".join(["markets", "rallied", "on", "Friday", "."] * 2000))
    assert len(doc) == 10_000
    check_doc(doc)


def _train_twice(bilm_dir, corpus_dir):
    results = []
    for _ in range(2):
        spacy.util.fix_random_seed(0)
        nlp = make_nlp(bilm_dir, SCALAR_MIX, 1.0)
        train = examples(nlp, corpus_dir / "train.spacy")
        optimizer = nlp.initialize(lambda train=train: train)
        for start in range(0, 64, 16):
            nlp.update(train[start : start + 16], sgd=optimizer, drop=0.2)
        results.append(nlp)
    return results


def test_same_seed_same_pretrained_biLM(tmp_path):
    docs = tokenize(read_texts(DATA / "unlabeled.txt"))
    settings = PretrainConfig(max_epochs=1, batch_tokens=1500, seed=3)
    for run in ("a", "b"):
        pretrain(corpus_of(docs), TINY_BILM, settings, tmp_path / run, show_progress=False)
    weights = [(tmp_path / run / "model-last" / "weights.safetensors").read_bytes() for run in "ab"]
    assert weights[0] == weights[1]


def test_same_seed_same_textcat_scores_and_finetuned_biLM(bilm_dir, corpus_dir):
    first, second = _train_twice(bilm_dir, corpus_dir)
    a = get_bilm(first.get_pipe("elmo").model).state_dict()
    b = get_bilm(second.get_pipe("elmo").model).state_dict()
    assert all(numpy.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    texts = ["Oil prices rose.", "The match ended 2-1.", ""]
    for x, y in zip(first.pipe(texts), second.pipe(texts), strict=True):
        assert x.cats == y.cats


@_examples(300)
@given(st.integers(0, 5000), st.integers(1, 400), st.integers(0, 100))
def test_windows_tile_the_doc_with_context_on_both_sides(n_tokens, window, overlap):
    from elmo_spacy.bilm.runner import windows

    assume(2 * overlap < window)
    pieces = windows(n_tokens, window, overlap)
    if n_tokens == 0:
        assert pieces == []
        return
    kept = [(keep_first, keep_last) for _, _, keep_first, keep_last in pieces]
    assert kept[0][0] == 0 and kept[-1][1] == n_tokens
    assert all(left[1] == right[0] for left, right in zip(kept, kept[1:]))
    for first, last, keep_first, keep_last in pieces:
        assert 0 <= first <= keep_first < keep_last <= last <= n_tokens
        assert last - first <= window
        assert first == 0 or keep_first - first >= overlap
        assert last == n_tokens or last - keep_last >= overlap


def test_a_doc_longer_than_the_window_runs_in_pieces(bilm_dir):
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo", config={"model": {"run": {"window": 40, "window_overlap": 8}}})
    elmo.initialize(lambda: [], bilm_path=str(bilm_dir))
    whole = spacy.blank("en")
    whole.add_pipe("elmo").initialize(lambda: [], bilm_path=str(bilm_dir))
    text = " ".join(["Oil", "prices", "rose", "as", "markets", "fell", "."] * 30)
    windowed, reference = nlp(text)._.elmo, whole(text)._.elmo
    assert windowed.shape == reference.shape == (N_LAYERS, 210, WIDTH)
    numpy.testing.assert_allclose(windowed[0], reference[0], atol=1e-5)  # layer 0: no context
    # Pieces are tokens [0, 32), [16, 56), ...; the first keeps 0-23. The forward
    # LSTM reads left to right, so those got the same forward half as in the
    # whole doc, and the later ones (less left context) did not.
    forward = slice(0, WIDTH // 2)
    numpy.testing.assert_allclose(
        windowed[1:, :24, forward], reference[1:, :24, forward], atol=1e-5
    )
    assert not numpy.allclose(windowed[1:, 24:, forward], reference[1:, 24:, forward], atol=1e-5)
    assert get_runner(elmo.model).settings.window == 40


def test_a_config_naming_an_unknown_mix_says_which_and_what_exists(bilm_dir):
    with pytest.raises(Exception) as error:
        make_nlp(bilm_dir, {"@architectures": "elmo_spacy.ScalarMixx.v1", "trainable": True})
    message = str(error.value)
    assert "elmo_spacy.ScalarMixx.v1" in message
    assert "elmo_spacy.ScalarMix.v1" in message and "elmo_spacy.LearnedMix.v1" in message


def test_surrogate_safe_tokenizer_cuts_like_spacys_own():
    nlp = spacy.blank(
        "en", config={"nlp": {"tokenizer": {"@tokenizers": "elmo_spacy.Tokenizer.v1"}}}
    )
    text = "Don't pay $3.50 at https://x.com, U.S. \ud800 (ok)!"
    doc = nlp(text)
    assert len(doc.text) == len(text)
    assert [t.text for t in doc] == [
        t.text for t in spacy.blank("en")(text.replace("\ud800", "\ufffd"))
    ]
