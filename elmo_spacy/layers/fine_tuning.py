"""How a fine-tuned biLM's weights change: an optimizer of their own, each
layer at its own rate, the layers unfrozen from the top down (ULMFiT's
discriminative rates and gradual unfreezing, Howard and Ruder 2018)."""

from collections.abc import Iterable, Iterator

from thinc.api import Optimizer, torch2xp, xp2torch

from ..bilm import BiLM
from ..errors import ElmoSpacyError

Schedule = int | float | list | Iterator  # a value, or a thinc schedule (values by step)


class FineTuning:
    """The biLM's own optimisation, for a biLM that a listener (or the pipe
    that owns it) fine-tunes: what `elmo_spacy.ElmoBiLM.v1`'s `fine_tuning`
    gives. Without it the pipeline's optimizer ([training.optimizer]) steps
    the biLM at the head's rate.

    optimizer: the biLM's optimizer (thinc's `Adam.v1`, ...), apart from the
        pipeline's; its `learn_rate` (a value or a schedule, e.g.
        `elmo_spacy.slanted_triangular.v1`) is the top LSTM layer's rate.
        Its averages are not kept (spaCy evaluates with the pipeline
        optimizer's only): `use_averages` must be false.
    layer_rate_divisor: each layer's rate is the rate of the layer above it
        divided by this (ULMFiT's 2.6): with L LSTM layers, LSTM layer i
        trains at rate / divisor^(L - i) and the token encoder (layer 0) at
        rate / divisor^L. 1.0: one rate for every layer.
    trainable_layers: how many layers, counted from the top, train at each
        step: a number, or a schedule of numbers (e.g.
        `elmo_spacy.gradual_unfreezing.v1`: none, then the top one, then one
        more); None: every layer from the first step. The frozen layers get
        no gradient (backpropagation stops below the lowest trainable one)
        and their weights do not move; while no layer trains, the pipe runs
        the biLM as a frozen one.

    A step is one update of the pipeline (one `finish_update`), whether or
    not the biLM trained at it: the schedules count those. A copy (spaCy's
    `replace_listeners` copies the `elmo` pipe's model) goes on from the
    same step with an optimizer of its own, its moments fresh.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        layer_rate_divisor: float = 2.6,
        trainable_layers: Schedule | None = None,
    ) -> None:
        if optimizer.averages is not None:
            raise ElmoSpacyError(
                "elmo_spacy.FineTuning.v1: the biLM's optimizer keeps parameter averages that "
                "spaCy never applies (it evaluates with [training.optimizer]'s only): set "
                "use_averages = false in its block"
            )
        if not layer_rate_divisor > 0:
            raise ElmoSpacyError(
                f"elmo_spacy.FineTuning.v1: layer_rate_divisor = {layer_rate_divisor}: give a "
                "positive number (1.0: one rate for every layer; ULMFiT: 2.6)"
            )
        self.optimizer = optimizer
        self.layer_rate_divisor = float(layer_rate_divisor)
        # The optimizer's schedules move here, read by step (shared by copies).
        self.schedules = {
            name: ValuesByStep(getattr(optimizer, name), schedule)
            for name, schedule in optimizer.schedules.items()
        }
        optimizer.schedules = {}
        self.trainable_layers = (
            None if trainable_layers is None else ValuesByStep.of(trainable_layers)
        )
        self.step = 0

    def n_trainable(self, n_layers: int) -> int:
        """How many of `n_layers` layers (L + 1) train at this step, from the top."""
        if self.trainable_layers is None:
            return n_layers
        value = self.trainable_layers[self.step]
        if value < 0 or value != int(value):
            raise ElmoSpacyError(
                f"elmo_spacy.FineTuning.v1: trainable_layers is {value} at step {self.step}: "
                "it counts layers, a whole number from 0"
            )
        return min(int(value), n_layers)

    def trainable(self, bilm: BiLM) -> range:
        """The layers of `bilm` (indices 0..L) that train at this step."""
        n_layers = bilm.config.n_layers + 1
        return range(n_layers - self.n_trainable(n_layers), n_layers)

    def prepare(self, bilm: BiLM) -> None:
        """Before a training forward pass: gradients for the trainable layers only."""
        bilm.set_trainable(self.trainable(bilm))

    def rate_scale(self, layer: int, n_layers: int) -> float:
        """The factor on the optimizer's rate for layer `layer` of `n_layers` (L + 1)."""
        return self.layer_rate_divisor ** -(n_layers - 1 - layer)

    def update(self, key: int, bilm: BiLM) -> None:
        """Step every parameter of `bilm` that has a gradient, at its layer's
        rate; `key` (the shim's id) and each parameter's name key the
        optimizer's moments, as thinc's shims do."""
        for name, schedule in self.schedules.items():
            setattr(self.optimizer, name, schedule[self.step])
        groups = bilm.layer_parameters()
        for layer, group in enumerate(groups):
            lr_scale = self.rate_scale(layer, len(groups))
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

    def next_step(self) -> None:
        self.step += 1

    def copy(self) -> "FineTuning":
        """The same settings at the same step, with an optimizer of its own."""
        copied = FineTuning(_fresh_optimizer(self.optimizer), self.layer_rate_divisor)
        copied.schedules = dict(self.schedules)
        copied.trainable_layers = self.trainable_layers
        copied.step = self.step
        return copied


class ValuesByStep:
    """A thinc schedule (an iterator of values, one per step; thinc 8.3's
    schedules are generators) read by step: each value is drawn once and kept,
    so that copies share one schedule. Past its end, its last value."""

    def __init__(self, first: float, rest: Iterable) -> None:
        self._values = [first]
        self._rest = iter(rest)

    @classmethod
    def of(cls, schedule: Schedule) -> "ValuesByStep":
        """A value (every step), a list (one per step) or a schedule."""
        if isinstance(schedule, (int, float)):
            return cls(schedule, ())
        values = iter(schedule)
        try:
            return cls(next(values), values)
        except StopIteration:
            raise ElmoSpacyError("elmo_spacy.FineTuning.v1: an empty schedule") from None

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
