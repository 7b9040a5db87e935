"""Registered architectures (`elmo_spacy.<Name>.v1`) and the biLM's fine-tuning block. Registry functions only."""

from typing import Any

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Model, Optimizer, concatenate
from thinc.types import Floats2d, Floats3d

from .bilm.formats.locate import BiLMPath
from .bilm.runner import RunSettings
from .layers import (
    ElmoListener,
    build_bilm_model,
    build_learned_mix,
    build_scalar_mix,
    inline_bilm,
    mixed_tok2vec,
)
from .layers.fine_tuning import FineTuning

RunSettings_v1 = registry.misc("elmo_spacy.RunSettings.v1")(RunSettings)


@registry.architectures("elmo_spacy.ElmoBiLM.v1")
def ElmoBiLM_v1(
    bilm: dict[str, Any] | None = None,
    run: RunSettings | dict[str, Any] | None = None,
    grad_scaler_config: dict[str, Any] | None = None,
    fine_tuning: FineTuning | None = None,
) -> Model[list[Doc], list[Floats3d]]:
    """The `elmo` pipe's model: a biLM and how it runs.

    bilm: `BiLMConfig` fields, used only when the pipe is initialised without
        a pretrained biLM directory.
    run: how the biLM runs (layers, state, precision, batching, windows): an
        `elmo_spacy.RunSettings.v1` block, or its values as a plain block;
        null: every default. See `elmo_spacy.bilm.runner.RunSettings`.
    grad_scaler_config: thinc's `PyTorchGradScaler` arguments for fine-tuning
        in float16.
    fine_tuning: where a listener fine-tunes the biLM (grad_factor != 0),
        how its weights change: an `elmo_spacy.FineTuning.v1` block (its own
        optimizer and rate schedule, rates by layer, layers unfrozen by step).
        None: the pipeline's [training.optimizer] steps them at the head's rate.

    A pipe that a replaced listener becomes (`elmo_spacy.ElmoTok2Vec.v1`)
    takes this whole block, run settings and fine-tuning included."""
    settings = run if isinstance(run, RunSettings) else RunSettings(**(run or {}))
    return build_bilm_model(bilm or {}, settings, grad_scaler_config, fine_tuning)


@registry.architectures("elmo_spacy.ElmoListener.v1")
def ElmoListener_v1(
    mix: Model[list[Floats3d], list[Floats2d]],
    upstream: str = "*",
    grad_factor: float = 1.0,
    width: int | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A tok2vec for any downstream pipe: the `elmo` pipe's layers, mixed by `mix`
    into one vector per token. grad_factor scales the gradient sent to the biLM:
    0 keeps the biLM frozen; otherwise it weighs this listener's gradient
    against other listeners' of the same biLM. It does not slow the biLM
    down: Adam divides each step by the gradient's running scale, so a
    constant factor mostly cancels. The biLM's own learning rates, by layer,
    and which layers train when, are the `elmo` model's `fine_tuning`
    (`elmo_spacy.FineTuning.v1`).

    width: if set, a learned linear projection (with bias) of the mix to this
    many dimensions: the output is then (n, width) whatever the biLM's width,
    so a config that sets it works unchanged with any biLM. If None, the
    output is the mix's own width.

    `nlp.replace_listeners("elmo", pipe, ["model.tok2vec"])` turns it into an
    `elmo_spacy.ElmoTok2Vec.v1` with the same mix and projection."""
    return mixed_tok2vec(ElmoListener(upstream, grad_factor), mix, width)


@registry.architectures("elmo_spacy.ElmoTok2Vec.v1")
def ElmoTok2Vec_v1(
    bilm: Model[list[Doc], list[Floats3d]],
    mix: Model[list[Floats3d], list[Floats2d]],
    grad_factor: float = 1.0,
    width: int | None = None,
    bilm_path: BiLMPath | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A tok2vec that owns its biLM: `bilm` (an `elmo_spacy.ElmoBiLM.v1`
    block, with its run settings), mixed by `mix` and projected to `width`
    as `elmo_spacy.ElmoListener.v1` does. What a listener becomes when
    spaCy's `replace_listeners` replaces it (its biLM then travels with the
    pipe's model); in a config of its own, for one pipe that needs no shared
    `elmo` pipe, `bilm_path` is the pretrained biLM that `initialize` reads
    (a path, or a bilm-tf model's two files as a list, [options, weights]).
    grad_factor scales the gradient sent to the biLM (0 keeps it frozen; see
    `elmo_spacy.ElmoListener.v1`); the biLM's rates are its `fine_tuning`."""
    return mixed_tok2vec(inline_bilm(bilm, grad_factor, bilm_path), mix, width)


@registry.architectures("elmo_spacy.ConcatenateTok2Vec.v1")
def ConcatenateTok2Vec_v1(
    first: Model[list[Doc], list[Floats2d]], second: Model[list[Doc], list[Floats2d]]
) -> Model[list[Doc], list[Floats2d]]:
    """Two token representations side by side, (n, d1) and (n, d2) -> (n, d1 + d2):
    e.g. the elmo listener beside spaCy's own hashed features
    (`spacy.MultiHashEmbed.v2`), as the ELMo paper adds ELMo to a task model's
    own token representation."""
    return concatenate(first, second)


@registry.misc("elmo_spacy.FineTuning.v1")
def FineTuning_v1(
    optimizer: Optimizer,
    layer_rate_divisor: float = 2.6,
    trainable_layers: Any = None,
) -> FineTuning:
    """How a fine-tuned biLM's weights change (`elmo_spacy.ElmoBiLM.v1`'s
    `fine_tuning`): `optimizer`, the biLM's own (its learn_rate, e.g. an
    `elmo_spacy.slanted_triangular.v1` schedule, is the top layer's rate);
    each layer's rate the one above it / `layer_rate_divisor`; and
    `trainable_layers`, how many layers from the top train at each step (a
    number or a schedule, e.g. `elmo_spacy.gradual_unfreezing.v1`; null:
    all). See `elmo_spacy.layers.fine_tuning.FineTuning`."""
    return FineTuning(optimizer, layer_rate_divisor, trainable_layers)


ScalarMix_v1 = registry.architectures("elmo_spacy.ScalarMix.v1")(build_scalar_mix)
LearnedMix_v1 = registry.architectures("elmo_spacy.LearnedMix.v1")(build_learned_mix)
