"""Token strings to a biLM's encoder inputs: the `TokenBatch`."""

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy
import torch

from .chars import CharIds
from .config import BiLMConfig
from .vocab import WordVocab

BOS_TYPE, EOS_TYPE = 0, 1  # rows of TokenBatch.type_inputs


@dataclass
class TokenBatch:
    """Tokenised docs as encoder inputs. Each distinct token is encoded once.

    type_inputs: (U, W) character ids (encoders that read characters) or
        (U,) word ids (word encoder) of the U distinct types; rows 0 and 1 are
        <S> and </S>.
    type_chars: (U,) number of character ids in each row, marks included.
    type_word_ids: (U,) vocabulary id of each type: the softmax targets, and
        the rows of a word embedding.
    index: (B, T + 2) type of each position of the framed docs
        (<S> tokens </S>, then padding).
    lengths: (B,) tokens per doc, unframed.
    types: the U - 2 token strings of rows 2 and on.
    """

    type_inputs: torch.Tensor
    type_chars: torch.Tensor
    type_word_ids: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor
    types: Sequence[str] = field(default=())

    def to(self, device: torch.device) -> "TokenBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return TokenBatch(**moved)


def token_batch(
    docs: Sequence[Sequence[str]], config: BiLMConfig, vocab: WordVocab, chars: CharIds | None
) -> TokenBatch:
    """The encoder inputs of B tokenised docs, for a biLM of `config` with
    this word vocabulary and, for an encoder that reads characters, these
    `CharIds` (None: the word encoder, whose inputs are the word ids)."""
    type_of: dict[str, int] = {}
    width = max((len(d) for d in docs), default=0) + 2
    index = numpy.full((len(docs), width), EOS_TYPE, dtype="int64")
    index[:, 0] = BOS_TYPE
    for row, tokens in enumerate(docs):
        index[row, 1 : len(tokens) + 1] = [type_of.setdefault(t, len(type_of) + 2) for t in tokens]
    types = list(type_of)
    if config.char_ids == "char_vocab":  # the reference looks the cut token up
        type_word_ids = vocab.word_ids([t[: config.max_chars - 2] for t in types])
    else:
        type_word_ids = vocab.word_ids(types)
    if chars is None:
        type_inputs, type_chars = type_word_ids, torch.ones_like(type_word_ids)
    else:
        type_inputs, type_chars = chars.char_ids(types)
    lengths = torch.tensor([len(d) for d in docs], dtype=torch.int64)
    return TokenBatch(
        type_inputs, type_chars, type_word_ids, torch.from_numpy(index), lengths, types
    )


def reverse_index(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) index that reverses each row's first lengths[b] positions and keeps
    the padding in place. It is its own inverse."""
    steps = torch.arange(length, device=lengths.device)[None, :]
    flipped = lengths[:, None] - 1 - steps
    return torch.where(flipped >= 0, flipped, steps)


def gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T, D), index (B, T) -> x[b, index[b, t]]."""
    return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[2]))
