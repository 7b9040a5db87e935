"""Every biLM's LSTM stacks on one kernel, for the benchmarks that compare
kernels: the package only chooses (`elmo_spacy.bilm.runtime.kernels.choose_kernel`);
tests force a kernel with tests/kernels.py's `forced_kernel`."""

import elmo_spacy.bilm.runtime.kernels as kernels

AUTOMATIC = kernels.choose_kernel


def force_kernel(kernel: str | None) -> None:
    """Every biLM's stacks on `kernel` from now on (None: the package's own choice)."""
    kernels.choose_kernel = AUTOMATIC if kernel is None else (lambda device, **run: kernel)
