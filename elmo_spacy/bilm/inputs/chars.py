"""Tokens as character ids for the char CNN, in three schemes (one class
each): this package's ("masked"), bilm-tf's and ELMoForManyLangs'.
"""

from collections.abc import Sequence

import numpy
import torch

from ...errors import ElmoSpacyError

SCHEMES = ("masked", "bilm_tf", "char_vocab")


class CharIds:
    """Maps tokens to character ids under one scheme, each token's units
    framed by word marks. max_chars: ids per token, marks included (longer
    tokens are cut); min_width: the widest convolution.
    """

    begin_of_word: int
    end_of_word: int
    begin_of_sentence: int
    end_of_sentence: int
    scheme: str  # its name in SCHEMES
    padding: int
    n_ids: int  # rows of the character embedding
    masked: bool  # padding left out of the char CNN's max-pooling

    boundary_tokens: dict[str, int] = {}  # token strings read as sentence boundaries
    no_units: bytes | str = b""  # the units of the empty string

    def __init__(self, max_chars: int, min_width: int) -> None:
        self.max_chars = max_chars
        self.min_width = min_width

    def encode(self, token: str) -> bytes | str:  # the token's units
        raise NotImplementedError

    def unit_ids(self, units: bytes | str) -> numpy.ndarray:  # (n,) int64
        raise NotImplementedError

    def token_ids(self, token: str) -> numpy.ndarray:
        """The (n,) int64 character ids of one token, marks included."""
        ids, lengths = self.char_ids([token])
        return ids[2, : lengths[2]].numpy()

    def boundary_ids(self, mark: int) -> numpy.ndarray:
        return numpy.array([self.begin_of_word, mark, self.end_of_word], dtype="int64")

    def char_ids(self, types: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Character ids (2 + U, W) of <S>, </S> and each of `types`, padded,
        and the ids in each row, marks included (2 + U,). W is the longest row
        plus `min_width - 1` (every window that starts inside a token fits),
        at most `max_chars`.
        """
        cut = self.max_chars - 2
        units = [self.encode(t)[:cut] for t in types]
        lengths = numpy.empty(len(units) + 2, dtype="int64")
        lengths[:2] = 3
        lengths[2:] = [len(u) + 2 for u in units]
        width = min(self.max_chars, int(lengths.max()) + self.min_width - 1)
        ids = numpy.full((len(lengths), width), self.padding, dtype="int64")
        rows = numpy.arange(len(lengths))
        inside = numpy.arange(1, width)[None, :] < (lengths[:, None] - 1)  # between the marks
        inside[:2] = False
        ids[:, 1:][inside] = self.unit_ids(self.no_units.join(units))
        ids[:, 0] = self.begin_of_word
        ids[rows, lengths - 1] = self.end_of_word
        ids[:2, 1] = self.begin_of_sentence, self.end_of_sentence
        if self.boundary_tokens:
            for row, token in enumerate(types, start=2):
                mark = self.boundary_tokens.get(token)
                if mark is not None:
                    ids[row] = self.padding
                    ids[row, :3] = self.boundary_ids(mark)
                    lengths[row] = 3
        return torch.from_numpy(ids), torch.from_numpy(lengths)


class MaskedCharIds(CharIds):
    """This package's scheme: byte b -> b + 1, 0 pads, masked out of the max."""

    scheme = "masked"
    padding = 0
    masked = True
    begin_of_word = 257
    end_of_word = 258
    begin_of_sentence = 259
    end_of_sentence = 260
    n_ids = 261

    def encode(self, token: str) -> bytes:
        return token.encode("utf-8", errors="surrogatepass")

    def unit_ids(self, units: bytes) -> numpy.ndarray:
        return numpy.frombuffer(units, dtype="uint8").astype("int64") + 1


class BilmTfCharIds(CharIds):
    """bilm-tf's scheme: byte b -> b, 260 pads (a learned row, max-pooled);
    invalid UTF-8 is left out, and the tokens <S> and </S> are boundaries."""

    scheme = "bilm_tf"
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

    def unit_ids(self, units: bytes) -> numpy.ndarray:
        return numpy.frombuffer(units, dtype="uint8").astype("int64")


CHAR_VOCAB_SPECIALS = ("<oov>", "<pad>", "<bow>", "<eow>", "<bos>", "<eos>")


class VocabCharIds(CharIds):
    """ELMoForManyLangs' scheme: character c -> its index in `chars` (holding
    CHAR_VOCAB_SPECIALS), else `<oov>`; `<pad>` pads. The word marks are
    swapped as in the reference; the tokens <bos> and <eos> are boundaries."""

    scheme = "char_vocab"
    masked = False

    def __init__(self, chars: Sequence[str], max_chars: int, min_width: int) -> None:
        super().__init__(max_chars, min_width)
        self.index = {c: i for i, c in enumerate(chars)}
        missing = [s for s in CHAR_VOCAB_SPECIALS if s not in self.index]
        if missing or len(self.index) != len(chars):
            raise ElmoSpacyError(
                f"A character vocabulary holds each entry once, including {CHAR_VOCAB_SPECIALS}"
                + (f"; it lacks {missing}" if missing else "; it repeats an entry")
            )
        self.n_ids = len(chars)
        self.oov, self.padding = self.index["<oov>"], self.index["<pad>"]
        self.begin_of_word, self.end_of_word = self.index["<eow>"], self.index["<bow>"]
        self.begin_of_sentence = self.index["<bos>"]
        self.end_of_sentence = self.index["<eos>"]
        self.boundary_tokens = {"<bos>": self.begin_of_sentence, "<eos>": self.end_of_sentence}

    no_units = ""

    def encode(self, token: str) -> str:
        return token

    def unit_ids(self, units: str) -> numpy.ndarray:
        return numpy.array([self.index.get(c, self.oov) for c in units], dtype="int64")


def char_ids_for(
    scheme: str, max_chars: int, min_width: int, chars: Sequence[str] | None = None
) -> CharIds:
    """The `CharIds` of a scheme; "char_vocab" needs `chars`."""
    if scheme == "char_vocab":
        if not chars:
            raise ElmoSpacyError("char_ids = 'char_vocab' needs the biLM's character vocabulary")
        return VocabCharIds(chars, max_chars, min_width)
    if scheme not in SCHEMES:
        raise ElmoSpacyError(f"char_ids = {scheme!r}; use one of {SCHEMES}")
    return {"masked": MaskedCharIds, "bilm_tf": BilmTfCharIds}[scheme](max_chars, min_width)
