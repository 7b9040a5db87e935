"""LSTM states a biLM starts from: given ones (`repeat_states`), or those
carried across batches (`CarriedStates`)."""

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
            return {
                direction: [tuple(_rows(part, n_rows) for part in state) for state in layers]
                for direction, layers in self.states.items()
            }
        return None if given is None else repeat_states(given, n_rows)

    def keep(self, finals: States) -> None:
        """When enabled, carry each row's final states (B rows) to the next
        batch; rows past B keep theirs."""
        if not self.enabled:
            return
        previous = self.states
        kept: States = {}
        for direction, layers in finals.items():
            kept[direction] = []
            for i, state in enumerate(layers):
                parts = []
                for j, part in enumerate(state):
                    part = part.detach()
                    if previous is not None:
                        old = previous[direction][i][j]
                        if len(old) > len(part):  # rows beyond this batch keep theirs
                            part = torch.cat([part, old[len(part) :]])
                    parts.append(part)
                kept[direction].append(tuple(parts))
        self.states = kept


def repeat_states(states: States, n_rows: int) -> States:
    """States of n_rows rows as they are; of one row, that row for each row."""
    repeated: States = {}
    for direction, layers in states.items():
        repeated[direction] = []
        for state in layers:
            rows = len(state[0])
            if rows != n_rows and rows != 1:
                raise ElmoSpacyError(
                    f"Initial states of {rows} rows for a batch of {n_rows}: give one row "
                    "per batch row, or one row for all"
                )
            repeated[direction].append(tuple(part.expand(n_rows, -1) for part in state))
    return repeated


def _rows(state: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The first n_rows rows of a (R, D) state, zero rows appended past R
    (copied out of inference mode where kept under it)."""
    if state.is_inference() and not torch.is_inference_mode_enabled():
        state = state.clone()
    if n_rows <= len(state):
        return state[:n_rows]
    return torch.cat([state, state.new_zeros(n_rows - len(state), state.shape[1])])
