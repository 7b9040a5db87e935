"""Pretraining batches over a prepared corpus: the dev sample, each epoch's
batches, planned as `Spans`, and the `TokenBatch`es built from them ahead of
the step. Each epoch's order follows from (seed, epoch) alone.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy

from ..bilm import BiLM, TokenBatch, WordVocab
from ..bilm.inputs.batch import BOS_TYPE, EOS_TYPE, length_runs, types_batch
from ..bilm.inputs.vocab import BOS_ID, EOS_ID, SPECIALS, UNK_ID
from ..errors import ElmoSpacyError
from .corpus import Corpus, TypeTable
from .distributed import ProcessGroup

CHUNK_DOCS = 1024  # consecutive docs that stay together when an epoch is shuffled
POOL_CHUNKS = 256  # chunks whose pieces are sorted by length together
DEV_STREAM, EPOCH_STREAM = 0, 1  # random streams of a seed: the dev sample, each epoch's order


class NotEnoughText(ElmoSpacyError):
    """The docs are too few to pretrain on (the message says how many are needed)."""


@dataclass
class Spans:
    """Spans of a corpus's tokens: (n,) int64 shard, first token and length."""

    shard: numpy.ndarray
    start: numpy.ndarray
    length: numpy.ndarray

    def __len__(self) -> int:
        return len(self.length)

    def take(self, rows: numpy.ndarray | slice) -> "Spans":
        return Spans(self.shard[rows], self.start[rows], self.length[rows])

    @property
    def tokens(self) -> int:
        return int(self.length.sum())

    @property
    def predictions(self) -> int:
        """Tokens each direction predicts: each piece's tokens and its boundary."""
        return self.tokens + len(self)

    @classmethod
    def concatenate(cls, parts: list["Spans"]) -> "Spans":
        if not parts:
            return cls(*(numpy.zeros(0, dtype="int64") for _ in range(3)))
        fields = ("shard", "start", "length")
        return cls(*(numpy.concatenate([getattr(p, f) for p in parts]) for f in fields))


def cut(shard: numpy.ndarray, start: numpy.ndarray, length: numpy.ndarray, max_length: int):
    """Docs (shard, first token, length) cut into consecutive pieces of at
    most `max_length` tokens; docs without tokens are left out."""
    n_pieces = -(-length // max_length)
    doc = numpy.repeat(numpy.arange(len(length)), n_pieces)
    first_piece = numpy.repeat(numpy.cumsum(n_pieces) - n_pieces, n_pieces)
    offset = (numpy.arange(len(doc)) - first_piece) * max_length
    return Spans(
        shard[doc].astype("int64"),
        start[doc] + offset,
        numpy.minimum(length[doc] - offset, max_length),
    )


def doc_spans(corpus: Corpus, docs: numpy.ndarray) -> tuple[numpy.ndarray, ...]:
    """(shard, first token, length) of each of the corpus's docs `docs` (sorted)."""
    shard = numpy.searchsorted(corpus.doc_starts, docs, side="right") - 1
    start = numpy.zeros(len(docs), dtype="int64")
    length = numpy.zeros(len(docs), dtype="int64")
    for s in numpy.unique(shard):
        rows = shard == s
        first, stop = corpus.shards[s].docs.pairs(docs[rows] - corpus.doc_starts[s])
        start[rows] = first
        length[rows] = stop - first
    return shard, start, length


@dataclass
class DevSample:
    """The docs of dev perplexity: (n,) sorted doc numbers of `corpus`."""

    corpus: Corpus
    docs: numpy.ndarray
    held_out: bool

    def spans(self, max_length: int) -> Spans:
        return cut(*doc_spans(self.corpus, self.docs), max_length)

    def excluded_from(self, corpus: Corpus) -> numpy.ndarray:
        """The doc numbers of `corpus` that training leaves out."""
        return self.docs if self.held_out and corpus is self.corpus else numpy.zeros(0, "int64")

    def type_counts(self) -> numpy.ndarray:
        """(n_types,) int64 how often each type occurs in the sample's docs."""
        spans = zip(*(a.tolist() for a in doc_spans(self.corpus, self.docs)))
        ids = [self.corpus.tokens(shard, start, length) for shard, start, length in spans]
        return numpy.bincount(numpy.concatenate(ids), minlength=len(self.corpus.types))


def dev_sample(
    corpus: Corpus, fraction: float, max_tokens: int, seed: int, held_out: bool = True
) -> DevSample:
    """A seeded sample of a `fraction` of the corpus's docs, drawn until they
    hold `max_tokens` tokens (at least one doc)."""
    n_docs = corpus.n_docs
    wanted = max(1, round(n_docs * fraction)) if fraction > 0 else n_docs
    if held_out and wanted >= n_docs:
        need = next(n for n in range(n_docs + 1, 10**6) if max(1, round(n * fraction)) < n)
        raise NotEnoughText(
            f"{n_docs} doc(s) (non-blank lines) are too few: [training] dev_fraction = "
            f"{fraction} holds out {wanted} for dev perplexity, which leaves none to train on. "
            f"Give at least {need} docs, or set dev_fraction = 0 (--training.dev_fraction 0) "
            "to measure perplexity on the training docs."
        )
    rng = numpy.random.default_rng(numpy.random.SeedSequence(seed, spawn_key=(DEV_STREAM,)))
    # Each doc holds a token at least: more than max_tokens docs are never needed.
    candidates = rng.choice(n_docs, size=min(wanted, max_tokens), replace=False)
    order = numpy.argsort(candidates)
    lengths = numpy.empty(len(candidates), dtype="int64")
    lengths[order] = doc_spans(corpus, candidates[order])[2]
    kept = max(1, int(numpy.searchsorted(numpy.cumsum(lengths), max_tokens, side="right")))
    return DevSample(corpus, numpy.sort(candidates[:kept]), held_out)


def epoch_batches(
    corpus: Corpus,
    *,
    seed: int,
    epoch: int,
    max_length: int,
    batch_tokens: int,
    exclude: numpy.ndarray,
) -> Iterator[Spans]:
    """The batches of one epoch in order, each padded to at most `batch_tokens`
    tokens, the docs numbered in `exclude` left out (docs/pretraining.md,
    Batches, tells how they are drawn)."""
    rng = numpy.random.default_rng(numpy.random.SeedSequence(seed, spawn_key=(EPOCH_STREAM, epoch)))
    chunk_shard, chunk_first = _chunks(corpus)
    order = rng.permutation(len(chunk_shard))
    for pool in range(0, len(order), POOL_CHUNKS):
        parts = []
        for c in order[pool : pool + POOL_CHUNKS]:
            s, first = chunk_shard[c], chunk_first[c]
            offsets = corpus.shards[s].docs[first : first + CHUNK_DOCS + 1]
            docs = corpus.doc_starts[s] + first + numpy.arange(len(offsets) - 1)
            keep = ~numpy.isin(docs, exclude)
            length = numpy.diff(offsets)[keep]
            parts.append(cut(numpy.full(len(length), s), offsets[:-1][keep], length, max_length))
        pieces = Spans.concatenate(parts)
        shuffled = rng.permutation(len(pieces))
        by_length = shuffled[numpy.argsort(pieces.length[shuffled], kind="stable")]
        bounds = length_runs(pieces.length[by_length], batch_tokens)
        for b in rng.permutation(len(bounds) - 1):
            yield pieces.take(by_length[bounds[b] : bounds[b + 1]])


def ordered_batches(spans: Spans, batch_tokens: int) -> list[Spans]:
    """Spans sorted by length and cut into batches of at most `batch_tokens`
    padded tokens, in that order (for measuring perplexity)."""
    by_length = numpy.argsort(spans.length, kind="stable")
    bounds = length_runs(spans.length[by_length], batch_tokens)
    return [spans.take(by_length[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _chunks(corpus: Corpus) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Shard and first doc of each chunk of CHUNK_DOCS docs (within a shard)."""
    firsts = [numpy.arange(0, s.n_docs, CHUNK_DOCS) for s in corpus.shards]
    shard = numpy.concatenate([numpy.full(len(f), i) for i, f in enumerate(firsts)])
    return shard, numpy.concatenate(firsts)


def corpus_vocabulary(
    types: TypeTable, max_size: int, min_count: int, held_out: DevSample | None = None
) -> WordVocab:
    """The vocabulary of a fresh biLM, as `WordVocab.build` orders it, not
    counting the docs of a `held_out` dev sample."""
    counts = numpy.asarray(types.counts)
    if held_out is not None and held_out.held_out:
        counts = counts - held_out.type_counts()
    eligible = numpy.flatnonzero(counts >= min_count)
    room = max(0, max_size - len(SPECIALS))
    last = room + len(SPECIALS) - 1  # the place of the last count that may be kept
    if len(eligible) > last + 1:  # decode only those that may be kept
        threshold = -numpy.partition(-counts[eligible], last)[last]
        eligible = eligible[counts[eligible] >= threshold]
    words = zip(types.strings_of(eligible), counts[eligible].tolist())
    ranked = sorted(words, key=lambda word_count: (-word_count[1], word_count[0]))
    kept = [word for word, _ in ranked if word not in SPECIALS][:room]
    return WordVocab([*SPECIALS, *kept])


def word_ids_of_types(
    types: TypeTable, vocab: WordVocab, cut_at: int | None = None
) -> numpy.ndarray:
    """(n_types,) int64 vocabulary id of each type (UNK_ID where it has none);
    `cut_at` looks up each type's first `cut_at` characters (ELMoForManyLangs'
    character-vocabulary models)."""
    ids = numpy.empty(len(types), dtype="int64")
    block = 100_000
    for first in range(0, len(types), block):
        strings = types.strings_of(range(first, min(first + block, len(types))))
        if cut_at is not None:
            strings = [s[:cut_at] for s in strings]
        ids[first : first + len(strings)] = [vocab.index.get(s, UNK_ID) for s in strings]
    return ids


class BatchBuilder:
    """`TokenBatch`es of spans of a corpus for one biLM, with their LM targets:
    what `BiLM.batch` gives for their tokens (the types in another order)."""

    def __init__(self, corpus: Corpus, bilm: BiLM) -> None:
        self.corpus = corpus
        self.chars = bilm.chars
        cut_at = bilm.config.max_chars - 2 if bilm.config.char_ids == "char_vocab" else None
        self.word_ids = word_ids_of_types(corpus.types, bilm.vocab, cut_at)
        self.cluster_starts = bilm.softmax.cluster_starts if bilm.softmax is not None else None

    def __call__(self, spans: Spans) -> TokenBatch:
        width = int(spans.length.max())
        ids = numpy.full((len(spans), width), -1, dtype="int64")
        for row, (shard, start, length) in enumerate(
            zip(spans.shard.tolist(), spans.start.tolist(), spans.length.tolist())
        ):
            ids[row, :length] = self.corpus.tokens(shard, start, length)
        real = ids >= 0
        unique, inverse = numpy.unique(ids[real], return_inverse=True)
        index = numpy.full((len(spans), width + 2), EOS_TYPE, dtype="int64")
        index[:, 0] = BOS_TYPE
        index[:, 1 : width + 1][real] = inverse + 2
        type_word_ids = numpy.concatenate([[BOS_ID, EOS_ID], self.word_ids[unique]])
        types = self.corpus.types.strings_of(unique) if self.chars is not None else ()
        batch = types_batch(types, type_word_ids, index, spans.length.copy(), self.chars)
        if self.cluster_starts is None:
            return batch
        return batch.with_targets(self.cluster_starts)


class Prefetcher:
    """Builds this rank's share of each planned batch in a thread, `depth`
    ahead; yields (its batch, the whole batch's `Spans`, weight): weight 0
    where the rank has no piece (it runs the first, so as to take part)."""

    def __init__(
        self,
        planned: Iterator[Spans],
        build: Callable[[Spans], TokenBatch],
        group: ProcessGroup,
        depth: int = 4,
    ) -> None:
        self.planned, self.build, self.group = planned, build, group
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._fill, name="batch builder", daemon=True)

    def __enter__(self) -> "Prefetcher":
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stopping.set()  # the thread ends at its next put
        self.thread.join()

    def __iter__(self) -> Iterator[tuple[TokenBatch, Spans, float]]:
        while True:
            item = self.queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _fill(self) -> None:
        try:
            rank, world = self.group.rank, self.group.world_size
            for spans in self.planned:
                share = spans.take(slice(rank, None, world))
                weight = 1.0 if len(share) else 0.0
                batch = self.build(share if len(share) else spans.take(slice(0, 1)))
                if self.group.device.type == "cuda":
                    batch = batch.pin_memory()
                if not self._put((batch, spans, weight)):
                    return
            self._put(_DONE)
        except BaseException as err:  # raised again in the training thread
            self._put(err)

    def _put(self, item) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False


_DONE = object()
