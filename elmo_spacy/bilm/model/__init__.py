"""The biLM's network in plain torch: its sizes (`BiLMConfig`), modules
(token encoders, LSTM stacks, softmax), layers and language-model loss over a
`TokenBatch` (`BiLMNetwork`). No caches, no strings: the runtime
(`elmo_spacy.bilm.runtime`) runs it fast, the inputs
(`elmo_spacy.bilm.inputs`) make its batches."""

from .config import BiLMConfig
from .network import BiLMNetwork, LMLoss, States

__all__ = ["BiLMConfig", "BiLMNetwork", "LMLoss", "States"]
