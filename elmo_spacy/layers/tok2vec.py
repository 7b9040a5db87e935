"""Token vectors from ELMo layers, a listener's or an owned biLM's, in one
structure, so that a pipe whose listener was replaced loads as one built
from its config."""

from thinc.api import Linear, Model, chain, with_array
from thinc.types import Floats2d, Floats3d

from ..errors import ElmoSpacyError


def mixed_tok2vec(
    layers: Model, mix: Model[list[Floats3d], list[Floats2d]], width: int | None
) -> Model:
    """`layers` (docs -> one (n_layers, n, d) array per doc), mixed by `mix`,
    then if `width` is set projected to it by a learned Linear (AllenNLP's
    `projection_dim`). Refs: "listener" (the layers' source), "mix", "projection"."""
    if width is None:
        model = chain(layers, mix)
    else:
        if width < 1:
            raise ElmoSpacyError(f"elmo tok2vec: width = {width}, must be a positive number")
        projection = Linear(nO=width)
        model = chain(layers, mix, with_array(projection))
        model.set_ref("projection", projection)
    model.set_ref("listener", layers)
    model.set_ref("mix", mix)
    return model
