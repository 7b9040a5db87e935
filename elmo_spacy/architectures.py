"""Registered architectures (`elmo_spacy.<Name>.v1`) and the biLM's fine-tuning block."""

from typing import Any

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Linear, Model, Optimizer, chain, concatenate, with_array
from thinc.types import Floats2d, Floats3d

from .bilm.formats.locate import BiLMPath
from .bilm.runner import RunSettings
from .errors import ElmoSpacyError
from .layers import (
    ElmoListener,
    build_bilm_model,
    build_learned_mix,
    build_scalar_mix,
    inline_bilm,
)
from .layers.fine_tuning import FineTuning

RunSettings_v1 = registry.misc("elmo_spacy.RunSettings.v1")(RunSettings)


def mixed_tok2vec(
    layers: Model, mix: Model[list[Floats3d], list[Floats2d]], width: int | None
) -> Model:
    """`layers` (docs -> one (n_layers, n, d) array per doc), mixed by `mix`,
    then if `width` is set projected to it by a learned Linear (AllenNLP's
    `projection_dim`). Refs: "listener" (the layers' source), "mix", "projection".
    One structure for a listener and an owned biLM, so that a pipe whose
    listener was replaced loads as one built from its config."""
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


@registry.architectures("elmo_spacy.ElmoBiLM.v1")
def ElmoBiLM_v1(
    bilm: dict[str, Any] | None = None,
    run: RunSettings | dict[str, Any] | None = None,
    grad_scaler_config: dict[str, Any] | None = None,
    fine_tuning: FineTuning | None = None,
) -> Model[list[Doc], list[Floats3d]]:
    """The `elmo` pipe's model: a biLM and how it runs.

    bilm: `BiLMConfig` fields, used only for an untrained biLM.
    run: how the biLM runs, an `elmo_spacy.RunSettings.v1` block (or its values); null: defaults.
    grad_scaler_config: thinc's `PyTorchGradScaler` arguments for fine-tuning in float16.
    fine_tuning: an `elmo_spacy.FineTuning.v1` block; null: [training.optimizer] steps the biLM."""
    settings = run if isinstance(run, RunSettings) else RunSettings(**(run or {}))
    return build_bilm_model(bilm or {}, settings, grad_scaler_config, fine_tuning)


@registry.architectures("elmo_spacy.ElmoListener.v1")
def ElmoListener_v1(
    mix: Model[list[Floats3d], list[Floats2d]],
    upstream: str = "*",
    grad_factor: float = 1.0,
    width: int | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A tok2vec for any downstream pipe: the `elmo` pipe's layers, mixed by
    `mix` into one vector per token. grad_factor scales the gradient sent to
    the biLM (0: frozen). width: if set, a learned linear projection of the
    mix to that width. `nlp.replace_listeners` makes an `elmo_spacy.ElmoTok2Vec.v1` of it."""
    return mixed_tok2vec(ElmoListener(upstream, grad_factor), mix, width)


@registry.architectures("elmo_spacy.ElmoTok2Vec.v1")
def ElmoTok2Vec_v1(
    bilm: Model[list[Doc], list[Floats3d]],
    mix: Model[list[Floats3d], list[Floats2d]],
    grad_factor: float = 1.0,
    width: int | None = None,
    bilm_path: BiLMPath | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A tok2vec that owns its biLM (an `elmo_spacy.ElmoBiLM.v1` block),
    otherwise as `elmo_spacy.ElmoListener.v1`: what a replaced listener
    becomes. In a config of its own, `initialize` reads the pretrained biLM
    at `bilm_path` (a path, or a bilm-tf model's [options, weights])."""
    return mixed_tok2vec(inline_bilm(bilm, grad_factor, bilm_path), mix, width)


@registry.architectures("elmo_spacy.ConcatenateTok2Vec.v1")
def ConcatenateTok2Vec_v1(
    first: Model[list[Doc], list[Floats2d]], second: Model[list[Doc], list[Floats2d]]
) -> Model[list[Doc], list[Floats2d]]:
    """Two token representations side by side, (n, d1) and (n, d2) -> (n, d1 + d2):
    e.g. the elmo listener beside `spacy.MultiHashEmbed.v2`, as the ELMo paper
    adds ELMo to a task model's own token representation."""
    return concatenate(first, second)


@registry.misc("elmo_spacy.FineTuning.v1")
def FineTuning_v1(
    optimizer: Optimizer,
    layer_rate_divisor: float = 2.6,
    trainable_layers: Any = None,
) -> FineTuning:
    """How a fine-tuned biLM's weights change (`elmo_spacy.ElmoBiLM.v1`'s
    `fine_tuning`), as ULMFiT's discriminative rates and gradual unfreezing
    (docs/pipes.md). A step is one update of the pipeline.

    optimizer: the biLM's own (use_averages = false); its learn_rate is the top layer's.
    layer_rate_divisor: each layer's rate is the one above it's divided by this.
    trainable_layers: how many layers train, from the top: a number or a schedule; null: all."""
    return FineTuning(optimizer, layer_rate_divisor, trainable_layers)


ScalarMix_v1 = registry.architectures("elmo_spacy.ScalarMix.v1")(build_scalar_mix)
LearnedMix_v1 = registry.architectures("elmo_spacy.LearnedMix.v1")(build_learned_mix)
