"""ELMo for spaCy: a from-scratch biLM, the `elmo` pipe, listeners and layer mixes."""

from . import architectures  # noqa: F401  (registers elmo_spacy.*.v1)
from .pipeline import Elmo, make_elmo

__version__ = "0.1.0"
__all__ = ["Elmo", "make_elmo", "__version__"]
