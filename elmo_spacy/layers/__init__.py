"""thinc layers: the biLM as a thinc model, the listener, the mixes."""

from .bilm_model import build_bilm_model, get_bilm, get_runner, inline_bilm, set_bilm
from .learned_mix import build_learned_mix
from .listener import ElmoListener
from .scalar_mix import build_scalar_mix, layer_weights, scalar_mix_node

__all__ = [
    "ElmoListener",
    "build_bilm_model",
    "build_learned_mix",
    "build_scalar_mix",
    "get_bilm",
    "get_runner",
    "inline_bilm",
    "layer_weights",
    "scalar_mix_node",
    "set_bilm",
]
