"""The one way this package bounds a cache: a least-recently-used mapping."""

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


class LruCache(Generic[Key, Value]):
    """A mapping that keeps its most recently used entries within a bound.

    max_size: a number of entries, or with `size_of` a total of sizes (e.g.
        `operator.attrgetter("nbytes")`); storing drops the least recently
        used entries past it, the new one too if it alone is larger.
    size: the total now; hits, misses: `get`'s lookups (`clear` keeps them).

    Values are never None: `get` gives None for a missing key.
    """

    def __init__(self, max_size: int, size_of: Callable[[Value], int] | None = None) -> None:
        self._max_size = max_size
        self.size_of = size_of
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Key, Value] = OrderedDict()

    @property
    def max_size(self) -> int:
        """The bound; a new one holds at once (entries past it are dropped)."""
        return self._max_size

    @max_size.setter
    def max_size(self, max_size: int) -> None:
        self._max_size = max_size
        self._evict()

    def get(self, key: Key) -> Value | None:
        """The entry of `key`, now the most recently used; None (a miss)."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return value

    def put(self, key: Key, value: Value) -> None:
        """Store `value` under `key` as the most recently used entry."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= self._size(old)
        self._entries[key] = value
        self.size += self._size(value)
        self._evict()

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Key]:
        """The keys, least recently used first."""
        return iter(self._entries)

    def _size(self, value: Value) -> int:
        return 1 if self.size_of is None else self.size_of(value)

    def _evict(self) -> None:
        while self._entries and self.size > self._max_size:
            _, dropped = self._entries.popitem(last=False)
            self.size -= self._size(dropped)
