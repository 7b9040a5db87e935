"""The listener: hands the `elmo` pipe's per-layer outputs to a downstream pipe."""

from collections.abc import Callable
from typing import Any

from spacy.pipeline.tok2vec import Tok2VecListener
from spacy.tokens import Doc
from thinc.api import Model

from ..errors import ElmoSpacyError
from ..extensions import listened_layers, mark_read
from .bilm_model import N_OUTPUT_LAYERS, ElmoOutput, no_backprop


class ElmoListener(Model):
    """A layer that receives the `elmo` pipe's outputs instead of computing
    them: one (n_layers, len(doc), width) float32 array per doc. In training
    the upstream pipe broadcasts each batch's outputs and a backprop callback
    (`receive`); otherwise the layers are read from `doc._.elmo`, and docs
    without them (or with rows cut by `store`) are run through the upstream pipe."""

    name = "elmo-listener"

    def __init__(self, upstream_name: str, grad_factor: float) -> None:
        Model.__init__(
            self,
            name=self.name,
            forward=forward,
            dims={"nO": None, N_OUTPUT_LAYERS: None},
            attrs={"grad_factor": grad_factor},
        )
        self.upstream_name = upstream_name
        self.upstream_pipe: Any = None  # the `elmo` pipe, set when it finds this listener
        self._batch_id: int | None = None
        self._outputs: ElmoOutput | None = None
        self._backprop: Callable | None = None

    @classmethod
    def get_batch_id(cls, docs: list[Doc]) -> int:
        """A content-sensitive hash of a batch, to catch an unexpected batch."""
        return sum(sum(token.orth for token in doc) for doc in docs)

    # Keep the upstream pipe's outputs for a training batch, and their backprop callback.
    receive = Tok2VecListener.receive


def forward(model: ElmoListener, docs: list[Doc], is_train: bool) -> tuple[ElmoOutput, Callable]:
    if is_train and model._batch_id is not None:
        batch_id = model.get_batch_id(docs)
        if batch_id != model._batch_id:
            raise ElmoSpacyError(
                f"The elmo listener got a batch (id {batch_id}) other than the one the "
                f"elmo pipe broadcast (id {model._batch_id}). Are the elmo pipe and "
                "this pipe updated on the same batches?"
            )
        grad_factor = model.attrs["grad_factor"]
        upstream_backprop = model._backprop

        def backprop(d_outputs: ElmoOutput) -> list[Doc]:
            model._batch_id = model._outputs = model._backprop = None
            if grad_factor != 0:
                upstream_backprop([d * grad_factor for d in d_outputs])
            return []

        return model._outputs, backprop
    return _read_annotations(model, docs), no_backprop


def _read_annotations(model: ElmoListener, docs: list[Doc]) -> ElmoOutput:
    outputs = [listened_layers(doc) for doc in docs]
    for doc in docs:
        mark_read(doc, model.id)
    # doc._.elmo is on the host: the model's ops put it where the model runs.
    outputs = [None if o is None else model.ops.asarray3f(o) for o in outputs]
    missing = [i for i, output in enumerate(outputs) if output is None]
    if missing:
        if model.upstream_pipe is None:
            raise ElmoSpacyError(
                "Docs reached an elmo listener without doc._.elmo and no elmo pipe is "
                "linked to it. Add an `elmo` pipe before this pipe (or enable it)."
            )
        computed = model.upstream_pipe.predict([docs[i] for i in missing])
        for i, output in zip(missing, computed):
            outputs[i] = output
    return outputs
