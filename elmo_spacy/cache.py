"""A bounded in-memory cache of a frozen biLM's outputs, per doc."""

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy
from spacy.tokens import Doc

from .layers.bilm_model import ElmoOutput


class FrozenOutputCache:
    """Keeps the (L + 1, n, width) layers of docs seen before, in float16.

    With a frozen biLM, every training epoch and every mixing strategy would
    run the biLM over the same docs again; this cache runs it once per doc.
    Keys are the docs' token texts, so two docs with the same tokens share an
    entry. When the stored arrays pass `max_bytes`, the least recently used
    entries are dropped. Returned arrays are float32 copies of the float16
    entries (the rounding is below 1e-3 relative). With `max_bytes` <= 0 the
    cache is off: every call computes, and nothing is rounded.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[str, ...], numpy.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def get_or_compute(
        self, docs: Sequence[Doc], compute: Callable[[list[Doc]], ElmoOutput]
    ) -> ElmoOutput:
        if self.max_bytes <= 0:
            return compute(list(docs))
        keys = [tuple(token.text for token in doc) for doc in docs]
        outputs: list[numpy.ndarray | None] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            outputs.append(entry)
        missing = [i for i, entry in enumerate(outputs) if entry is None]
        self.hits += len(docs) - len(missing)
        self.misses += len(missing)
        if missing:
            for i, layers in zip(missing, compute([docs[i] for i in missing])):
                outputs[i] = self._store(keys[i], layers)
        return [entry.astype("float32") for entry in outputs]

    def _store(self, key: tuple[str, ...], layers: numpy.ndarray) -> numpy.ndarray:
        entry = layers.astype("float16")
        if key not in self._entries:
            self.nbytes += entry.nbytes
        self._entries[key] = entry
        while self.nbytes > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
        return entry
