"""Whatever spaCy lets a user do to a Doc, no token reads another token's
vectors, and spaCy stays spaCy's: nothing of it is replaced or wrapped."""

import pickle
import subprocess
import sys
import warnings

import numpy
import pytest
import spacy
import srsly
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from spacy.language import Language
from spacy.tokens import Doc, DocBin
from spacy.tokens import doc as spacy_doc
from spacy.tokens._retokenize import Retokenizer

import elmo_spacy
from elmo_spacy.extensions import USER_DATA_KEY, StaleLayersError, default_mix

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
    """Every token's layers are its own, `expected[i]` for token i, read
    without writing to the doc; and once `restore_views` has set the tensor
    from them, so are its vector and tensor row."""
    record, tensor = doc.user_data[USER_DATA_KEY], doc.tensor
    assert doc._.elmo.shape[1] == len(doc) == len(expected)
    for token in doc:
        numpy.testing.assert_allclose(token._.elmo, expected[token.i], rtol=1e-6, atol=1e-6)
    assert doc.user_data[USER_DATA_KEY] is record and doc.tensor is tensor  # reading wrote nothing
    elmo_spacy.restore_views(doc)
    for token in doc:
        mix = default_mix(expected[token.i][:, None])[0]
        numpy.testing.assert_allclose(token.vector, mix, rtol=1e-5, atol=1e-6)
        numpy.testing.assert_allclose(doc.tensor[token.i], mix, rtol=1e-5, atol=1e-6)


def merge(doc: Doc, start: int, end: int) -> None:
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[start:end])


def split(doc: Doc, i: int, at: int) -> None:
    token = doc[i]
    pieces = [token.text[:at], token.text[at:]]
    with doc.retokenize() as retokenizer:
        retokenizer.split(token, pieces, heads=[(token, 1), (token, 1)])


Layers = list[tuple[int, int, numpy.ndarray]]  # (start, end) character offsets, (L + 1, D)


def layers_of(doc: Doc) -> Layers:
    """What the doc's layers are, by the character offsets of its tokens."""
    return [(t.idx, t.idx + len(t.text), doc._.elmo[:, t.i].copy()) for t in doc]


def expected_for(doc: Doc, known: Layers) -> list[numpy.ndarray]:
    """Each token's layers: the mean of the known layers of the tokens it
    overlaps (a merged token's parts; a piece of a split token, that token)."""
    expected = []
    for token in doc:
        start, end = token.idx, token.idx + len(token.text)
        expected.append(numpy.mean([x for s, e, x in known if s < end and e > start], axis=0))
    return expected


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
    may follow another with nothing in between. After a retokenize or a
    DocBin, spaCy's tensor is not the layers' mix until `restore_views`, as
    documented: docs made from the tensor (`as_doc`, `from_docs`) get it
    first."""
    docs = list(nlp.pipe(texts[:2]))
    known = [layers_of(doc) for doc in docs]  # the layers stored, by character offsets
    stale = [False, False]  # doc.tensor not set from the current layers

    def restored(k: int) -> Doc:
        if stale[k]:
            elmo_spacy.restore_views(docs[k])
            known[k], stale[k] = layers_of(docs[k]), False
        return docs[k]

    for name, k, a, b in operations:
        doc, n = docs[k], len(docs[k])
        if name == "merge" and n > 1:
            start = a % (n - 1)
            merge(doc, start, min(n, start + 2 + b % min(3, n - start - 1)))
            stale[k] = True
        elif name == "split":
            candidates = [t.i for t in doc if len(t.text) > 1]
            if candidates:
                i = candidates[a % len(candidates)]
                split(doc, i, 1 + b % (len(doc[i].text) - 1))
                stale[k] = True
        elif name == "docbin":
            docs[k] = docbin_round_trip(doc)
            stale[k] = True
        elif name == "pickle":
            # together, as docs are pickled: apart, each would get its own
            # Vocab, and spaCy refuses to join docs of different vocabs
            docs = pickle.loads(pickle.dumps(docs))
        elif name == "bytes":
            docs[k] = Doc(doc.vocab).from_bytes(doc.to_bytes())
        elif name == "read":
            check(doc, expected_for(doc, known[k]))
            known[k], stale[k] = layers_of(doc), False
        elif name == "span" and n:
            start = a % n
            span = doc[start : start + 1 + b % (n - start)]
            expected = expected_for(doc, known[k])
            for token, layers in zip(span, span._.elmo.transpose(1, 0, 2)):
                numpy.testing.assert_allclose(layers, expected[token.i], rtol=1e-6, atol=1e-6)
        elif name == "as_doc" and n:
            start = a % n
            end = start + 1 + b % (n - start)
            expected = expected_for(restored(k), known[k])
            check_mixes(docs[k][start:end].as_doc(), expected[start:end])
        elif name == "from_docs":
            restored(0), restored(1)
            expected = expected_for(docs[0], known[0]) + expected_for(docs[1], known[1])
            check_mixes(Doc.from_docs(docs), expected)
    for doc, layers in zip(docs, known):
        check(doc, expected_for(doc, layers))


def test_spacy_is_left_as_it_was(nlp):
    """Importing the plugin and running an elmo pipeline through every Doc
    operation replaces or wraps nothing of spaCy's, and sets no user hooks."""
    doc = nlp(TEXTS[0])
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[0:2])
    docs = list(DocBin(store_user_data=True, docs=[doc]).get_docs(nlp.vocab))
    docs += list(nlp.pipe(TEXTS, n_process=1)) + [Doc(doc.vocab).from_bytes(doc.to_bytes())]
    assert spacy_doc.Retokenizer is Retokenizer
    for method in (DocBin.get_docs, Language.pipe, Language._multiprocessing_pipe):
        assert not hasattr(method, "__wrapped__")  # what functools.wraps leaves
        assert "/spacy/" in method.__code__.co_filename.replace("\\", "/")
    for made in [doc, *docs]:
        assert not (made.user_hooks or made.user_span_hooks or made.user_token_hooks)


def test_a_retokenize_leaves_the_tensor_to_spacy_until_restore_views(nlp):
    doc = nlp("New York is big.")
    parts = doc._.elmo.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[0:2])
    # spaCy keeps the last part's row for the merged token: its own, not another token's
    numpy.testing.assert_allclose(doc.tensor[0], default_mix(parts[:, 1:2])[0], rtol=1e-6)
    numpy.testing.assert_allclose(doc[0]._.elmo, parts[:, 0:2].mean(axis=1), rtol=1e-6)
    elmo_spacy.restore_views(doc)
    assert doc.tensor.shape[0] == len(doc)
    numpy.testing.assert_allclose(
        doc.tensor[0], default_mix(parts[:, 0:2].mean(axis=1)[:, None])[0], rtol=1e-5
    )
    numpy.testing.assert_allclose(doc.user_data[USER_DATA_KEY]["layers"][:, 0], doc[0]._.elmo)


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
    assert doc.tensor.size == 0 and not doc.has_vector  # the tensor the layers set went with them
    assert not doc[1:3].as_doc().has_vector
    with pytest.raises(ValueError, match="len\\(doc\\) = 8"):
        doc._.elmo = numpy.zeros((3, 2, 4), dtype="float32")


def test_to_json_writes_the_layers(nlp):
    doc = nlp("Oil rose.")
    data = doc.to_json(underscore=["elmo"])
    layers = srsly.json_loads(srsly.json_dumps(data))["_"]["elmo"]
    numpy.testing.assert_allclose(numpy.array(layers, dtype="float32"), doc._.elmo, rtol=1e-6)


def test_docbin_in_a_fresh_process_keeps_the_layers_and_restore_views_the_vectors(nlp, tmp_path):
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
        "assert doc.tensor.size == 0  # DocBin does not store the tensor\n"
        "elmo_spacy.restore_views(doc)\n"
        "assert numpy.allclose(doc[1].vector, expected, atol=1e-6)\n"
        "assert doc.tensor.shape == (len(doc), 32)\n"
        "assert 0.0 < doc[1].similarity(doc[2]) < 1.0\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and "W008" not in result.stderr


def test_to_bytes_keeps_layers_and_tensor_without_a_warning(nlp):
    doc = nlp("Oil rose.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # spaCy's W109 (user hooks not saved) among them
        copy = Doc(doc.vocab).from_bytes(doc.to_bytes())
    numpy.testing.assert_array_equal(copy._.elmo, doc._.elmo)
    numpy.testing.assert_allclose(copy[0].vector, doc[0].vector, rtol=1e-6)
    assert copy[0].similarity(copy[0]) == pytest.approx(1.0)
