"""When pretraining stops: one table of the run's limits and one function
that says which are reached. The loop (`loop.Pretraining.run`) asks it at
each point where a limit can change; a resumed run asks it before training
again.

A new limit is one row of LIMITS (and its [training] setting, 0 for none).
"""

from collections.abc import Callable
from dataclasses import dataclass

from .checkpoint import RunState
from .config import PretrainConfig


@dataclass(frozen=True)
class Limit:
    """A [training] setting that ends the run once the run's progress reaches it.

    setting: the PretrainConfig field (0: no limit).
    progress: how far the run is, in the setting's unit.
    unit: what `progress` counts, for messages ("3 epochs done").
    checked: where the loop checks it: "step" (after every step: every rank
        moves it alike), "log" (every `log_every` steps, where the ranks add
        up their figures, so that all agree to stop at the same step),
        "evaluation" (after each dev evaluation) or "epoch" (at each epoch's
        end).
    """

    setting: str
    progress: Callable[[RunState], float]
    unit: str
    checked: str


LIMITS = (
    # an epoch that a budget cut short counts as done: the next starts afresh
    Limit("max_epochs", lambda state: state.epoch - 1, "epochs done", "epoch"),
    Limit("max_steps", lambda state: state.step, "steps done", "step"),
    Limit("max_tokens", lambda state: state.tokens, "tokens done", "step"),
    Limit("max_hours", lambda state: state.train_seconds / 3600, "hours done", "log"),
    Limit(
        "patience",
        lambda state: state.bad_evaluations,
        "evaluations without a better dev perplexity",
        "evaluation",
    ),
)
CHECK_POINTS = ("step", "log", "evaluation", "epoch")


def limits_reached(state: RunState, config: PretrainConfig, at: str | None = None) -> list[str]:
    """The limits of `config` that a run at `state` has reached, each as
    "setting = limit, where the run is"; only those checked `at` one of
    CHECK_POINTS, or all where `at` is None. An empty list: train on."""
    if at is not None and at not in CHECK_POINTS:
        raise ValueError(f"at = {at!r}: one of {CHECK_POINTS}")
    reached = []
    for limit in LIMITS:
        bound = getattr(config, limit.setting)
        if at not in (None, limit.checked) or not bound:
            continue
        progress = limit.progress(state)
        if progress >= bound:
            shown = f"{progress:.2f}" if isinstance(progress, float) else str(progress)
            reached.append(f"{limit.setting} = {bound}, {shown} {limit.unit}")
    return reached
