"""A bounded in-memory cache of a frozen biLM's outputs, per doc."""

import operator
from collections.abc import Callable, Sequence

import numpy
from spacy.tokens import Doc
from thinc.api import Ops

from .bilm.runtime.lru import LruCache
from .layers.bilm_model import ElmoOutput


class FrozenOutputCache(LruCache[tuple[str, ...], numpy.ndarray]):
    """The (L + 1, n, width) layers of docs seen before, so that a frozen biLM
    runs once per training doc: kept on the host in float16 under the docs'
    token texts, at most `max_size` bytes (least recently used dropped first),
    returned as float32 copies. `max_size` <= 0: off, every call computes and
    nothing is rounded."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, size_of=operator.attrgetter("nbytes"))

    def get_or_compute(
        self, docs: Sequence[Doc], compute: Callable[[list[Doc]], ElmoOutput], ops: Ops
    ) -> ElmoOutput:
        """The layers of each doc: kept ones, and `compute` run once on the
        docs that have none; arrays of `ops`, as `compute` returns."""
        if self.max_size <= 0:
            return compute(list(docs))
        keys = [tuple(token.text for token in doc) for doc in docs]
        outputs = [self.get(key) for key in keys]
        missing = [i for i, entry in enumerate(outputs) if entry is None]
        if missing:
            for i, layers in zip(missing, compute([docs[i] for i in missing])):
                outputs[i] = ops.to_numpy(layers).astype("float16")
                self.put(keys[i], outputs[i])
        return [ops.asarray3f(entry) for entry in outputs]
