"""Baselines for the comparison: static word vectors (SVD of PPMI, skip-gram, CBOW)
and a TF-IDF linear classifier. Plain numpy/scipy/gensim/scikit-learn; no spaCy
pipeline objects except where vectors are written for spaCy to load."""

from .ppmi import cooccurrence_counts, ppmi_matrix, svd_vectors
from .vectors import WordVectors, train_static_vectors

__all__ = [
    "WordVectors",
    "cooccurrence_counts",
    "ppmi_matrix",
    "svd_vectors",
    "train_static_vectors",
]
