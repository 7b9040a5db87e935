"""Batches of a few shapes: every size of a training step rounded up to a
ladder of sizes, the padding exact (it changes neither the loss nor the
gradients).

A step whose every shape and host-side number comes from a small set can be
captured once per set and replayed (CUDA graphs, `torch.compile`), and
kernels built for one shape (oneDNN's, Triton's) serve the next batch. A
`TokenBatch` with its `LMTargets` has these sizes (see `step_shape`):

- T, the longest doc: padded with </S> columns that no target reads;
- B, the docs: padded with empty docs (no targets) to B = batch_tokens // T
  (the batch's plan used the rounded lengths, so its docs fit);
- U, the distinct types, and W, the char ids per type: padded with copies
  of </S>'s row, which no position reads, and with padding ids, which the
  char CNN treats as it treats the padding beyond a token (see
  `CharCNNEncoder`);
- each softmax cluster's predictions, per direction: padded with
  predictions of weight 0 (`LMTargets.forward_weights`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy
import torch

from .batch import BOS_TYPE, EOS_TYPE, LMTargets, TokenBatch, lm_targets
from .chars import CharIds


def ladder_sizes(lengths: numpy.ndarray, per_octave: int) -> numpy.ndarray:
    """The smallest size >= n, for each n of `lengths` (int64), with at most
    `per_octave` sizes between two powers of two (a power of two itself):
    2^j + i 2^j / per_octave for 2^j < n <= 2^(j + 1), and n itself up to
    per_octave. So a size wastes less than 1 / per_octave of itself, and
    sizes up to N take about per_octave log2(N) values."""
    lengths = numpy.asarray(lengths, dtype="int64")
    _, exponent = numpy.frexp(numpy.maximum(lengths - 1, 1))  # n - 1 < 2^exponent, exactly
    octave = numpy.left_shift(1, exponent.astype("int64") - 1)  # 2^j
    step = numpy.maximum(1, octave // per_octave)
    return numpy.where(lengths <= per_octave, lengths, -(-lengths // step) * step)


def ladder_size(n: int, per_octave: int) -> int:
    """`ladder_sizes` of one size."""
    return int(ladder_sizes(numpy.array([n]), per_octave)[0])


@dataclass(frozen=True)
class ShapeBuckets:
    """Pads pretraining batches to a few shapes (see the module docstring).

    per_octave: sizes per octave of each dimension (`ladder_sizes`): 4 wastes
        at most a quarter, 8 an eighth.
    batch_tokens: padded tokens a batch holds: the rows of a batch whose
        docs are T tokens long at most are batch_tokens // T.
    shares: the batch is cut into this many shares (the ranks of a
        distributed run: rank r takes docs r, r + shares, ...), each padded
        alone to its share of the rows.
    """

    per_octave: int
    batch_tokens: int
    shares: int = 1

    def size(self, n: int) -> int:
        return ladder_size(n, self.per_octave)

    def plan_lengths(self, lengths: numpy.ndarray) -> numpy.ndarray:
        """The lengths a batch plan should cut runs by (`length_runs`), so
        that every planned batch fits the rows `pad` gives it."""
        return ladder_sizes(lengths, self.per_octave)

    def rows(self, width: int) -> int:
        """B of a share of a batch whose longest doc is `width` tokens (rounded)."""
        return -(-max(1, self.batch_tokens // max(width, 1)) // self.shares)

    def pad(
        self, batch: TokenBatch, chars: CharIds | None, cluster_starts: Sequence[int]
    ) -> TokenBatch:
        """`batch` (without targets) padded to its bucket's shape, with its
        targets for a softmax whose tail clusters start at `cluster_starts`.
        Its loss and gradients are the unpadded batch's. Its `types` stay
        the batch's: the padding rows have no string (none is read in
        training)."""
        n_docs, framed = batch.index.shape
        width = self.size(framed - 2)
        rows = max(self.rows(width), n_docs)
        index = torch.full((rows, width + 2), EOS_TYPE, dtype=torch.int64)
        index[:n_docs, :framed] = batch.index
        index[n_docs:, 0] = BOS_TYPE  # an empty doc: <S> </S>
        lengths = torch.zeros(rows, dtype=torch.int64)
        lengths[:n_docs] = batch.lengths
        n_types = len(batch.type_word_ids)
        more = [EOS_TYPE] * (self.size(n_types) - n_types)
        type_inputs = torch.cat([batch.type_inputs, batch.type_inputs[more]])
        if chars is not None:  # (U, W) char ids: W on the ladder too
            columns = min(self.size(type_inputs.shape[1]), chars.max_chars)
            wide = torch.full((len(type_inputs), columns), chars.padding, dtype=torch.int64)
            wide[:, : type_inputs.shape[1]] = type_inputs
            type_inputs = wide
        type_word_ids = torch.cat([batch.type_word_ids, batch.type_word_ids[more]])
        targets = lm_targets(index[:n_docs], type_word_ids, lengths[:n_docs], cluster_starts)
        return TokenBatch(
            type_inputs,
            torch.cat([batch.type_chars, batch.type_chars[more]]),
            type_word_ids,
            index,
            lengths,
            batch.types,
            self._pad_targets(targets, cluster_starts),
        )

    def _pad_targets(self, targets: LMTargets, cluster_starts: Sequence[int]) -> LMTargets:
        first_words = [0, *cluster_starts]  # a word of each cluster, for the padding
        directions = []
        for rows, words, splits in (
            (targets.forward_rows, targets.forward_words, targets.forward_splits),
            (targets.backward_rows, targets.backward_words, targets.backward_splits),
        ):
            parts: list[list[torch.Tensor]] = [[], [], []]
            new_splits = [0]
            for cluster, (start, stop) in enumerate(zip(splits[:-1], splits[1:])):
                size = self.size(stop - start)
                more = size - (stop - start)
                parts[0] += [rows[start:stop], torch.zeros(more, dtype=torch.int64)]
                parts[1] += [words[start:stop], torch.full((more,), first_words[cluster])]
                parts[2] += [torch.ones(stop - start), torch.zeros(more)]
                new_splits.append(new_splits[-1] + size)
            directions.append([torch.cat(p) for p in parts] + [new_splits])
        (f_rows, f_words, f_weights, f_splits), (b_rows, b_words, b_weights, b_splits) = directions
        return LMTargets(
            f_rows, f_words, f_splits, b_rows, b_words, b_splits,
            forward_weights=f_weights, backward_weights=b_weights, predictions=targets.n_tokens,
        )  # fmt: skip


def step_shape(batch: TokenBatch) -> tuple:
    """What fixes the shapes and the host-side numbers of a training step on
    `batch` (with targets): the arrays' shapes and the clusters' splits. Two
    batches of one `step_shape` run the same kernels on the same sizes."""
    targets = batch.targets
    return (
        tuple(batch.type_inputs.shape),
        tuple(batch.index.shape),
        None if targets is None else tuple(targets.forward_splits),
        None if targets is None else tuple(targets.backward_splits),
    )
