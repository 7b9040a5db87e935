"""The thinc dim that counts the ELMo layers per doc, and the name it had.

`n_output_layers` is what the `elmo` pipe puts on `doc._.elmo` per doc: the
token encoding and the L biLSTM layers (L + 1; `BiLMConfig.n_output_layers`),
or the ones its `layers` setting keeps. `BiLMConfig.n_layers` is L. The dim
was called `n_layers` too until 0.1.0; thinc saves dims by name, so layers
that are saved with a pipeline (the listener, the scalar mix) still read it.
"""

from typing import Any

N_OUTPUT_LAYERS = "n_output_layers"
_OLD_NAMES = {"n_layers": N_OUTPUT_LAYERS}


class ReadsOldDimNames:
    """Mixed into a thinc Model: setting a dim by its old name (as loading a
    pipeline saved before the rename does) sets it under its new name."""

    def set_dim(self, name: str, value: Any, *, force: bool = False) -> None:
        super().set_dim(_OLD_NAMES.get(name, name), value, force=force)
