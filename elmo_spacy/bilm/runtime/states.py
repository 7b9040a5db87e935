"""LSTM states a biLM starts from: given ones (`repeat_states`), or those
carried across batches (`CarriedStates`)."""

from collections.abc import Callable

import torch

from ...errors import ElmoSpacyError
from ..model.network import States


class CarriedStates:
    """bilm-tf's state carried across batches, when `enabled`: batch row b
    starts from the state the previous batch left in row b; new rows from
    zero. `states`: per direction and layer, (h (R, P), c (R, H)) of the R
    rows seen so far; None before the first batch and after `reset`.
    """

    def __init__(self) -> None:
        self.enabled = False
        self.states: States | None = None

    def reset(self) -> None:
        self.states = None

    def starting_states(self, n_rows: int, given: States | None) -> States | None:
        """What a batch of n_rows rows starts from: when enabled the carried
        states, else `given` (`repeat_states`); None for zeros."""
        if self.enabled:
            if given is not None:
                raise ElmoSpacyError(
                    "A stateful biLM starts from the states it carried: pass no initial_states, "
                    "or set bilm.stateful = False"
                )
            if self.states is None:
                return None
            return map_states(lambda part: _rows(part, n_rows), self.states)
        return None if given is None else repeat_states(given, n_rows)

    def keep(self, finals: States) -> None:
        """When enabled, carry each row's final states (B rows) to the next
        batch; rows past B keep theirs."""
        if not self.enabled:
            return
        kept = map_states(torch.Tensor.detach, finals)
        if self.states is not None:
            kept = map_states(_keep_later_rows, kept, self.states)
        self.states = kept


def map_states(function: Callable[..., torch.Tensor], *states: States) -> States:
    """`function` of each part (h or c) of `states`, taken alike from each."""
    return {
        direction: [
            tuple(function(*parts) for parts in zip(*layer))
            for layer in zip(*(each[direction] for each in states))
        ]
        for direction in states[0]
    }


def repeat_states(states: States, n_rows: int) -> States:
    """States of n_rows rows as they are; of one row, that row for each row."""
    for layers in states.values():
        for hidden, _ in layers:
            if len(hidden) not in (1, n_rows):
                raise ElmoSpacyError(
                    f"Initial states of {len(hidden)} rows for a batch of {n_rows}: give one row "
                    "per batch row, or one row for all"
                )
    return map_states(lambda part: part.expand(n_rows, -1), states)


def _keep_later_rows(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.cat([new, old[len(new) :]]) if len(old) > len(new) else new


def _rows(state: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The first n_rows rows of a (R, D) state, zero rows appended past R
    (copied out of inference mode where kept under it)."""
    if state.is_inference() and not torch.is_inference_mode_enabled():
        state = state.clone()
    if n_rows <= len(state):
        return state[:n_rows]
    return torch.cat([state, state.new_zeros(n_rows - len(state), state.shape[1])])
