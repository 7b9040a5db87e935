"""Registered schedules for fine-tuning a biLM (`elmo_spacy.FineTuning.v1`):
thinc schedules, infinite series of values, one per training step; and the
callback that gives a schedule over the whole training run its length.

A schedule's length may be the training run's (`slanted_triangular`'s
num_steps = 0), which `spacy train` knows only when it runs: `[training]
max_steps`, or `max_epochs` passes of `[training.batcher]` over the training
corpus. The callback `elmo_spacy.fine_tuning_steps.v1`, as `[initialize]
after_init`, works it out when the pipeline is initialised, so that the same
schedule fits a run that ends by steps and one that ends by epochs.
"""

import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy
from spacy.util import registry as spacy_registry
from thinc.api import registry

from .layers.fine_tuning import SET_STEPS, FineTuning, RunSchedule, bad_setting

if TYPE_CHECKING:
    from spacy.language import Language


@registry.schedules("elmo_spacy.slanted_triangular.v1")
def slanted_triangular(
    max_rate: float, num_steps: int = 0, cut_frac: float = 0.1, ratio: float = 32.0
) -> Iterator[float]:
    """ULMFiT's slanted triangular learning rate (Howard and Ruder 2018, eq.
    3): from max_rate / ratio up to `max_rate` linearly over the first
    `cut_frac` of `num_steps`, then down to max_rate / ratio at step
    `num_steps`, and held there after it. (thinc's `slanted_triangular.v1`
    keeps falling past num_steps and turns negative.) Step t (from 1):
    rate = max_rate * (1 + p (ratio - 1)) / ratio, p = t / cut before the
    peak, p = 1 - (t - cut) / (num_steps - cut) after it, cut = cut_frac *
    num_steps.

    num_steps = 0 (the default): the training run's length (see the module
    docstring), only for a fine_tuning block's learning rate, which waits for it."""
    where = "[...learn_rate]"
    if not _number(max_rate) or not max_rate > 0:
        raise bad_setting(where, "max_rate", max_rate, "the peak rate: give a number above 0")
    if not _number(num_steps) or num_steps < 0 or num_steps != int(num_steps):
        raise bad_setting(
            where,
            "num_steps",
            num_steps,
            "the schedule's length in steps: give a whole number from 1, or 0 for the "
            "training run's length (worked out when the pipeline is initialised)",
        )
    if not _number(cut_frac) or not 0 < cut_frac < 1:
        raise bad_setting(
            where,
            "cut_frac",
            cut_frac,
            "the share of num_steps that the rate rises over: give a number between 0 and 1 "
            "(ULMFiT: 0.1)",
        )
    if not _number(ratio) or not ratio >= 1:
        raise bad_setting(
            where,
            "ratio",
            ratio,
            "how many times the peak rate exceeds the lowest: give a number from 1 (1: a "
            "constant rate; ULMFiT: 32)",
        )

    def rates(steps: int) -> Iterator[float]:
        cut = max(1, int(steps * cut_frac))
        t = 0
        while True:
            t += 1
            if t < cut:
                p = t / cut
            else:
                p = max(0.0, 1 - (t - cut) / max(1, steps - cut))
            yield max_rate * (1 + p * (ratio - 1)) / ratio

    if num_steps == 0:
        return RunSchedule(rates, max_rate / ratio, where)
    return rates(int(num_steps))


@registry.schedules("elmo_spacy.gradual_unfreezing.v1")
def gradual_unfreezing(frozen_steps: int, steps_per_layer: int) -> Iterator[int]:
    """How many biLM layers train, from the top (`FineTuning`'s
    trainable_layers), as ULMFiT unfreezes them: none for the first
    `frozen_steps` steps (the task's head trains alone), then the top LSTM
    layer, then one more layer down every `steps_per_layer` steps."""
    where = "[...trainable_layers]"
    if not _number(frozen_steps) or frozen_steps < 0 or frozen_steps != int(frozen_steps):
        raise bad_setting(
            where,
            "frozen_steps",
            frozen_steps,
            "the steps before the top layer trains: give a whole number from 0",
        )
    if (
        not _number(steps_per_layer)
        or steps_per_layer < 1
        or steps_per_layer != int(steps_per_layer)
    ):
        raise bad_setting(
            where,
            "steps_per_layer",
            steps_per_layer,
            "the steps between one layer's unfreezing and the next's: give a whole number from 1",
        )
    return _unfreezing(int(frozen_steps), int(steps_per_layer))


def _unfreezing(frozen_steps: int, steps_per_layer: int) -> Iterator[int]:
    step = 0
    while True:
        yield 0 if step < frozen_steps else 1 + (step - frozen_steps) // steps_per_layer
        step += 1


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@spacy_registry.callbacks(SET_STEPS)
def fine_tuning_steps() -> Callable[["Language"], "Language"]:
    """For `[initialize] after_init`: `set_fine_tuning_steps` when the
    pipeline is initialised."""

    def set_steps(nlp: "Language") -> "Language":
        set_fine_tuning_steps(nlp)
        return nlp

    return set_steps


def set_fine_tuning_steps(nlp: "Language", num_steps: int | None = None) -> int | None:
    """Give the schedules over the whole run (`RunSchedule`) of every
    fine_tuning block in `nlp`'s pipes (disabled ones too) the run's length:
    `num_steps`, or where None, the steps that `nlp.config` trains for
    (`training_steps`). Returns the length given, or None where no schedule
    waits for one (and nothing is worked out)."""
    blocks = [block for block in fine_tuning_blocks(nlp) if block.run_schedules]
    if not blocks:
        return None
    if num_steps is None:
        num_steps, how = training_steps(nlp)
        from spacy.util import logger

        logger.info("Fine-tuning schedules over the training run: %d steps (%s)", num_steps, how)
    for block in blocks:
        block.set_run_steps(num_steps)
    return num_steps


def fine_tuning_blocks(nlp: "Language") -> list[FineTuning]:
    """The fine_tuning blocks of `nlp`'s pipes (an `elmo` pipe's, a replaced
    listener's), disabled pipes included."""
    from thinc.api import Model

    found = []
    for _, pipe in nlp.components:
        model = getattr(pipe, "model", None)
        if not isinstance(model, Model):
            continue
        for node in model.walk():
            for shim in node.shims:
                block = getattr(shim, "fine_tuning", None)
                if isinstance(block, FineTuning) and block not in found:
                    found.append(block)
    return found


def training_steps(nlp: "Language") -> tuple[int, str]:
    """The optimizer steps that `spacy train` runs with `nlp.config`, and how
    they were found: [training] max_steps where max_epochs does not end the
    run first; otherwise max_epochs passes of [training.batcher] over the
    training corpus, counted as spaCy batches it (in corpus order: spaCy
    shuffles each epoch, which can move a count of batches by words a
    little). Python's and numpy's random state are left as they were, so
    that training draws what it would have drawn."""
    config = nlp.config.interpolate()
    training = config["training"]
    max_steps, max_epochs = training.get("max_steps", 0), training.get("max_epochs", 0)
    if max_epochs < 1:
        if max_steps > 0:
            return max_steps, "[training] max_steps"
        raise bad_setting(
            "[training]",
            "max_steps",
            max_steps,
            f"with max_epochs = {max_epochs} the run ends by patience alone, so a fine-tuning "
            "schedule's num_steps = 0 (the run's length) has no length to go by: give "
            "max_steps or max_epochs, or num_steps the schedule's length in steps",
        )
    states = random.getstate(), numpy.random.get_state()
    try:
        batches = _batches_per_epoch(nlp, config, max_epochs)
    finally:
        random.setstate(states[0])
        numpy.random.set_state(states[1])
    steps = sum(batches)
    if 0 < max_steps < steps:
        return max_steps, "[training] max_steps, reached before max_epochs"
    return steps, f"[training] max_epochs = {max_epochs} passes of the batcher over the corpus"


def _batches_per_epoch(nlp: "Language", config: dict, max_epochs: int) -> list[int]:
    """How many batches [training.batcher] makes of the training corpus in
    each of `max_epochs` epochs (a batch size on a schedule goes on across
    epochs, as in spaCy's loop)."""
    from spacy.util import resolve_dot_names

    name = config["training"].get("train_corpus", "corpora.train")
    try:
        (corpus,) = resolve_dot_names(config, [name])
        examples = list(corpus(nlp))
    except (ValueError, OSError, KeyError) as err:
        raise bad_setting(
            "[training]",
            "train_corpus",
            name,
            f"the training corpus could not be read ({' '.join(str(err).split())}); a "
            "fine-tuning schedule's num_steps = 0 with max_epochs counts its batches: give "
            "the corpus (e.g. --paths.train), or num_steps the schedule's length in steps",
        ) from err
    batcher = spacy_registry.resolve({"batcher": config["training"]["batcher"]})["batcher"]
    return [sum(1 for _ in batcher(examples)) for _ in range(max_epochs)]
