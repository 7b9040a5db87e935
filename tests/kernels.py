"""Forcing the LSTM kernel that biLMs run on, for tests that compare kernels.
The package only chooses (`elmo_spacy.bilm.runtime.kernels.choose_kernel`);
this replaces the choice for the length of a `with` block."""

from collections.abc import Iterator
from contextlib import contextmanager

import elmo_spacy.bilm.runtime.kernels as kernels


@contextmanager
def forced_kernel(kernel: str) -> Iterator[None]:
    """Every biLM's stacks run on `kernel` ("training", "fused" or "loop")
    inside the block. "fused" ignores the clips, and refuses states."""
    if kernel not in ("training", "fused", "loop"):
        raise ValueError(f"no LSTM kernel {kernel!r}: training, fused or loop")
    chosen = kernels.choose_kernel

    def force(device, *, clipped: bool, states: bool, packed: bool) -> str:
        if kernel == "fused" and states:
            raise ValueError("torch's fused LSTM cannot take or give states")
        return kernel

    kernels.choose_kernel = force
    try:
        yield
    finally:
        kernels.choose_kernel = chosen
