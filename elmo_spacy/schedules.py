"""Registered schedules for fine-tuning a biLM (`elmo_spacy.FineTuning.v1`),
and the `[initialize] after_init` callback that works out the training run's
length for a schedule over the whole run (docs/pipes.md)."""

import itertools
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy
from spacy.util import logger, resolve_dot_names
from spacy.util import registry as spacy_registry
from thinc.api import Model, registry

from .layers.fine_tuning import (
    SET_STEPS,
    FineTuning,
    RunSchedule,
    bad_setting,
    number,
    whole_number,
)

if TYPE_CHECKING:
    from spacy.language import Language


@registry.schedules("elmo_spacy.slanted_triangular.v1")
def slanted_triangular(
    max_rate: float, num_steps: int = 0, cut_frac: float = 0.1, ratio: float = 32.0
) -> Iterator[float]:
    """ULMFiT's slanted triangular learning rate (Howard and Ruder 2018, eq.
    3), held at its lowest after `num_steps` (thinc's turns negative). Step t
    (from 1): rate = max_rate * (1 + p (ratio - 1)) / ratio, p = t / cut
    before the peak, 1 - (t - cut) / (num_steps - cut) after it, cut =
    cut_frac * num_steps. num_steps = 0: the training run's length, only for
    a fine_tuning block's learning rate (`elmo_spacy.fine_tuning_steps.v1`)."""
    where = "[...learn_rate]"
    if not number(max_rate) or not max_rate > 0:
        raise bad_setting(where, "max_rate", max_rate, "the peak rate: give a number above 0")
    if not whole_number(num_steps, 0):
        raise bad_setting(
            where,
            "num_steps",
            num_steps,
            "the schedule's length in steps: give a whole number from 1, or 0 for the "
            "training run's length (worked out when the pipeline is initialised)",
        )
    if not number(cut_frac) or not 0 < cut_frac < 1:
        raise bad_setting(
            where,
            "cut_frac",
            cut_frac,
            "the share of num_steps that the rate rises over: give a number between 0 and 1 "
            "(ULMFiT: 0.1)",
        )
    if not number(ratio) or not ratio >= 1:
        raise bad_setting(
            where,
            "ratio",
            ratio,
            "how many times the peak rate exceeds the lowest: give a number from 1 (1: a "
            "constant rate; ULMFiT: 32)",
        )

    def rates(steps: int) -> Iterator[float]:
        cut = max(1, int(steps * cut_frac))
        for t in itertools.count(1):
            p = t / cut if t < cut else max(0.0, 1 - (t - cut) / max(1, steps - cut))
            yield max_rate * (1 + p * (ratio - 1)) / ratio

    if num_steps == 0:
        return RunSchedule(rates, max_rate / ratio, where)
    return rates(int(num_steps))


@registry.schedules("elmo_spacy.gradual_unfreezing.v1")
def gradual_unfreezing(frozen_steps: int, steps_per_layer: int) -> Iterator[int]:
    """How many biLM layers train, from the top (`trainable_layers`): none for
    `frozen_steps` steps, then the top one, then one more every `steps_per_layer`."""
    where = "[...trainable_layers]"
    if not whole_number(frozen_steps, 0):
        raise bad_setting(
            where,
            "frozen_steps",
            frozen_steps,
            "the steps before the top layer trains: give a whole number from 0",
        )
    if not whole_number(steps_per_layer, 1):
        raise bad_setting(
            where,
            "steps_per_layer",
            steps_per_layer,
            "the steps between one layer's unfreezing and the next's: give a whole number from 1",
        )
    frozen, per_layer = int(frozen_steps), int(steps_per_layer)
    return (0 if step < frozen else 1 + (step - frozen) // per_layer for step in itertools.count())


@spacy_registry.callbacks(SET_STEPS)
def fine_tuning_steps() -> Callable[["Language"], "Language"]:
    """For `[initialize] after_init`: `set_fine_tuning_steps`."""

    def set_steps(nlp: "Language") -> "Language":
        set_fine_tuning_steps(nlp)
        return nlp

    return set_steps


def set_fine_tuning_steps(nlp: "Language", num_steps: int | None = None) -> int | None:
    """Give the schedules over the whole run (`RunSchedule`) of every
    fine_tuning block in `nlp` (disabled pipes too) `num_steps`, by default
    `training_steps(nlp)`. Returns it, or None where no schedule waits for one."""
    blocks = []
    for _, pipe in nlp.components:
        model = getattr(pipe, "model", None)
        if not isinstance(model, Model):
            continue
        for node in model.walk():
            for shim in node.shims:
                block = getattr(shim, "fine_tuning", None)
                if isinstance(block, FineTuning) and block.run_schedules and block not in blocks:
                    blocks.append(block)
    if not blocks:
        return None
    if num_steps is None:
        num_steps, how = training_steps(nlp)
        logger.info("Fine-tuning schedules over the training run: %d steps (%s)", num_steps, how)
    for block in blocks:
        block.set_run_steps(num_steps)
    return num_steps


def training_steps(nlp: "Language") -> tuple[int, str]:
    """The optimizer steps that `spacy train` runs with `nlp.config`
    (docs/pipes.md), and how they were found. The random states are left as they were."""
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
    """The batches [training.batcher] makes of the corpus in each epoch (a
    batch size on a schedule goes on across epochs, as in spaCy's loop)."""
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
