"""Length-bucketed batches of tokenised docs under a token budget."""

import random
from collections.abc import Iterator, Sequence

Tokens = Sequence[str]


def split_long(docs: Sequence[Tokens], max_length: int) -> list[Tokens]:
    """Cut docs longer than `max_length` tokens into consecutive pieces; drop empty docs."""
    pieces: list[Tokens] = []
    for doc in docs:
        for start in range(0, len(doc), max_length):
            pieces.append(doc[start : start + max_length])
    return pieces


def bucketed_batches(
    docs: Sequence[Tokens], batch_tokens: int, rng: random.Random, shuffle: bool = True
) -> Iterator[list[Tokens]]:
    """Yield batches whose padded size (docs x longest doc) stays within
    `batch_tokens`. Docs are sorted by length (ties shuffled) so batches hold
    docs of similar length, and the batch order is shuffled."""
    order = list(range(len(docs)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: len(docs[i]))
    batches: list[list[Tokens]] = []
    current: list[Tokens] = []
    for i in order:
        longest = max(len(docs[i]), len(current[-1]) if current else 0)
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(docs[i])
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    yield from batches
