"""thinc layers: the biLM as a thinc model, the listener, the mixes."""

from .bilm_model import build_bilm_model, get_bilm, get_runner, inline_bilm, set_bilm  # noqa: F401
from .learned_mix import build_learned_mix  # noqa: F401
from .listener import ElmoListener  # noqa: F401
from .scalar_mix import build_scalar_mix, layer_weights, scalar_mix_node  # noqa: F401
