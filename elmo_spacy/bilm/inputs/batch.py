"""Token strings to a biLM's inputs (`TokenBatch`) and LM targets (`LMTargets`)."""

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import numpy
import torch

from .chars import CharIds
from .vocab import WordVocab

BOS_TYPE, EOS_TYPE = 0, 1  # rows of TokenBatch.type_inputs


@dataclass
class LMTargets:
    """What the language model predicts in a batch, worked out on the host (no
    synchronisation). Position t of a framed doc predicts t + 1 forwards and,
    from t + 1, t backwards, for t < length + 1: N = sum(lengths + 1) a
    direction, grouped by softmax cluster (head first).

    forward_rows, backward_rows: (N,) int64 flat positions of the hidden states.
    forward_words, backward_words: (N,) int64 vocabulary ids to predict.
    forward_splits, backward_splits: the cluster boundaries, 0 first and N last.
    """

    forward_rows: torch.Tensor
    forward_words: torch.Tensor
    forward_splits: list[int]
    backward_rows: torch.Tensor
    backward_words: torch.Tensor
    backward_splits: list[int]

    @property
    def n_tokens(self) -> int:
        """Predictions per direction."""
        return len(self.forward_rows)

    def to(self, device: torch.device, non_blocking: bool = False) -> "LMTargets":
        return _moved(self, lambda t: t.to(device, non_blocking=non_blocking))


@dataclass
class TokenBatch:
    """Tokenised docs as encoder inputs, each distinct token (type) once.

    type_inputs: (U, W) character ids, or (U,) word ids (word encoder), of
        the U types; rows 0 and 1 are <S> and </S>.
    type_chars: (U,) number of character ids in each row, marks included.
    type_word_ids: (U,) vocabulary id of each type.
    index: (B, T + 2) type of each position of the docs framed by <S> and
        </S>, then padding.
    lengths: (B,) tokens per doc, unframed.
    types: the U - 2 token strings of rows 2 and on (may be empty for a word
        encoder).
    targets: the LM targets, where worked out with the batch (`with_targets`).
    """

    type_inputs: torch.Tensor
    type_chars: torch.Tensor
    type_word_ids: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor
    types: Sequence[str] = field(default=())
    targets: LMTargets | None = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "TokenBatch":
        return _moved(self, lambda t: t.to(device, non_blocking=non_blocking))

    def mask(self, boundaries: bool = False) -> torch.Tensor:
        """(B, T) bool, True at each doc's tokens; with `boundaries`,
        (B, T + 2): <S>, the tokens and </S>."""
        extra = 2 if boundaries else 0
        steps = torch.arange(self.index.shape[1] - 2 + extra, device=self.lengths.device)
        return steps[None, :] < (self.lengths + extra)[:, None]

    def pin_memory(self) -> "TokenBatch":
        """The batch in page-locked memory, for `to(..., non_blocking=True)`."""
        return _moved(self, torch.Tensor.pin_memory)

    def with_targets(self, cluster_starts: Sequence[int]) -> "TokenBatch":
        """The batch with its `targets` for a softmax whose tail clusters start
        at these vocabulary ids (`SoftmaxHead.cluster_starts`)."""
        targets = lm_targets(self.index, self.type_word_ids, self.lengths, cluster_starts)
        return replace(self, targets=targets)


def _moved(value, move):
    """`value` with `move` applied to each tensor in it (in a batch or targets too)."""
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, (TokenBatch, LMTargets)):
        moved = {f.name: _moved(getattr(value, f.name), move) for f in fields(value)}
        return replace(value, **moved)
    return value


def token_batch(
    docs: Sequence[Sequence[str]],
    vocab: WordVocab,
    chars: CharIds | None,
    cut_words_at: int | None = None,
) -> TokenBatch:
    """The encoder inputs of B tokenised docs (`chars` None: the word
    encoder's). `cut_words_at`: look words up by their first so many
    characters (as ELMoForManyLangs' character-vocabulary models do)."""
    type_of: dict[str, int] = {}
    width = max((len(d) for d in docs), default=0) + 2
    index = numpy.full((len(docs), width), EOS_TYPE, dtype="int64")
    index[:, 0] = BOS_TYPE
    for row, tokens in enumerate(docs):
        index[row, 1 : len(tokens) + 1] = [type_of.setdefault(t, len(type_of) + 2) for t in tokens]
    types = list(type_of)
    type_word_ids = vocab.word_ids([t[:cut_words_at] for t in types])
    lengths = numpy.array([len(d) for d in docs], dtype="int64")
    return types_batch(types, type_word_ids, index, lengths, chars)


def types_batch(
    types: Sequence[str],
    type_word_ids: torch.Tensor | numpy.ndarray,
    index: numpy.ndarray,
    lengths: numpy.ndarray,
    chars: CharIds | None,
) -> TokenBatch:
    """A `TokenBatch` from its parts, the index and lengths int64 arrays."""
    type_word_ids = torch.as_tensor(type_word_ids, dtype=torch.int64)
    if chars is None:
        type_inputs, type_chars = type_word_ids, torch.ones_like(type_word_ids)
    else:
        type_inputs, type_chars = chars.char_ids(types)
    index, lengths = torch.from_numpy(index), torch.from_numpy(lengths)
    return TokenBatch(type_inputs, type_chars, type_word_ids, index, lengths, types)


def lm_targets(
    index: torch.Tensor,
    type_word_ids: torch.Tensor,
    lengths: torch.Tensor,
    cluster_starts: Sequence[int],
) -> LMTargets:
    """The `LMTargets` of a batch's fields for a softmax whose tail clusters
    start at `cluster_starts` (ascending vocabulary ids)."""
    index, type_word_ids, lengths = (x.cpu().numpy() for x in (index, type_word_ids, lengths))
    words = type_word_ids[index]  # (B, T + 2)
    steps = index.shape[1] - 1
    predicts = numpy.arange(steps)[None, :] < (lengths + 1)[:, None]  # (B, T + 1)
    batch_rows, positions = numpy.nonzero(predicts)
    rows = batch_rows * index.shape[1] + positions
    forward = _by_cluster(rows, words[batch_rows, positions + 1], cluster_starts)
    backward = _by_cluster(rows + 1, words[batch_rows, positions], cluster_starts)
    return LMTargets(*forward, *backward)


def _by_cluster(
    rows: numpy.ndarray, words: numpy.ndarray, cluster_starts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    cluster = numpy.searchsorted(numpy.asarray(cluster_starts, dtype="int64"), words, "right")
    order = numpy.argsort(cluster, kind="stable")
    sizes = numpy.bincount(cluster, minlength=len(cluster_starts) + 1)
    splits = [0, *numpy.cumsum(sizes).tolist()]
    return torch.from_numpy(rows[order]), torch.from_numpy(words[order]), splits


def length_runs(lengths: numpy.ndarray, max_tokens: int) -> numpy.ndarray:
    """Cut items of ascending `lengths` into consecutive batches of at most
    `max_tokens` padded tokens (at least one item each). Returns the (n + 1,)
    boundaries: batch i holds items bounds[i]:bounds[i + 1]."""
    lengths = numpy.asarray(lengths, dtype="int64")
    bounds = [0]
    start = 0
    while start < len(lengths):
        # The batch cannot hold more than max_tokens // its shortest item.
        stop = min(len(lengths), start + max(1, max_tokens // max(int(lengths[start]), 1)))
        padded = lengths[start:stop] * numpy.arange(1, stop - start + 1)
        start += max(1, int(numpy.searchsorted(padded, max_tokens, side="right")))
        bounds.append(start)
    return numpy.array(bounds, dtype="int64")


def reverse_index(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) index that reverses each row's first lengths[b] positions and keeps
    the padding in place. It is its own inverse."""
    steps = torch.arange(length, device=lengths.device)[None, :]
    flipped = lengths[:, None] - 1 - steps
    return torch.where(flipped >= 0, flipped, steps)


def gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T, D), index (B, T) -> x[b, index[b, t]]."""
    return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[2]))
