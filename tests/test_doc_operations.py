"""Whatever spaCy lets a user do to a Doc, no token reads another token's vectors."""

import pickle
import subprocess
import sys

import numpy
import pytest
import spacy
import srsly
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from spacy.tokens import Doc, DocBin

import elmo_spacy
from elmo_spacy.extensions import StaleLayersError, default_mix

TEXTS = [
    "John Smith visited New York on Monday.",
    "The bank raised its interest rates again, said the minister.",
    "Stocks fell sharply after the jobs report; oil rose.",
]


@pytest.fixture(scope="module")
def nlp(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    return nlp


def check(doc: Doc, expected: list[numpy.ndarray]) -> None:
    """Every token's layers and vector are its own: `expected[i]` for token i."""
    assert doc._.elmo.shape[1] == len(doc) == len(expected)
    for token in doc:
        numpy.testing.assert_allclose(token._.elmo, expected[token.i], rtol=1e-6, atol=1e-6)
        mix = default_mix(expected[token.i][:, None])[0]
        numpy.testing.assert_allclose(token.vector, mix, rtol=1e-5, atol=1e-6)
        numpy.testing.assert_allclose(doc.tensor[token.i], mix, rtol=1e-5, atol=1e-6)


def merge(doc: Doc, expected: list, start: int, end: int) -> list:
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[start:end])
    parts = numpy.stack(expected[start:end])
    return expected[:start] + [parts.mean(axis=0)] + expected[end:]


def split(doc: Doc, expected: list, i: int, at: int) -> list:
    token = doc[i]
    pieces = [token.text[:at], token.text[at:]]
    with doc.retokenize() as retokenizer:
        retokenizer.split(token, pieces, heads=[(token, 1), (token, 1)])
    return expected[:i] + [expected[i], expected[i]] + expected[i + 1 :]


def docbin_round_trip(doc: Doc) -> Doc:
    docbin = DocBin(store_user_data=True, docs=[doc])
    return next(DocBin().from_bytes(docbin.to_bytes()).get_docs(doc.vocab))


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["merge", "split", "docbin", "pickle", "bytes", "read", "span", "as_doc", "from_docs"]
        ),
        st.integers(0, 1),
        st.integers(0, 10_000),
        st.integers(0, 10_000),
    ),
    max_size=8,
)


def check_mixes(doc: Doc, expected: list[numpy.ndarray]) -> None:
    """A doc without layers (from as_doc, from_docs): spaCy's own vectors, the
    tensor rows, are the default mixes of its tokens' own layers."""
    assert doc._.elmo is None
    assert doc.tensor.shape[0] == len(doc) == len(expected)
    for token in doc:
        mix = default_mix(expected[token.i][:, None])[0]
        numpy.testing.assert_allclose(token.vector, mix, rtol=1e-5, atol=1e-6)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.permutations(TEXTS), operations=OPERATIONS)
@example(texts=TEXTS, operations=[("pickle", 0, 0, 0), ("from_docs", 0, 0, 0)])
def test_random_doc_operations_keep_every_vector_with_its_token(nlp, texts, operations):
    """Two piped docs go through random operations; vectors are read only
    where an operation reads them and at the end, so that every operation
    may follow another with nothing in between."""
    docs = list(nlp.pipe(texts[:2]))
    expected = [[doc._.elmo[:, i].copy() for i in range(len(doc))] for doc in docs]
    for name, k, a, b in operations:
        doc, n = docs[k], len(docs[k])
        if name == "merge" and n > 1:
            start = a % (n - 1)
            end = min(n, start + 2 + b % min(3, n - start - 1))
            expected[k] = merge(doc, expected[k], start, end)
        elif name == "split":
            candidates = [t.i for t in doc if len(t.text) > 1]
            if candidates:
                i = candidates[a % len(candidates)]
                expected[k] = split(doc, expected[k], i, 1 + b % (len(doc[i].text) - 1))
        elif name == "docbin":
            docs[k] = docbin_round_trip(doc)
        elif name == "pickle":
            # together, as docs are pickled: apart, each would get its own
            # Vocab, and spaCy refuses to join docs of different vocabs
            docs = pickle.loads(pickle.dumps(docs))
        elif name == "bytes":
            docs[k] = Doc(doc.vocab).from_bytes(doc.to_bytes())
        elif name == "read":
            check(doc, expected[k])
        elif name == "span" and n:
            start = a % n
            span = doc[start : start + 1 + b % (n - start)]
            for token, layers in zip(span, span._.elmo.transpose(1, 0, 2)):
                numpy.testing.assert_allclose(layers, expected[k][token.i], rtol=1e-6, atol=1e-6)
        elif name == "as_doc" and n:
            start = a % n
            end = start + 1 + b % (n - start)
            check_mixes(doc[start:end].as_doc(), expected[k][start:end])
        elif name == "from_docs":
            check_mixes(Doc.from_docs(docs), expected[0] + expected[1])
    for doc, layers in zip(docs, expected):
        check(doc, layers)


def test_from_docs_falls_back_to_the_joined_tensors(nlp):
    docs = list(nlp.pipe(TEXTS[:2]))
    joined = Doc.from_docs(docs)
    assert joined._.elmo is None
    rows = numpy.concatenate([doc.tensor for doc in docs])
    assert numpy.array_equal(numpy.stack([t.vector for t in joined]), rows)


def test_split_then_merge_before_a_read_averages_what_it_covers(nlp):
    doc = nlp("New York is big.")
    new, york = doc[0]._.elmo.copy(), doc[1]._.elmo.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.split(doc[0], ["Ne", "w"], heads=[(doc[0], 1), (doc[0], 1)])
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[1:3])  # "w York"
    numpy.testing.assert_allclose(doc[0]._.elmo, new, rtol=1e-6)
    numpy.testing.assert_allclose(doc[1]._.elmo, (new + york) / 2, rtol=1e-5, atol=1e-6)


def test_layers_copied_to_another_doc_fail_loudly(nlp):
    source, other = nlp("The bank raised rates."), nlp.make_doc("The river rose again today.")
    other.user_data.update(source.user_data)
    with pytest.raises(StaleLayersError, match="belong to another text"):
        _ = other._.elmo
    with pytest.raises(StaleLayersError):
        _ = other[0]._.elmo


def test_no_layers_means_spacys_own_vectors(nlp):
    doc = nlp(TEXTS[0])
    doc._.elmo = None
    assert doc._.elmo is None and doc[0]._.elmo is None
    assert doc.vector.shape == (doc.tensor.shape[1],)  # spaCy's: the tensor's mean
    assert doc[1:3].as_doc().vector.shape == (doc.tensor.shape[1],)
    with pytest.raises(ValueError, match="len\\(doc\\) = 8"):
        doc._.elmo = numpy.zeros((3, 2, 4), dtype="float32")


def test_to_json_writes_the_layers(nlp):
    doc = nlp("Oil rose.")
    data = doc.to_json(underscore=["elmo"])
    layers = srsly.json_loads(srsly.json_dumps(data))["_"]["elmo"]
    numpy.testing.assert_allclose(numpy.array(layers, dtype="float32"), doc._.elmo, rtol=1e-6)


def test_docbin_in_a_fresh_process_restores_layers_and_vectors(nlp, tmp_path):
    doc = nlp(TEXTS[1])
    DocBin(store_user_data=True, docs=[doc]).to_disk(tmp_path / "docs.spacy")
    numpy.save(tmp_path / "vector.npy", doc[1].vector)
    code = (
        "import numpy, spacy, elmo_spacy\n"
        "from spacy.tokens import DocBin\n"
        f"docs = DocBin().from_disk({str(tmp_path / 'docs.spacy')!r}).get_docs(spacy.blank('en').vocab)\n"
        "doc = next(docs)\n"
        f"expected = numpy.load({str(tmp_path / 'vector.npy')!r})\n"
        "assert doc._.elmo.shape == (3, len(doc), 32), doc._.elmo.shape\n"
        "assert numpy.allclose(doc[1].vector, expected, atol=1e-6)\n"
        "assert doc.tensor.shape == (len(doc), 32)\n"
        "assert 0.0 < doc[1].similarity(doc[2]) < 1.0\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and "W008" not in result.stderr


def test_restore_views_after_from_bytes(nlp):
    doc = nlp("Oil rose.")
    copy = Doc(doc.vocab).from_bytes(doc.to_bytes())
    assert copy.user_token_hooks == {}  # spaCy cannot serialise the hooks (W109)
    elmo_spacy.restore_views(copy)
    assert set(copy.user_token_hooks) == {"vector", "has_vector", "similarity"}
    numpy.testing.assert_allclose(copy[0].vector, doc[0].vector, rtol=1e-6)
    assert copy[0].similarity(copy[0]) == pytest.approx(1.0)
