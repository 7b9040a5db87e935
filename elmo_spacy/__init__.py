"""ELMo for spaCy: a from-scratch biLM, the `elmo` pipe, listeners and layer mixes."""

from . import architectures, loaders, loggers, schedules  # noqa: F401  (registers elmo_spacy.*.v1)
from .embedder import Embedder
from .extensions import StaleLayersError, install_extensions, restore_views
from .pipeline import Elmo, make_elmo
from .tokenizer import SurrogateSafeTokenizer

__version__ = "0.1.0"
__all__ = [
    "Elmo",
    "Embedder",
    "StaleLayersError",
    "SurrogateSafeTokenizer",
    "make_elmo",
    "restore_views",
    "__version__",
]

install_extensions()
