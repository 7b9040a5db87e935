"""Registered architectures: `elmo_spacy.<Name>.v1`. Registry functions only."""

from typing import Any

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Linear, Model, chain, concatenate, with_array
from thinc.types import Floats2d, Floats3d

from .errors import ElmoSpacyError
from .layers import (
    ElmoListener,
    build_bilm_model,
    build_learned_mix,
    build_scalar_mix,
    build_textcat_bilstm,
)


@registry.architectures("elmo_spacy.ElmoBiLM.v1")
def ElmoBiLM_v1(
    bilm: dict[str, Any] | None = None,
    max_batch_tokens: int = 4096,
    window: int = 1024,
    window_overlap: int = 64,
) -> Model[list[Doc], list[Floats3d]]:
    """The `elmo` pipe's model. `bilm` holds `BiLMConfig` fields, used only when
    the pipe is initialised without a pretrained biLM directory. Docs longer
    than `window` tokens run in overlapping windows (see build_bilm_model)."""
    return build_bilm_model(bilm or {}, max_batch_tokens, window, window_overlap)


@registry.architectures("elmo_spacy.ElmoListener.v1")
def ElmoListener_v1(
    mix: Model[list[Floats3d], list[Floats2d]],
    upstream: str = "*",
    grad_factor: float = 1.0,
    width: int | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A tok2vec for any downstream pipe: the `elmo` pipe's layers, mixed by `mix`
    into one vector per token. grad_factor scales the gradient sent to the biLM
    (0 keeps the biLM frozen).

    width: if set, a learned linear projection (with bias) of the mix to this
    many dimensions, as AllenNLP's `Elmo(projection_dim=...)`: the output is
    then (n, width) whatever the biLM's width, so a config that sets it works
    unchanged with any biLM. If None, the output is the mix's own width."""
    listener = ElmoListener(upstream, grad_factor)
    if width is None:
        model = chain(listener, mix)
    else:
        if width < 1:
            raise ElmoSpacyError(f"elmo listener: width = {width}, must be a positive number")
        projection = Linear(nO=width)
        model = chain(listener, mix, with_array(projection))
        model.set_ref("projection", projection)
    model.set_ref("listener", listener)
    model.set_ref("mix", mix)
    return model


@registry.architectures("elmo_spacy.ConcatenateTok2Vec.v1")
def ConcatenateTok2Vec_v1(
    first: Model[list[Doc], list[Floats2d]], second: Model[list[Doc], list[Floats2d]]
) -> Model[list[Doc], list[Floats2d]]:
    """Two token representations side by side, (n, d1) and (n, d2) -> (n, d1 + d2):
    e.g. the elmo listener beside spaCy's own hashed features
    (`spacy.MultiHashEmbed.v2`), as the ELMo paper adds ELMo to a task model's
    own token representation."""
    return concatenate(first, second)


ScalarMix_v1 = registry.architectures("elmo_spacy.ScalarMix.v1")(build_scalar_mix)
LearnedMix_v1 = registry.architectures("elmo_spacy.LearnedMix.v1")(build_learned_mix)
TextCatBiLSTM_v1 = registry.architectures("elmo_spacy.TextCatBiLSTM.v1")(build_textcat_bilstm)
