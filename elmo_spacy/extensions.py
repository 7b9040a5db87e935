"""`doc._.elmo`, `span._.elmo` and `token._.elmo`, and `doc.tensor` from them.

A doc's layers live in `doc.user_data` with the offsets and orth ids of the
tokens they were computed for, so that they are read aligned by character
offsets with the current tokens (docs/pipes.md).
"""

import zlib

import numpy
import srsly
from spacy.attrs import IDX, LENGTH, ORTH
from spacy.tokens import Doc, Span, Token

from .errors import ElmoSpacyError

# spaCy's `doc.user_data` key of the doc extension `elmo`, where the pipe keeps its record.
USER_DATA_KEY = ("._.", "elmo", None, None)


class StaleLayersError(ElmoSpacyError):
    """doc._.elmo was computed for tokens this doc no longer has."""


class ElmoLayers(numpy.ndarray):
    """The type of `doc._.elmo`, (n_layers, len(doc), width), and of the arrays
    kept in `doc.user_data`: it renders as JSON (nested lists), for spaCy's
    `Doc.to_json(underscore=["elmo"])`."""

    def __json__(self) -> str:
        return srsly.json_dumps(self.tolist())


def install_extensions() -> None:
    """Register `doc._.elmo`, `span._.elmo` and `token._.elmo` (once)."""
    if not Doc.has_extension("elmo"):
        Doc.set_extension("elmo", getter=get_layers, setter=set_layers)
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_layers)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=_token_layers)


def restore_views(doc: Doc) -> None:
    """Align the layers with the doc's current tokens and set `doc.tensor`
    from them again: after `doc.retokenize()` (which moves the tensor rows
    its own way) and after DocBin (which does not store the tensor). Layers
    of another text are left as they are."""
    try:
        layers = get_layers(doc)
    except StaleLayersError:
        return
    if layers is not None:
        set_layers(doc, numpy.array(layers))


def set_layers(doc: Doc, layers: numpy.ndarray | None) -> None:
    """`doc._.elmo = layers`: attach (n_layers, len(doc), width) layers to the
    doc's current tokens and set `doc.tensor` to their mean; None removes both."""
    if layers is None:
        if doc.user_data.pop(USER_DATA_KEY, None) is not None:
            doc.tensor = numpy.zeros((0,), dtype="float32")  # spaCy's empty tensor
        return
    layers = numpy.asarray(layers)
    if layers.ndim != 3 or layers.shape[1] != len(doc):
        raise ElmoSpacyError(
            f"doc._.elmo must be (n_layers, len(doc) = {len(doc)}, width); got {layers.shape}"
        )
    tokens = doc.to_array([IDX, LENGTH, ORTH])
    doc.user_data[USER_DATA_KEY] = {
        "layers": layers.view(ElmoLayers),
        "starts": tokens[:, 0].astype("int64").view(ElmoLayers),
        "ends": (tokens[:, 0] + tokens[:, 1]).astype("int64").view(ElmoLayers),
        "orths": tokens[:, 2].astype("uint64").view(ElmoLayers),
        "text": _checksum(doc.text),
        "text_length": _text_length(doc),
    }
    doc.tensor = default_mix(layers)


def annotate(doc: Doc, layers: numpy.ndarray, readers: list[int], store: dict) -> None:
    """`set_layers`, then `store_layers` with `store` ({"rows": "all", a list
    of rows, "tensor" or "nothing"; "dtype": of the kept rows}) once the
    listeners `readers` (their ids) have read the layers (`mark_read`)."""
    set_layers(doc, layers)
    if store == {"rows": "all", "dtype": str(layers.dtype)}:
        return  # nothing to change once read
    doc.user_data[USER_DATA_KEY]["store"] = store
    if readers:
        doc.user_data[USER_DATA_KEY]["readers"] = list(readers)
    else:
        store_layers(doc)


def listened_layers(doc: Doc) -> "ElmoLayers | None":
    """`doc._.elmo` where `store` has not cut rows from it yet, else None."""
    record = doc.user_data.get(USER_DATA_KEY)
    if record is None or record.get("cut"):
        return None
    return get_layers(doc)


def mark_read(doc: Doc, reader: int) -> None:
    """The listener `reader` has read the doc's layers; the last one applies `store`."""
    readers = doc.user_data.get(USER_DATA_KEY, {}).get("readers", [])
    if reader in readers:
        readers.remove(reader)
        if not readers:
            store_layers(doc)


def store_layers(doc: Doc) -> None:
    """Keep on the doc only what the `elmo` pipe's `store` setting says, now,
    whether or not its listeners have read the layers."""
    record = doc.user_data.get(USER_DATA_KEY)
    if record is None or "store" not in record:
        return
    store = record.pop("store")
    record.pop("readers", None)
    rows = store["rows"]
    if rows == "nothing":
        set_layers(doc, None)
    elif rows == "tensor":
        del doc.user_data[USER_DATA_KEY]
    else:
        layers = record["layers"]
        if rows != "all":
            layers = layers[rows]
            record["cut"] = True
        record["layers"] = layers.astype(store["dtype"]).view(ElmoLayers)


def get_layers(doc: Doc) -> ElmoLayers | None:
    """`doc._.elmo`, aligned with the doc's current tokens; never writes to the
    doc (`restore_views` stores them aligned)."""
    record = doc.user_data.get(USER_DATA_KEY)
    if record is None:
        return None
    offsets = doc.to_array([IDX, ORTH])
    starts, orths = offsets[:, 0].astype("int64"), offsets[:, 1].astype("uint64")
    if numpy.array_equal(starts, record["starts"]) and numpy.array_equal(orths, record["orths"]):
        return record["layers"].view(ElmoLayers)
    _check_text(doc, record)
    return _realign(doc, record).view(ElmoLayers)


def default_mix(layers: numpy.ndarray) -> numpy.ndarray:
    """`doc.tensor`: the mean of the layers in float32, (n_layers, n, width) -> (n, width)."""
    return layers.mean(axis=0, dtype="float32")


def _realign(doc: Doc, record: dict) -> numpy.ndarray:
    """The layers carried to the doc's current tokens: (n_layers, len(doc), width)."""
    layers = record["layers"]
    aligned = numpy.empty((layers.shape[0], len(doc), layers.shape[2]), dtype=layers.dtype)
    for token in doc:
        aligned[:, token.i] = _token_rows(token, record)
    return aligned


def _token_rows(token: Token, record: dict) -> numpy.ndarray:
    """One token's layers, the mean of the earlier tokens it overlaps: (n_layers, width)."""
    start, end = token.idx, token.idx + len(token.text)
    overlapping = numpy.flatnonzero((record["starts"] < end) & (record["ends"] > start))
    if not len(overlapping):
        raise StaleLayersError(_stale(token.doc, f"have no token at {token.text!r}"))
    return record["layers"][:, overlapping].mean(axis=1)


def _check_text(doc: Doc, record: dict) -> None:
    if record["text"] != _checksum(doc.text):
        raise StaleLayersError(_stale(doc, "belong to another text"))


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


def _span_layers(span: Span) -> ElmoLayers | None:
    layers = span.doc._.elmo
    return None if layers is None else layers[:, span.start : span.end]


def _token_layers(token: Token) -> ElmoLayers | None:
    record = token.doc.user_data.get(USER_DATA_KEY)
    if record is None:
        return None
    i, doc = token.i, token.doc
    if (
        len(record["starts"]) == len(doc)
        and record["text_length"] == _text_length(doc)
        and record["starts"][i] == token.idx
        and record["orths"][i] == token.orth
    ):  # the token it was computed for, in a doc of the same shape: no need to check every token
        return record["layers"][:, i].view(ElmoLayers)
    _check_text(doc, record)
    return _token_rows(token, record).view(ElmoLayers)
