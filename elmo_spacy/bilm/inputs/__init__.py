"""A biLM's inputs: word ids, character ids, and `TokenBatch`es of tokenised docs."""

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
