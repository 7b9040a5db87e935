"""The biLM's network in plain torch (`BiLMNetwork`) and its sizes (`BiLMConfig`)."""

from .config import BiLMConfig
from .network import BiLMNetwork, LMLoss, States

__all__ = ["BiLMConfig", "BiLMNetwork", "LMLoss", "States"]
