"""How a fine-tuned biLM's weights change (ULMFiT's discriminative rates and
gradual unfreezing, Howard and Ruder 2018), and the errors of its settings."""

import copy
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from confection import ConfigValidationError
from thinc.api import Optimizer, torch2xp, xp2torch

from ..bilm import BiLM
from ..errors import ElmoSpacyError

Schedule = int | float | list | Iterator  # a value, or a thinc schedule (values by step)
SET_STEPS = "elmo_spacy.fine_tuning_steps.v1"  # the callback that gives schedules the run's length


class ConfigSettingError(ElmoSpacyError, ConfigValidationError):
    """A config setting that cannot work, shown by spaCy's commands in one line."""

    def __str__(self) -> str:
        return self.title or super().__str__()


def block(*parts: str) -> str:
    """A section of the fine_tuning block as errors name it, "[...fine_tuning.optimizer]"."""
    return "[..." + ".".join(("fine_tuning", *parts)) + "]"


def bad_setting(section: str, setting: str, value: Any, fix: str) -> ConfigSettingError:
    """The error "[section] setting = value: fix", the value as a config writes it."""
    return ConfigSettingError(
        title=f"{section} {setting} = {config_value(value)}: {fix}", show_config=False
    )


def config_value(value: Any) -> str:
    """`value` as a config file writes it (true, null, "text", [1, 2])."""
    try:
        return json.dumps(value)
    except TypeError:
        return "a schedule" if isinstance(value, Iterator) else repr(value)


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(value: Any, least: int) -> bool:
    return number(value) and value >= least and value == int(value)


class RunSchedule:
    """A schedule over the whole training run, whose length is known only
    when the pipeline is initialised: `FineTuning.set_run_steps` reads
    `values(num_steps)`. As an iterator it gives only `first`, for thinc's
    optimizer; a second read (outside a fine_tuning block) is refused."""

    def __init__(self, values: Callable[[int], Iterator[float]], first: float, where: str) -> None:
        self.values = values
        self.first: float | None = first
        self.where = where

    def __iter__(self) -> "RunSchedule":
        return self

    def __next__(self) -> float:
        if self.first is not None:
            first, self.first = self.first, None
            return first
        raise bad_setting(
            self.where,
            "num_steps",
            0,
            "the training run's length is worked out only for the learning rate of a "
            "fine_tuning block (elmo_spacy.FineTuning.v1); elsewhere give the schedule's "
            "length in steps",
        )


class FineTuning:
    """The biLM's own optimisation, `elmo_spacy.FineTuning.v1`: with L LSTM
    layers, layer i trains at rate / layer_rate_divisor^(L - i). `step`
    counts the pipeline's updates; the schedules are read by it."""

    def __init__(
        self,
        optimizer: Optimizer,
        layer_rate_divisor: float = 2.6,
        trainable_layers: Schedule | None = None,
    ) -> None:
        if optimizer.averages is not None:
            raise bad_setting(
                block("optimizer"),
                "use_averages",
                True,
                "the biLM's optimizer would keep parameter averages that spaCy never applies "
                "(it evaluates with [training.optimizer]'s only): set use_averages = false",
            )
        if not (number(layer_rate_divisor) and layer_rate_divisor > 0):
            raise bad_setting(
                block(),
                "layer_rate_divisor",
                layer_rate_divisor,
                "give a positive number, what each layer's rate is divided by below the "
                "top one (1.0: one rate for every layer; ULMFiT: 2.6)",
            )
        self.optimizer = optimizer
        self.layer_rate_divisor = float(layer_rate_divisor)
        # The optimizer's schedules move here, read by step (shared by copies);
        # those over the whole run wait for its length (`set_run_steps`).
        self.schedules: dict[str, ValuesByStep] = {}
        self.run_schedules: dict[str, RunSchedule] = {}
        for name, schedule in optimizer.schedules.items():
            if isinstance(schedule, RunSchedule):
                self.run_schedules[name] = schedule
            else:
                self.schedules[name] = ValuesByStep(getattr(optimizer, name), schedule)
        optimizer.schedules = {}
        self.run_steps: int | None = None
        self.trainable_layers = (
            None
            if trainable_layers is None
            else ValuesByStep.of(trainable_layers, block(), "trainable_layers")
        )
        self.step = 0
        self.n_trainable(1)  # check the first value now (a constant: once for all)

    def set_run_steps(self, num_steps: int) -> None:
        """Give the schedules over the whole run (`RunSchedule`) its length in steps."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ElmoSpacyError(
                f"The training run's length for the fine-tuning schedules: {num_steps!r}: "
                "give a whole number of steps from 1"
            )
        self.run_steps = num_steps
        for name, schedule in self.run_schedules.items():
            self.schedules[name] = ValuesByStep.of(
                schedule.values(num_steps), block("optimizer"), name
            )

    @property
    def waiting(self) -> list[str]:
        """The optimizer's settings whose schedule waits for the run's length."""
        return sorted(self.run_schedules) if self.run_steps is None else []

    def n_trainable(self, n_layers: int) -> int:
        """How many of `n_layers` layers (L + 1) train at this step, from the top."""
        if self.trainable_layers is None:
            return n_layers
        value = self.trainable_layers[self.step]
        if not whole_number(value, 0):
            raise bad_setting(
                block(),
                "trainable_layers",
                value,
                f"(its value at step {self.step}) it counts the layers that train, from the "
                "top: give a whole number from 0, or a schedule of them (e.g. "
                "elmo_spacy.gradual_unfreezing.v1); null: every layer",
            )
        return min(int(value), n_layers)

    def trainable(self, bilm: BiLM) -> range:
        """The layers of `bilm` (indices 0..L) that train at this step."""
        n_layers = bilm.config.n_layers + 1
        return range(n_layers - self.n_trainable(n_layers), n_layers)

    def update(self, key: int, bilm: BiLM) -> None:
        """Step every parameter of `bilm` that has a gradient, at its layer's
        rate; `key` (the shim's id) and the parameter's name key its moments."""
        if self.waiting:
            raise bad_setting(
                block("optimizer", self.waiting[0]),
                "num_steps",
                0,
                "the training run's length, which is worked out when the pipeline is "
                f'initialised by [initialize.after_init] @callbacks = "{SET_STEPS}", and this '
                "config has no such callback: add it (or call "
                "elmo_spacy.schedules.set_fine_tuning_steps(nlp) from an after_init of your "
                "own), or give num_steps the schedule's length in steps",
            )
        for name, schedule in self.schedules.items():
            setattr(self.optimizer, name, schedule[self.step])
        groups = bilm.layer_parameters()
        for layer, group in enumerate(groups):
            lr_scale = self.layer_rate_divisor ** -(len(groups) - 1 - layer)
            for name, parameter in group:
                if parameter.grad is None:
                    continue
                weights, _ = self.optimizer(
                    (key, name),
                    torch2xp(parameter.data),
                    torch2xp(parameter.grad),
                    lr_scale=lr_scale,
                )
                parameter.data = xp2torch(weights, device=parameter.device)

    def copy(self) -> "FineTuning":
        """The same settings at the same step, with an optimizer of its own."""
        copied = copy.copy(self)
        copied.optimizer = _fresh_optimizer(self.optimizer)
        copied.schedules = dict(self.schedules)
        copied.run_schedules = dict(self.run_schedules)
        return copied


class ValuesByStep:
    """A thinc schedule read by step: each value is drawn once and kept, so
    that copies share it. Past its end, its last value."""

    def __init__(self, first: float, rest: Iterable) -> None:
        self._values = [first]
        self._rest = iter(rest)

    @classmethod
    def of(cls, schedule: Schedule, section: str, setting: str) -> "ValuesByStep":
        """A value (every step), a list (one per step) or a schedule, which
        errors name as `setting` of `section`."""
        if isinstance(schedule, (int, float)):
            return cls(schedule, ())
        fix = "give a number, a list of numbers (one a step) or a schedule"
        try:
            values = iter(schedule)
        except TypeError:
            raise bad_setting(section, setting, schedule, fix) from None
        try:
            return cls(next(values), values)
        except StopIteration:
            raise bad_setting(section, setting, [], f"an empty schedule: {fix}") from None

    def __getitem__(self, step: int) -> float:
        while len(self._values) <= step:
            self._values.append(next(self._rest, self._values[-1]))
        return self._values[step]


def _fresh_optimizer(optimizer: Optimizer) -> Optimizer:
    """An optimizer of `optimizer`'s settings, without its moments."""
    return Optimizer(
        optimizer.learn_rate,
        L2=optimizer.L2,
        beta1=optimizer.b1,
        beta2=optimizer.b2,
        eps=optimizer.eps,
        grad_clip=optimizer.grad_clip,
        use_averages=False,
        use_radam=optimizer.use_radam,
        L2_is_weight_decay=optimizer.L2_is_weight_decay,
    )
