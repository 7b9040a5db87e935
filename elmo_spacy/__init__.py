"""ELMo for spaCy: a from-scratch biLM, the `elmo` pipe, listeners and layer mixes."""

from . import architectures, loggers  # noqa: F401  (registers elmo_spacy.*.v1)
from .embedder import Embedder
from .extensions import StaleLayersError, install_extensions, restore_views
from .pipeline import Elmo, make_elmo
from .textcat import (
    ElmoTextCategorizer,
    EveryDocTextCategorizer,
    make_elmo_textcat,
    make_textcat_every_doc,
)
from .tokenizer import SurrogateSafeTokenizer

__version__ = "0.1.0"
__all__ = [
    "Elmo",
    "ElmoTextCategorizer",
    "Embedder",
    "EveryDocTextCategorizer",
    "StaleLayersError",
    "SurrogateSafeTokenizer",
    "make_elmo",
    "make_elmo_textcat",
    "make_textcat_every_doc",
    "restore_views",
    "__version__",
]

install_extensions()
