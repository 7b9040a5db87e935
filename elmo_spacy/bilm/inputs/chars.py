"""Tokens as character ids for the char CNN: this package's scheme, bilm-tf's
and ELMoForManyLangs'.

All three frame a token's units (UTF-8 bytes, or characters) with begin- and
end-of-word marks, and give the sentence-boundary tokens their own marks.
They differ in the units, the ids and what padding means:

- "masked" (models trained here by default): byte b is id b + 1, id 0 pads
  and has a zero embedding, and the char CNN masks every window that starts
  after the end-of-word mark, so a token's encoding depends on its bytes only.
- "bilm_tf" (bilm-tf's, what the published ELMo models use): byte b is id b,
  256/257 mark the sentence boundaries, 258/259 begin and end a word, and 260
  pads every token to `max_chars` with a learned embedding; the char CNN
  max-pools over every position, padding included.
- "char_vocab" (ELMoForManyLangs'): the units are characters (code points),
  each the id of its entry in the model's character vocabulary (`<oov>` if it
  has none); `<pad>` pads as in bilm-tf. The reference swaps its two word
  marks, in training and inference alike: a token starts with the id of
  `<eow>` and ends with that of `<bow>`. The boundary tokens are the ids of
  `<bos>` and `<eos>` between those marks.

Either way a batch holds only as many columns as its longest token needs:
what lies beyond is padding, which the char CNN accounts for without
materialising it (see `CharCNNEncoder`).
"""

from collections.abc import Sequence

import numpy
import torch

from ...errors import ElmoSpacyError

SCHEMES = ("masked", "bilm_tf", "char_vocab")


class CharIds:
    """Maps tokens to character ids under one scheme.

    max_chars: ids per token, marks included; longer tokens keep their first
        `max_chars - 2` units.
    min_width: the widest convolution; each batch has at least this many
        columns past its longest token, so that every window that starts
        inside a token fits.
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

    def encode(self, token: str) -> bytes | str:
        """The token's units: bytes, or characters."""
        raise NotImplementedError

    def unit_ids(self, units: bytes | str) -> numpy.ndarray:
        """(n,) int64 ids of n units."""
        raise NotImplementedError

    def token_ids(self, token: str) -> numpy.ndarray:
        """The (n,) int64 character ids of one token, marks included."""
        ids, lengths = self.char_ids([token])
        return ids[2, : lengths[2]].numpy()

    def boundary_ids(self, mark: int) -> numpy.ndarray:
        """Character ids of a sentence-boundary token: (3,) int64."""
        return numpy.array([self.begin_of_word, mark, self.end_of_word], dtype="int64")

    def char_ids(self, types: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Character ids of <S>, </S> and then each of `types`.

        Returns ids (2 + U, W) int64, right-padded with `padding`, and the
        number of ids per row, marks included (2 + U,). W is the longest row
        plus `min_width - 1`, at most `max_chars`.
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
    """This package's scheme: byte b -> b + 1, 0 pads (masked out of the max)."""

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
    """bilm-tf's scheme: byte b -> b, marks 256-259, 260 pads (a learned row).
    Bytes that are not valid UTF-8 (lone surrogates) are left out, and the
    literal tokens <S> and </S> are the sentence boundaries, as in bilm-tf."""

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
    """ELMoForManyLangs' scheme: character c -> its index in `chars` (the
    character vocabulary, in id order, holding CHAR_VOCAB_SPECIALS), `<oov>`
    for characters it lacks; `<pad>` pads (a learned row). The word marks are
    swapped as in the reference, and the literal tokens <bos> and <eos> are
    the sentence boundaries."""

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
    """The `CharIds` of a scheme name (see SCHEMES); "char_vocab" needs `chars`."""
    if scheme == "masked":
        return MaskedCharIds(max_chars, min_width)
    if scheme == "bilm_tf":
        return BilmTfCharIds(max_chars, min_width)
    if scheme == "char_vocab":
        if not chars:
            raise ElmoSpacyError("char_ids = 'char_vocab' needs the biLM's character vocabulary")
        return VocabCharIds(chars, max_chars, min_width)
    raise ElmoSpacyError(f"char_ids = {scheme!r}; use one of {SCHEMES}")
