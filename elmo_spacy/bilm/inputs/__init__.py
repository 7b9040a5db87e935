"""A biLM's inputs: token strings to word ids (`WordVocab`) and character ids
(`CharIds`), tokenised docs to a `TokenBatch` with its language-model targets,
and length-bucketed batches (`length_runs`)."""

from .batch import LMTargets, TokenBatch, length_runs, token_batch
from .chars import CharIds, char_ids_for
from .tokenization import Tokenization
from .vocab import WordVocab

__all__ = [
    "CharIds",
    "LMTargets",
    "TokenBatch",
    "Tokenization",
    "WordVocab",
    "char_ids_for",
    "length_runs",
    "token_batch",
]
