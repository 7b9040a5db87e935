"""Tokens as character ids for the char CNN: this package's scheme and bilm-tf's.

Both frame a token's UTF-8 bytes with begin- and end-of-word marks, and both
give the sentence-boundary tokens their own marks. They differ in the ids
and in what padding means:

- "masked" (models trained here by default): byte b is id b + 1, id 0 pads
  and has a zero embedding, and the char CNN masks every window that starts
  after the end-of-word mark, so a token's encoding depends on its bytes only.
- "bilm_tf" (bilm-tf's, what the published ELMo models use): byte b is id b,
  256/257 mark the sentence boundaries, 258/259 begin and end a word, and 260
  pads every token to `max_chars` with a learned embedding; the char CNN
  max-pools over every position, padding included.

Either way a batch holds only as many columns as its longest token needs:
what lies beyond is padding, which the char CNN accounts for without
materialising it (see `CharCNNEncoder`).
"""

from collections.abc import Sequence

import numpy
import torch

SCHEMES = ("masked", "bilm_tf")


class CharIds:
    """Maps tokens to character ids under one scheme.

    max_chars: ids per token, marks included; longer tokens keep their first
        `max_chars - 2` bytes.
    min_width: the widest convolution; each batch has at least this many
        columns past its longest token, so that every window that starts
        inside a token fits.
    """

    begin_of_word: int
    end_of_word: int
    begin_of_sentence: int
    end_of_sentence: int
    padding: int
    n_ids: int  # rows of the character embedding
    masked: bool  # padding left out of the char CNN's max-pooling

    def __init__(self, max_chars: int, min_width: int, cache_size: int = 100_000) -> None:
        self.max_chars = max_chars
        self.min_width = min_width
        self.cache_size = cache_size
        self._cache: dict[str, numpy.ndarray] = {}

    def byte_ids(self, data: bytes) -> numpy.ndarray:
        raise NotImplementedError

    def encode(self, token: str) -> bytes:
        raise NotImplementedError

    def token_ids(self, token: str) -> numpy.ndarray:
        """The (n,) int64 character ids of one token, marks included."""
        ids = self._cache.get(token)
        if ids is None:
            data = self.encode(token)[: self.max_chars - 2]
            ids = numpy.empty(len(data) + 2, dtype="int64")
            ids[0] = self.begin_of_word
            ids[1:-1] = self.byte_ids(data)
            ids[-1] = self.end_of_word
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[token] = ids
        return ids

    def boundary_ids(self, mark: int) -> numpy.ndarray:
        """Character ids of a sentence-boundary token: (3,) int64."""
        return numpy.array([self.begin_of_word, mark, self.end_of_word], dtype="int64")

    def char_ids(self, types: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Character ids of <S>, </S> and then each of `types`.

        Returns ids (2 + U, W) int64, right-padded with `padding`, and the
        number of ids per row, marks included (2 + U,). W is the longest row
        plus `min_width - 1`, at most `max_chars`.
        """
        rows = [
            self.boundary_ids(self.begin_of_sentence),
            self.boundary_ids(self.end_of_sentence),
        ]
        rows += [self.token_ids(t) for t in types]
        lengths = numpy.array([len(r) for r in rows], dtype="int64")
        width = min(self.max_chars, int(lengths.max()) + self.min_width - 1)
        ids = numpy.full((len(rows), width), self.padding, dtype="int64")
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return torch.from_numpy(ids), torch.from_numpy(lengths)


class MaskedCharIds(CharIds):
    """This package's scheme: byte b -> b + 1, 0 pads (masked out of the max)."""

    padding = 0
    masked = True
    begin_of_word = 257
    end_of_word = 258
    begin_of_sentence = 259
    end_of_sentence = 260
    n_ids = 261

    def encode(self, token: str) -> bytes:
        return token.encode("utf-8", errors="surrogatepass")

    def byte_ids(self, data: bytes) -> numpy.ndarray:
        return numpy.frombuffer(data, dtype="uint8").astype("int64") + 1


class BilmTfCharIds(CharIds):
    """bilm-tf's scheme: byte b -> b, marks 256-259, 260 pads (a learned row).
    Bytes that are not valid UTF-8 (lone surrogates) are left out, and the
    literal tokens <S> and </S> are the sentence boundaries, as in bilm-tf."""

    begin_of_sentence = 256
    end_of_sentence = 257
    begin_of_word = 258
    end_of_word = 259
    padding = 260
    masked = False
    n_ids = 261
    boundary_tokens = {"<S>": 256, "</S>": 257}

    def encode(self, token: str) -> bytes:
        return token.encode("utf-8", errors="ignore")

    def byte_ids(self, data: bytes) -> numpy.ndarray:
        return numpy.frombuffer(data, dtype="uint8").astype("int64")

    def token_ids(self, token: str) -> numpy.ndarray:
        mark = self.boundary_tokens.get(token)
        return super().token_ids(token) if mark is None else self.boundary_ids(mark)


def char_ids_for(scheme: str, max_chars: int, min_width: int) -> CharIds:
    """The `CharIds` of a scheme name (see SCHEMES)."""
    if scheme == "masked":
        return MaskedCharIds(max_chars, min_width)
    if scheme == "bilm_tf":
        return BilmTfCharIds(max_chars, min_width)
    raise ValueError(f"char_ids = {scheme!r}; use one of {SCHEMES}")
