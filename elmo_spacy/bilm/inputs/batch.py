"""Token strings to a biLM's encoder inputs (the `TokenBatch`), its language-model
targets (`LMTargets`), and length-bucketed batches (`length_runs`)."""

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy
import torch

from .chars import CharIds
from .vocab import WordVocab

BOS_TYPE, EOS_TYPE = 0, 1  # rows of TokenBatch.type_inputs


@dataclass
class LMTargets:
    """What the language model predicts in a batch, worked out on the host so
    that the loss needs no host-device synchronisation.

    Position t of a framed doc (<S> tokens </S>) predicts t + 1 forwards and,
    from t + 1, t backwards, for t < length + 1: N = sum(lengths + 1) a
    direction. Rows index the (B * (T + 2)) flattened positions; each
    direction's predictions are grouped by softmax cluster (head first), a
    cluster's rows the slice `splits[i]:splits[i + 1]`.

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
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def map(self, move) -> "LMTargets":
        """The targets with `move` applied to each tensor."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return LMTargets(
            **{k: move(v) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        )


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
    types: the U - 2 token strings of rows 2 and on (empty where the batch
        was built from token ids for a word encoder, which reads none).
    targets: the language-model targets, where they were worked out with the
        batch (`with_targets`); `BiLM.lm_loss` works them out otherwise.
    """

    type_inputs: torch.Tensor
    type_chars: torch.Tensor
    type_word_ids: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor
    types: Sequence[str] = field(default=())
    targets: LMTargets | None = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "TokenBatch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def mask(self, boundaries: bool = False) -> torch.Tensor:
        """(B, T) bool, True at each doc's tokens; with `boundaries`,
        (B, T + 2): <S>, the tokens and </S>."""
        extra = 2 if boundaries else 0
        steps = torch.arange(self.index.shape[1] - 2 + extra, device=self.lengths.device)
        return steps[None, :] < (self.lengths + extra)[:, None]

    def pin_memory(self) -> "TokenBatch":
        """The batch in page-locked memory, so that copies to a GPU run
        asynchronously (`to(..., non_blocking=True)`)."""
        return self._map(torch.Tensor.pin_memory)

    def with_targets(self, cluster_starts: Sequence[int]) -> "TokenBatch":
        """The batch with its `targets` for a softmax whose tail clusters start
        at these vocabulary ids (`SoftmaxHead.cluster_starts`)."""
        targets = lm_targets(self.index, self.type_word_ids, self.lengths, cluster_starts)
        return TokenBatch(**{**self._fields(), "targets": targets})

    def _fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def _map(self, move) -> "TokenBatch":
        moved = self._fields()
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = move(value)
        if self.targets is not None:
            moved["targets"] = self.targets.map(move)
        return TokenBatch(**moved)


def token_batch(
    docs: Sequence[Sequence[str]],
    vocab: WordVocab,
    chars: CharIds | None,
    cut_words_at: int | None = None,
) -> TokenBatch:
    """The encoder inputs of B tokenised docs, for a biLM with this word
    vocabulary and, for an encoder that reads characters, these `CharIds`
    (None: the word encoder, whose inputs are the word ids). `cut_words_at`:
    look words up by their first so many characters (ELMoForManyLangs'
    character-vocabulary models look the cut token up)."""
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
    """A `TokenBatch` from its parts: the U - 2 type strings (may be empty for
    the word encoder), the (U,) word ids of <S>, </S> and the types, the
    (B, T + 2) int64 index and the (B,) int64 lengths."""
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
    """The `LMTargets` of a batch (index (B, T + 2), type_word_ids (U,),
    lengths (B,), on the CPU) for a softmax whose tail clusters start at
    `cluster_starts` (ascending vocabulary ids; none for a full softmax)."""
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
    """Cut items of ascending `lengths` into consecutive batches whose padded
    size (items x the longest) stays within `max_tokens`, at least one item
    each (an item longer than `max_tokens` runs alone). Returns the (n + 1,)
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
