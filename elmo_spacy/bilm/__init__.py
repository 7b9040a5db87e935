"""The ELMo bidirectional language model, in plain PyTorch.

Nothing in this package imports spaCy or thinc: the biLM can be built,
trained, profiled and saved on its own.
"""

from .batch import TokenBatch
from .config import BiLMConfig
from .io import load_bilm, save_bilm
from .model import BiLM, LMLoss
from .vocab import WordVocab

__all__ = ["BiLM", "BiLMConfig", "LMLoss", "TokenBatch", "WordVocab", "load_bilm", "save_bilm"]
