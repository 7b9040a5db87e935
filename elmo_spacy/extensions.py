"""`doc._.elmo`, `span._.elmo`, `token._.elmo`, and the vector hooks that read them.

The layers live in `doc.user_data` with the offsets and orth ids of the tokens
they were computed for, so that whatever spaCy lets a user do to a Doc, no
token ever reads another token's vectors:

- slicing: `span._.elmo` and `token._.elmo` are views of the doc's layers;
- `doc.retokenize()`: the layers follow the tokens as the retokenizer exits
  (a merged token gets the mean of its parts' layers, the pieces of a split
  token its layers), and `doc.tensor` with them. spaCy's own handling of
  `doc.tensor` would keep the last row of a merged span and, on a split, leave
  the tensor a row longer than the doc, which `Doc.from_docs` then joins out
  of step; `install_extensions` has spaCy's retokenizer realign instead;
- `Span.as_doc()`, `Doc.from_docs()`: spaCy copies no doc-level user data
  (unless `as_doc(copy_user_data=True)`: then the layers are another doc's,
  below), so the new doc has no layers, and its vectors are spaCy's own (its
  tensor, the joined default mixes);
- DocBin (`store_user_data=True`), `nlp.pipe(n_process=...)`, `to_bytes`,
  pickle: the layers travel with the doc. Serialised docs lose their user
  hooks (spaCy's W109), so `install_extensions` has `DocBin.get_docs` and
  spaCy's multiprocessing pipe attach them again; after `Doc.from_bytes`
  call `restore_views(doc)`;
- layers that belong to other tokens (copied by hand between docs) raise a
  `StaleLayersError` when read.

`doc._.elmo` is an `ElmoLayers` array: a numpy array that spaCy's
`Doc.to_json(underscore=["elmo"])` can write (as nested lists).
"""

import functools
import zlib

import numpy
import spacy.tokens.doc
import srsly
from spacy.attrs import IDX, LENGTH, ORTH
from spacy.language import Language
from spacy.tokens import Doc, DocBin, Span, Token
from spacy.tokens._retokenize import Retokenizer

KEY = ("._.", "elmo", None, None)  # spaCy's key of a doc-level extension in user_data


class StaleLayersError(ValueError):
    """doc._.elmo was computed for tokens this doc no longer has."""


class JsonArray(numpy.ndarray):
    """A numpy array that renders as JSON (nested lists), so that spaCy's
    Doc.to_json(underscore=["elmo"]) can write what doc.user_data holds."""

    def __json__(self) -> str:
        return srsly.json_dumps(self.tolist())


class ElmoLayers(JsonArray):
    """The type of `doc._.elmo`: (n_layers, len(doc), width)."""


def install_extensions() -> None:
    """Register `doc._.elmo`, `span._.elmo` and `token._.elmo`; have spaCy's
    retokenizer realign the layers of the docs it changes, and DocBin.get_docs
    and the multiprocessing `nlp.pipe` restore the vector views of the docs
    they deserialise (each patch once)."""
    if not Doc.has_extension("elmo"):
        Doc.set_extension("elmo", getter=get_layers, setter=set_layers)
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_layers)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=_token_layers)
    if not issubclass(spacy.tokens.doc.Retokenizer, RealigningRetokenizer):
        spacy.tokens.doc.Retokenizer = RealigningRetokenizer
    if not getattr(DocBin.get_docs, "restores_elmo_views", False):
        DocBin.get_docs = _restoring_views(DocBin.get_docs)
    pipe = getattr(Language, "_multiprocessing_pipe", None)
    if pipe is not None and not getattr(pipe, "restores_elmo_views", False):
        Language._multiprocessing_pipe = _restoring_views(pipe)


class RealigningRetokenizer(Retokenizer):
    """spaCy's Retokenizer (what `doc.retokenize()` returns), which realigns
    the doc's layers and `doc.tensor` with the new tokens once it has run."""

    def __init__(self, doc: Doc) -> None:
        super().__init__(doc)
        self.elmo_doc = doc

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        if self.elmo_doc.user_data.get(KEY) is not None:
            restore_views(self.elmo_doc)


def restore_views(doc: Doc) -> None:
    """Realign the layers of a doc whose tokens changed, and set `doc.tensor`
    and the vector hooks from them again (e.g. after `Doc.from_bytes`, which
    keeps `doc._.elmo` but not the hooks). Layers that belong to another text
    are left as they are: reading them raises `StaleLayersError`."""
    if doc.user_data.get(KEY) is None:
        return
    try:
        get_layers(doc)
    except StaleLayersError:
        return
    attach_views(doc)


def set_layers(doc: Doc, layers: numpy.ndarray | None) -> None:
    """`doc._.elmo = layers`: attach (n_layers, len(doc), width) layers to the
    doc's current tokens, set `doc.tensor` to their default mix and make
    `.vector` and `.similarity` use it. None takes the layers (and the
    hooks) away again."""
    if layers is None:
        doc.user_data.pop(KEY, None)
        _remove_hooks(doc)
        return
    layers = numpy.asarray(layers)
    if layers.ndim != 3 or layers.shape[1] != len(doc):
        raise ValueError(
            f"doc._.elmo must be (n_layers, len(doc) = {len(doc)}, width); got {layers.shape}"
        )
    tokens = doc.to_array([IDX, LENGTH, ORTH])
    doc.user_data[KEY] = {
        "layers": layers.view(JsonArray),
        "starts": tokens[:, 0].astype("int64").view(JsonArray),
        "ends": (tokens[:, 0] + tokens[:, 1]).astype("int64").view(JsonArray),
        "orths": tokens[:, 2].astype("uint64").view(JsonArray),
        "text": _checksum(doc.text),
        "text_length": _text_length(doc),
    }
    attach_views(doc)


def get_layers(doc: Doc) -> ElmoLayers | None:
    """`doc._.elmo`, aligned with the doc's tokens (see the module docstring)."""
    record = doc.user_data.get(KEY)
    if record is None:
        return None
    if not isinstance(record, dict):  # an older plain array, unchecked
        record = {"layers": record, "starts": None, "orths": None, "text": None}
    layers = record["layers"]
    if record["starts"] is None:
        if layers.shape[1] != len(doc):
            raise StaleLayersError(_stale(doc, "were computed for another number of tokens"))
        return layers.view(ElmoLayers)
    offsets = doc.to_array([IDX, ORTH])
    starts, orths = offsets[:, 0].astype("int64"), offsets[:, 1].astype("uint64")
    if numpy.array_equal(starts, record["starts"]) and numpy.array_equal(orths, record["orths"]):
        return layers.view(ElmoLayers)
    if record["text"] != _checksum(doc.text):
        raise StaleLayersError(_stale(doc, "belong to another text"))
    set_layers(doc, _realign(doc, record))
    return doc.user_data[KEY]["layers"].view(ElmoLayers)


def attach_views(doc: Doc) -> None:
    """Set `doc.tensor` to the default mix of `doc._.elmo` and the hooks behind
    `.vector`, `.has_vector` and `.similarity` of the doc, its spans and tokens."""
    doc.tensor = default_mix(doc.user_data[KEY]["layers"])
    for hooks, vector in (
        (doc.user_hooks, _doc_vector),
        (doc.user_span_hooks, _span_vector),
        (doc.user_token_hooks, _token_vector),
    ):
        hooks["vector"] = vector
        hooks["has_vector"] = _has_vector
        hooks["similarity"] = _cosine_similarity


def default_mix(layers: numpy.ndarray) -> numpy.ndarray:
    """The default mix behind doc.tensor and the .vector hooks: the mean of the
    layers, in float32. (n_layers, n, width) -> (n, width)."""
    return layers.mean(axis=0, dtype="float32")


def _realign(doc: Doc, record: dict) -> numpy.ndarray:
    """The layers of the same text's earlier tokens, carried to its current
    tokens by character offsets: each token gets the mean of the earlier
    tokens it overlaps (a merged token the mean of its parts, a piece of a
    split token that token's layers)."""
    layers, starts, ends = record["layers"], record["starts"], record["ends"]
    aligned = numpy.empty((layers.shape[0], len(doc), layers.shape[2]), dtype=layers.dtype)
    for token in doc:
        start, end = token.idx, token.idx + len(token.text)
        overlapping = numpy.flatnonzero((starts < end) & (ends > start))
        if not len(overlapping):
            raise StaleLayersError(_stale(doc, f"have no token at {token.text!r}"))
        aligned[:, token.i] = layers[:, overlapping].mean(axis=1)
    return aligned


def _stale(doc: Doc, why: str) -> str:
    return (
        f"doc._.elmo of this doc ({len(doc)} tokens) {why}: its layers were copied from "
        "another doc. Run the elmo pipe on this doc again (nlp.get_pipe('elmo')(doc)), or "
        "set doc._.elmo = None."
    )


def _text_length(doc: Doc) -> int:
    return doc[-1].idx + len(doc[-1].text_with_ws) if len(doc) else 0


def _checksum(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", errors="surrogatepass"))


def _restoring_views(make_docs):
    """A method that yields docs (DocBin.get_docs, Language._multiprocessing_pipe),
    restoring the vector views of every doc with layers."""

    @functools.wraps(make_docs)
    def make_docs_with_views(*args, **kwargs):
        for doc in make_docs(*args, **kwargs):
            restore_views(doc)
            yield doc

    make_docs_with_views.restores_elmo_views = True
    return make_docs_with_views


def _span_layers(span: Span) -> ElmoLayers | None:
    layers = span.doc._.elmo
    return None if layers is None else layers[:, span.start : span.end]


def _token_layers(token: Token) -> ElmoLayers | None:
    record = token.doc.user_data.get(KEY)
    if record is None:
        return None
    i, doc = token.i, token.doc
    if (
        isinstance(record, dict)
        and record["starts"] is not None
        and len(record["starts"]) == len(doc)
        and record.get("text_length") == _text_length(doc)
        and record["starts"][i] == token.idx
        and record["orths"][i] == token.orth
    ):  # the token it was computed for, in a doc of the same shape: no need to check every token
        return record["layers"][:, i].view(ElmoLayers)
    layers = token.doc._.elmo
    return layers[:, i]


def _token_vector(token: Token) -> numpy.ndarray:
    layers = token._.elmo
    if layers is None:
        return _without_hooks(token.doc, lambda: token.vector)
    return default_mix(layers[:, None])[0]


def _span_vector(span: Span) -> numpy.ndarray:
    layers = span._.elmo
    if layers is None:
        return _without_hooks(span.doc, lambda: span.vector)
    return _mean_rows(default_mix(layers))


def _doc_vector(doc: Doc) -> numpy.ndarray:
    layers = doc._.elmo
    if layers is None:
        return _without_hooks(doc, lambda: doc.vector)
    return _mean_rows(default_mix(layers))


def _has_vector(obj) -> bool:
    doc = obj if isinstance(obj, Doc) else obj.doc
    if doc.user_data.get(KEY) is None:
        return _without_hooks(doc, lambda: obj.has_vector)
    return True


def _cosine_similarity(obj, other) -> float:
    """Cosine of the two objects' vectors (0.0 if either is all zeros)."""
    a, b = obj.vector, other.vector
    norms = float(numpy.linalg.norm(a) * numpy.linalg.norm(b))
    return float(numpy.dot(a, b) / norms) if norms else 0.0


def _mean_rows(rows: numpy.ndarray) -> numpy.ndarray:
    return rows.mean(axis=0) if len(rows) else numpy.zeros(rows.shape[1], dtype="float32")


def _without_hooks(doc: Doc, read):
    """A doc without layers (e.g. from Span.as_doc, or after doc._.elmo = None)
    keeps hooks that have nothing to read: take them away and read what spaCy
    reads without them."""
    _remove_hooks(doc)
    return read()


def _remove_hooks(doc: Doc) -> None:
    ours = (_doc_vector, _span_vector, _token_vector, _has_vector, _cosine_similarity)
    for hooks in (doc.user_hooks, doc.user_span_hooks, doc.user_token_hooks):
        for name in ("vector", "has_vector", "similarity"):
            if hooks.get(name) in ours:
                del hooks[name]
