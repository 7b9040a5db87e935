"""When pretraining stops: one table of the run's limits (a new limit is a row
of LIMITS and its [training] setting, 0 for none) and the function that says
which are reached."""

from collections.abc import Callable
from typing import NamedTuple

from .checkpoint import RunState
from .config import PretrainConfig

# Where the loop checks a limit: after every step (what every rank moves alike),
# every `log_every` steps (where the ranks add up their figures, so that all
# agree to stop at the same step), after each dev evaluation, at each epoch's end.
CHECK_POINTS = ("step", "log", "evaluation", "epoch")


class Limit(NamedTuple):
    setting: str  # the PretrainConfig field
    progress: Callable[[RunState], float]  # how far the run is, in the setting's unit
    unit: str  # what `progress` counts, for messages ("3 epochs done")
    checked: str  # one of CHECK_POINTS


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


def limits_reached(state: RunState, config: PretrainConfig, at: str | None = None) -> list[str]:
    """The limits of `config` that a run at `state` has reached, as "setting =
    limit, where the run is"; only those checked `at` (None: all)."""
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
