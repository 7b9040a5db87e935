"""Registered schedules for fine-tuning a biLM (`elmo_spacy.FineTuning.v1`):
thinc schedules, infinite series of values, one per training step."""

from collections.abc import Iterator

from thinc.api import registry

from .errors import ElmoSpacyError


@registry.schedules("elmo_spacy.slanted_triangular.v1")
def slanted_triangular(
    max_rate: float, num_steps: int, cut_frac: float = 0.1, ratio: float = 32.0
) -> Iterator[float]:
    """ULMFiT's slanted triangular learning rate (Howard and Ruder 2018, eq.
    3): from max_rate / ratio up to `max_rate` linearly over the first
    `cut_frac` of `num_steps`, then down to max_rate / ratio at step
    `num_steps`, and held there after it. (thinc's `slanted_triangular.v1`
    keeps falling past num_steps and turns negative.) Step t (from 1):
    rate = max_rate * (1 + p (ratio - 1)) / ratio, p = t / cut before the
    peak, p = 1 - (t - cut) / (num_steps - cut) after it, cut = cut_frac *
    num_steps."""
    where = "elmo_spacy.slanted_triangular.v1"
    if not max_rate > 0 or num_steps < 1 or not 0 < cut_frac < 1 or not ratio >= 1:
        raise ElmoSpacyError(
            f"{where}: max_rate = {max_rate}, num_steps = {num_steps}, cut_frac = {cut_frac}, "
            f"ratio = {ratio}: give max_rate > 0, num_steps >= 1, 0 < cut_frac < 1, ratio >= 1"
        )
    cut = max(1, int(num_steps * cut_frac))
    t = 0
    while True:
        t += 1
        if t < cut:
            p = t / cut
        else:
            p = max(0.0, 1 - (t - cut) / max(1, num_steps - cut))
        yield max_rate * (1 + p * (ratio - 1)) / ratio


@registry.schedules("elmo_spacy.gradual_unfreezing.v1")
def gradual_unfreezing(frozen_steps: int, steps_per_layer: int) -> Iterator[int]:
    """How many biLM layers train, from the top (`FineTuning`'s
    trainable_layers), as ULMFiT unfreezes them: none for the first
    `frozen_steps` steps (the task's head trains alone), then the top LSTM
    layer, then one more layer down every `steps_per_layer` steps."""
    if frozen_steps < 0 or steps_per_layer < 1:
        raise ElmoSpacyError(
            f"elmo_spacy.gradual_unfreezing.v1: frozen_steps = {frozen_steps}, "
            f"steps_per_layer = {steps_per_layer}: give frozen_steps >= 0, steps_per_layer >= 1"
        )
    step = 0
    while True:
        yield 0 if step < frozen_steps else 1 + (step - frozen_steps) // steps_per_layer
        step += 1
