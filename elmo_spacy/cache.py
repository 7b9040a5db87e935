"""A bounded in-memory cache of a frozen biLM's outputs, per doc."""

import operator
from collections.abc import Callable, Sequence

import numpy
from spacy.tokens import Doc
from thinc.api import Ops

from .bilm.runtime.lru import LruCache
from .layers.bilm_model import ElmoOutput


class FrozenOutputCache:
    """Keeps the (L + 1, n, width) layers of docs seen before, in float16.

    With a frozen biLM, every training epoch and every mixing strategy would
    run the biLM over the same docs again; this cache runs it once per doc.
    The entries stay on the host, wherever the biLM runs. Keys are the docs'
    token texts, so two docs with the same tokens share an entry. When the
    stored arrays pass `max_bytes`, the least recently used entries are
    dropped (an `LruCache` bounded by bytes). Returned arrays are float32
    copies of the float16 entries (the rounding is below 1e-3 relative).
    With `max_bytes` <= 0 the cache is off: every call computes, and nothing
    is rounded.

    entries: the float16 layers under their docs' token texts.
    nbytes: the bytes that the kept entries hold now.
    hits, misses: docs found kept, and docs computed.
    """

    def __init__(self, max_bytes: int) -> None:
        self.entries: LruCache[tuple[str, ...], numpy.ndarray] = LruCache(
            max_bytes, size_of=operator.attrgetter("nbytes")
        )

    @property
    def max_bytes(self) -> int:
        return self.entries.max_size

    @max_bytes.setter
    def max_bytes(self, max_bytes: int) -> None:
        self.entries.max_size = max_bytes

    @property
    def nbytes(self) -> int:
        return self.entries.size

    @property
    def hits(self) -> int:
        return self.entries.hits

    @property
    def misses(self) -> int:
        return self.entries.misses

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()

    def get_or_compute(
        self, docs: Sequence[Doc], compute: Callable[[list[Doc]], ElmoOutput], ops: Ops
    ) -> ElmoOutput:
        """The layers of each doc: kept ones, and `compute` run once on the
        docs that have none. `compute` returns arrays of `ops` (numpy, or
        cupy on a GPU), and so does this."""
        if self.max_bytes <= 0:
            return compute(list(docs))
        keys = [tuple(token.text for token in doc) for doc in docs]
        outputs = [self.entries.get(key) for key in keys]
        missing = [i for i, entry in enumerate(outputs) if entry is None]
        if missing:
            for i, layers in zip(missing, compute([docs[i] for i in missing])):
                outputs[i] = ops.to_numpy(layers).astype("float16")
                self.entries.put(keys[i], outputs[i])
        return [ops.asarray3f(entry) for entry in outputs]
