"""Static word vectors trained on the biLM's pretraining text, and their hand-over to spaCy."""

import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy

from .ppmi import cooccurrence_counts, ppmi_matrix, svd_vectors

METHODS = ("svd", "skipgram", "cbow")


@dataclass
class WordVectors:
    """One (dim,) vector per word: `matrix[i]` belongs to `words[i]`."""

    words: list[str]
    matrix: numpy.ndarray  # (len(words), dim) float32

    def to_spacy(self, output_dir: Path, lang: str = "en") -> None:
        """Write a vectors-only spaCy pipeline, for `[initialize] vectors = output_dir`
        (what `spacy init vectors` writes)."""
        import spacy
        from spacy.vectors import Vectors

        nlp = spacy.blank(lang)
        keys = [nlp.vocab.strings.add(word) for word in self.words]
        nlp.vocab.vectors = Vectors(strings=nlp.vocab.strings, data=self.matrix, keys=keys)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        nlp.to_disk(output_dir)


def train_static_vectors(
    docs: Sequence[Sequence[str]],
    method: str,
    dim: int = 256,
    window: int = 5,
    min_count: int = 2,
    max_vocab_size: int = 40_000,
    epochs: int = 5,
    seed: int = 0,
    workers: int = 1,
) -> WordVectors:
    """Word vectors from tokenised docs.

    method: "svd" (truncated SVD of the PPMI matrix of `window`-word
        co-occurrences), or gensim's word2vec with negative sampling,
        "skipgram" or "cbow" (`epochs` passes, `workers` threads; one worker
        and the same seed give the same vectors).
    The vocabulary is the `max_vocab_size` most frequent words seen at least
    `min_count` times, as for the biLM.
    """
    if method not in METHODS:
        raise ValueError(f"Unknown static vectors method {method!r}; use one of {METHODS}")
    if method == "svd":
        counts = Counter(word for doc in docs for word in doc)
        words = [w for w, n in counts.most_common(max_vocab_size) if n >= min_count]
        if len(words) < 2:
            raise ValueError(
                f"{len(words)} words are seen at least min_count = {min_count} times: too few "
                "for vectors (a larger text, or a lower --min-count)"
            )
        vocab = {word: i for i, word in enumerate(words)}
        cooccurrences = cooccurrence_counts(docs, vocab, window)
        return WordVectors(words, svd_vectors(ppmi_matrix(cooccurrences), dim, seed=seed))

    from gensim.models import Word2Vec

    model = Word2Vec(
        sentences=[list(doc) for doc in docs],
        vector_size=dim,
        window=window,
        min_count=min_count,
        max_final_vocab=max_vocab_size,
        sg=1 if method == "skipgram" else 0,
        negative=5,
        epochs=epochs,
        seed=seed,
        workers=workers,
        hashfxn=_stable_hash,
    )
    return WordVectors(list(model.wv.index_to_key), model.wv.vectors.astype(numpy.float32))


def _stable_hash(text: str) -> int:
    """gensim seeds each word's initial vector from a hash of it; Python's own
    `hash` of a string changes from one process to the next."""
    return zlib.crc32(text.encode("utf-8"))
