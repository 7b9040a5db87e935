"""thinc layers: the biLM as a thinc model, the listener, the mixes, classifier heads."""

from .bilm_model import build_bilm_model, get_bilm, set_bilm
from .learned_mix import build_learned_mix
from .listener import ElmoListener
from .scalar_mix import build_scalar_mix, layer_weights, read_scalar_mix
from .textcat_bilstm import build_textcat_bilstm

__all__ = [
    "ElmoListener",
    "build_bilm_model",
    "build_learned_mix",
    "build_scalar_mix",
    "build_textcat_bilstm",
    "get_bilm",
    "layer_weights",
    "read_scalar_mix",
    "set_bilm",
]
