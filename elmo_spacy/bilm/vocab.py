"""Word vocabulary (softmax targets, word encoder) and byte-level character ids."""

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy
import torch

PAD, UNK, BOS, EOS = "<PAD>", "<UNK>", "<S>", "</S>"
SPECIALS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)

# Character ids: 0 pads, byte b is b + 1, then the marks.
CHAR_PAD = 0
BEGIN_OF_WORD = 257
END_OF_WORD = 258
BEGIN_OF_SENTENCE_CHAR = 259
END_OF_SENTENCE_CHAR = 260
N_CHARS = 261


class WordVocab:
    """Word types ordered by falling frequency after the four specials.

    The order matters: the adaptive softmax puts the first ids in its head
    cluster, so frequent words must have small ids.
    """

    def __init__(self, words: Sequence[str]) -> None:
        words = list(words)
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(
                f"A vocabulary must start with the specials {SPECIALS}, "
                f"got {words[: len(SPECIALS)]}"
            )
        self.words: list[str] = words
        self.index: dict[str, int] = {w: i for i, w in enumerate(words)}
        if len(self.index) != len(words):
            raise ValueError("A vocabulary must not repeat a word")

    def __len__(self) -> int:
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordVocab) and self.words == other.words

    @classmethod
    def build(
        cls, sentences: Iterable[Sequence[str]], *, max_size: int, min_count: int
    ) -> "WordVocab":
        """Count word types and keep the `max_size` most frequent seen at least
        `min_count` times (ties broken alphabetically, so the result is stable)."""
        counts: Counter = Counter()
        for tokens in sentences:
            counts.update(tokens)
        kept = [w for w, c in counts.items() if c >= min_count and w not in SPECIALS]
        kept.sort(key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept[: max(0, max_size - len(SPECIALS))])

    def word_ids(self, types: Sequence[str]) -> torch.Tensor:
        """Ids of <S>, </S> and then each of `types` (UNK_ID if unknown): (2 + U,) int64."""
        ids = [BOS_ID, EOS_ID] + [self.index.get(t, UNK_ID) for t in types]
        return torch.tensor(ids, dtype=torch.int64)


class CharacterMapper:
    """Maps tokens to UTF-8 byte ids framed by begin/end-of-word marks.

    A token longer than `max_chars - 2` bytes keeps its first bytes. Ids of
    tokens seen before come from a bounded cache.
    """

    def __init__(self, max_chars: int, min_width: int, cache_size: int = 100_000) -> None:
        self.max_chars = max_chars
        self.min_width = min_width
        self.cache_size = cache_size
        self._cache: dict[str, numpy.ndarray] = {}

    def token_ids(self, token: str) -> numpy.ndarray:
        """Returns the (n,) int64 character ids of one token, marks included."""
        ids = self._cache.get(token)
        if ids is None:
            data = token.encode("utf-8", errors="surrogatepass")[: self.max_chars - 2]
            ids = numpy.empty(len(data) + 2, dtype="int64")
            ids[0] = BEGIN_OF_WORD
            ids[1:-1] = numpy.frombuffer(data, dtype="uint8") + 1
            ids[-1] = END_OF_WORD
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[token] = ids
        return ids

    def char_ids(self, types: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Character ids of <S>, </S> and then each of `types`.

        Returns ids (2 + U, W) int64, right-padded with zeros, and the number of
        ids per row (2 + U,). W is the longest row plus `min_width - 1` (capped
        at max_chars), so that every convolution window starting inside a
        token fits whatever else is in the batch.
        """
        rows = [self.boundary_ids(BEGIN_OF_SENTENCE_CHAR), self.boundary_ids(END_OF_SENTENCE_CHAR)]
        rows += [self.token_ids(t) for t in types]
        lengths = numpy.array([len(r) for r in rows], dtype="int64")
        width = min(self.max_chars, int(lengths.max()) + self.min_width - 1)
        ids = numpy.zeros((len(rows), width), dtype="int64")
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return torch.from_numpy(ids), torch.from_numpy(lengths)

    @staticmethod
    def boundary_ids(mark: int) -> numpy.ndarray:
        """Character ids of a sentence-boundary token: (3,) int64."""
        return numpy.array([BEGIN_OF_WORD, mark, END_OF_WORD], dtype="int64")
