"""Count-based word vectors: a window co-occurrence matrix, its positive PMI, and a truncated SVD."""

from collections.abc import Iterable, Mapping, Sequence

import numpy
import scipy.sparse
import scipy.sparse.linalg
from tqdm import tqdm


def cooccurrence_counts(
    docs: Iterable[Sequence[str]], vocab: Mapping[str, int], window: int
) -> scipy.sparse.csr_matrix:
    """(V, V) counts of word j within `window` tokens either side of word i, in the
    same doc. Symmetric; unweighted by distance. Words not in `vocab` are skipped
    but still take up their position."""
    rows: list[numpy.ndarray] = []
    cols: list[numpy.ndarray] = []
    for doc in tqdm(docs, desc="co-occurrences", unit="doc"):
        ids = numpy.array([vocab.get(word, -1) for word in doc], dtype=numpy.int64)
        for offset in range(1, window + 1):
            left, right = ids[:-offset], ids[offset:]
            keep = (left >= 0) & (right >= 0)
            rows += [left[keep], right[keep]]
            cols += [right[keep], left[keep]]
    row = numpy.concatenate(rows) if rows else numpy.zeros(0, dtype=numpy.int64)
    col = numpy.concatenate(cols) if cols else numpy.zeros(0, dtype=numpy.int64)
    data = numpy.ones(len(row), dtype=numpy.float64)
    n = len(vocab)
    return scipy.sparse.coo_matrix((data, (row, col)), shape=(n, n)).tocsr()  # sums duplicates


def ppmi_matrix(counts: scipy.sparse.spmatrix, smoothing: float = 0.75) -> scipy.sparse.csr_matrix:
    """Positive pointwise mutual information of a (V, V) co-occurrence matrix:
    max(0, log P(w, c) / (P(w) P_s(c))), where the context distribution is
    smoothed as P_s(c) ∝ count(c) ** `smoothing` (Levy et al. 2015; 1.0 is plain PPMI)."""
    counts = scipy.sparse.coo_matrix(counts)
    total = counts.sum()
    word_totals = numpy.asarray(counts.sum(axis=1)).ravel()
    context_totals = numpy.asarray(counts.sum(axis=0)).ravel() ** smoothing
    p_joint = counts.data / total
    p_word = word_totals[counts.row] / total
    p_context = context_totals[counts.col] / context_totals.sum()
    pmi = numpy.log(p_joint / (p_word * p_context))
    keep = pmi > 0
    return scipy.sparse.csr_matrix(
        (pmi[keep], (counts.row[keep], counts.col[keep])), shape=counts.shape
    )


def svd_vectors(matrix: scipy.sparse.spmatrix, dim: int, seed: int = 0) -> numpy.ndarray:
    """(V, dim) word vectors U_d * sqrt(S_d) from the top `dim` singular vectors
    (the symmetric weighting of Levy et al. 2015), largest first."""
    k = min(dim, min(matrix.shape) - 1)
    start = numpy.random.default_rng(seed).uniform(-1, 1, min(matrix.shape))
    u, s, _ = scipy.sparse.linalg.svds(matrix.astype(numpy.float64), k=k, v0=start)
    order = numpy.argsort(-s)
    vectors = u[:, order] * numpy.sqrt(s[order])
    if k < dim:
        vectors = numpy.hstack([vectors, numpy.zeros((vectors.shape[0], dim - k))])
    return vectors.astype(numpy.float32)
