"""The ELMo bidirectional language model, in plain PyTorch: `model/` (the
network and its loss), `inputs/` (tokens to batches), `runtime/` (running it
fast, with state) and `formats/` (biLMs on disk), put together by `BiLM`.
Runtime and formats use model and inputs, never back; nothing imports spaCy.
"""

from .bilm import BiLM
from .formats.directory import save_bilm
from .formats.locate import load_bilm
from .inputs.batch import TokenBatch
from .inputs.vocab import WordVocab
from .model.config import BiLMConfig
from .model.network import LMLoss

__all__ = ["BiLM", "BiLMConfig", "LMLoss", "TokenBatch", "WordVocab", "load_bilm", "save_bilm"]
