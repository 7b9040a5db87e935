"""Token vectors from ELMo layers: a mix of the layers, optionally projected
to a width of its own. The layers come from a listener (the `elmo` pipe's)
or from a biLM the pipe owns (`elmo_spacy.ElmoTok2Vec.v1`, what a replaced
listener becomes); both give the same structure, so that a pipe whose
listener was replaced saves and loads as one built from its config."""

from thinc.api import Linear, Model, chain, with_array
from thinc.types import Floats2d, Floats3d

from ..errors import ElmoSpacyError


def mixed_tok2vec(
    layers: Model, mix: Model[list[Floats3d], list[Floats2d]], width: int | None
) -> Model:
    """`layers` (docs -> one (n_layers, n, d) array per doc), mixed by `mix`
    into one vector per token, then, if `width` is set, a learned linear
    projection (with bias) to that width, as AllenNLP's
    `Elmo(projection_dim=...)`: the output is (n, width) whatever the biLM's
    width. Refs: "listener" (the source of the layers, spaCy's name for it),
    "mix", and "projection" where there is one."""
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
