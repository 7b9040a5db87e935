"""`doc._.elmo`, `span._.elmo`, `token._.elmo`, and the vector hooks that read them."""

import numpy
from spacy.tokens import Doc, Span, Token


def install_extensions() -> None:
    """Register `doc._.elmo`, `span._.elmo` and `token._.elmo` (once)."""
    if not Doc.has_extension("elmo"):
        Doc.set_extension("elmo", default=None)
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_layers)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=_token_layers)


def set_layers(doc: Doc, layers: numpy.ndarray) -> None:
    """Attach (L + 1, len(doc), width) layers to `doc`: `doc._.elmo`, `doc.tensor`
    (their default mix) and the hooks behind `.vector` and `.similarity`."""
    doc._.elmo = layers
    doc.tensor = default_mix(layers)
    for hooks, vector in (
        (doc.user_hooks, _doc_vector),
        (doc.user_span_hooks, _span_vector),
        (doc.user_token_hooks, _token_vector),
    ):
        hooks["vector"] = vector
        hooks["has_vector"] = _has_vector
        hooks["similarity"] = _cosine_similarity


def _span_layers(span: Span) -> numpy.ndarray | None:
    layers = span.doc._.elmo
    return None if layers is None else layers[:, span.start : span.end]


def _token_layers(token: Token) -> numpy.ndarray | None:
    layers = token.doc._.elmo
    return None if layers is None else layers[:, token.i]


def default_mix(layers: numpy.ndarray) -> numpy.ndarray:
    """The default mix behind doc.tensor and the .vector hooks: the mean of the
    layers, in float32. (L + 1, n, width) -> (n, width)."""
    return layers.mean(axis=0, dtype="float32")


def _token_vector(token: Token) -> numpy.ndarray:
    return default_mix(token.doc._.elmo[:, token.i : token.i + 1])[0]


def _span_vector(span: Span) -> numpy.ndarray:
    return _mean_rows(default_mix(span._.elmo))


def _doc_vector(doc: Doc) -> numpy.ndarray:
    return _mean_rows(default_mix(doc._.elmo))


def _mean_rows(rows: numpy.ndarray) -> numpy.ndarray:
    return rows.mean(axis=0) if len(rows) else numpy.zeros(rows.shape[1], dtype="float32")


def _has_vector(obj) -> bool:
    return True


def _cosine_similarity(obj, other) -> float:
    """Cosine of the two objects' vectors (0.0 if either is all zeros)."""
    a, b = obj.vector, other.vector
    norms = float(numpy.linalg.norm(a) * numpy.linalg.norm(b))
    return float(numpy.dot(a, b) / norms) if norms else 0.0
