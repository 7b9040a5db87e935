"""The biLM as a thinc model: List[Doc] -> List[Floats3d] of shape (L + 1, len(doc), width)."""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from spacy.tokens import Doc
from thinc.api import ArgsKwargs, Model, Optimizer, PyTorchShim, torch2xp, xp2torch
from thinc.types import Floats3d

from ..bilm import BiLM, BiLMConfig, WordVocab
from ..bilm.inference import (
    check_state,
    check_window,
    embed_tokens,
    initial_states_for,
    windows,
)
from ..bilm.model import States
from ..errors import ElmoSpacyError
from .dims import N_OUTPUT_LAYERS

ElmoOutput = list[Floats3d]


def build_bilm_model(
    bilm_config: dict[str, Any], max_batch_tokens: int, window: int = 1024, window_overlap: int = 64
) -> Model[list[Doc], ElmoOutput]:
    """A thinc model that runs a biLM over docs.

    The torch module is attached later, by `set_bilm`: from a pretrained biLM
    directory when the `elmo` pipe is initialised or loaded, or freshly built
    from `bilm_config` (a dict of `BiLMConfig` fields) with a vocabulary
    counted on the initialisation docs.

    max_batch_tokens: at prediction, docs are sorted by length and run in
        chunks of at most this many (padded) tokens.
    window, window_overlap: at prediction, a doc longer than `window` tokens
        is run in pieces of at most `window` tokens that overlap by
        2 * `window_overlap`; each token's vectors come from the piece where it
        has at least `window_overlap` tokens of context on both sides (or the
        doc's edge). Memory then stays bounded, whatever the doc's length.

    Every doc starts from zero LSTM states, or from a primed state once the
    pipe has called `set_initial_state` (its `state` setting).
    """
    BiLMConfig.from_dict(bilm_config)  # fail at config time, not at init
    check_window(window, window_overlap)
    return Model(
        "elmo_bilm",
        forward,
        init=init,
        dims={"nO": None, N_OUTPUT_LAYERS: None},
        attrs={
            "bilm_config": dict(bilm_config),
            "max_batch_tokens": max_batch_tokens,
            "window": window,
            "window_overlap": window_overlap,
            "state": "zero",
            "warmup": None,
        },
    )


class BiLMShim(PyTorchShim):
    """thinc's PyTorchShim for the biLM, with two changes to its optimiser step:
    the biLM hears that its weights changed (thinc writes them through numpy,
    which torch cannot see), and gradients are dropped (None), not zeroed, so
    that a parameter that gets no gradient next time (a listener switched to
    grad_factor = 0) is not moved by the optimiser's momentum."""

    def finish_update(self, optimizer: Optimizer) -> None:
        super().finish_update(optimizer)
        for parameter in self._model.parameters():
            parameter.grad = None
        self._model.weights_changed()


def set_bilm(model: Model, bilm: BiLM) -> None:
    """Attach (or replace) the torch biLM that `model` runs."""
    bilm.softmax = None  # only the pretraining loss needs it
    bilm.eval()
    shim = BiLMShim(bilm)
    if model.shims:
        model.shims[0] = shim
    else:
        model.shims.append(shim)
    model.set_dim("nO", bilm.config.width, force=True)
    model.set_dim(N_OUTPUT_LAYERS, bilm.config.n_output_layers, force=True)


def get_bilm(model: Model) -> BiLM | None:
    """The torch biLM attached to `model`, or None before initialisation."""
    return model.shims[0]._model if model.shims else None


def init(model: Model, X: list[Doc] | None = None, Y=None) -> None:
    if get_bilm(model) is not None:
        return
    config = BiLMConfig.from_dict(model.attrs["bilm_config"])
    words = [[t.text for t in doc] for doc in X or []]
    vocab = WordVocab.build(words, max_size=config.max_vocab_size, min_count=1)
    set_bilm(model, BiLM(config, vocab, with_softmax=False))


def forward(model: Model, docs: list[Doc], is_train: bool) -> tuple[ElmoOutput, Callable]:
    bilm = get_bilm(model)
    if bilm is None:
        raise ElmoSpacyError(
            "The elmo pipe has no biLM yet: call nlp.initialize() (with "
            "[initialize.components.elmo] bilm_path set) or load a trained pipeline."
        )
    width, n_layers = model.get_dim("nO"), model.get_dim(N_OUTPUT_LAYERS)
    if not is_train:
        return _predict(model, bilm, docs, n_layers, width), no_backprop
    tokens = [[t.text for t in doc] for doc in docs]
    if not any(tokens):
        return _empty_outputs(model, docs, n_layers, width), no_backprop
    # The windows of prediction, so that a token sees the same context in
    # training and prediction, and a long doc's memory stays bounded.
    pieces = [
        (i, first, last, keep_first, keep_last)
        for i, doc_tokens in enumerate(tokens)
        for first, last, keep_first, keep_last in windows(
            len(doc_tokens), model.attrs["window"], model.attrs["window_overlap"]
        )
    ]
    shim = model.shims[0]
    inputs = ArgsKwargs(
        args=(bilm.batch([tokens[i][first:last] for i, first, last, _, _ in pieces]),),
        kwargs={"initial_states": _initial_states(model, bilm)},
    )
    layers, torch_backprop = shim(inputs, is_train)
    array = torch2xp(layers.detach().float())  # (L + 1, pieces, T, width)
    outputs = _empty_outputs(model, docs, n_layers, width)
    for row, (i, first, _, keep_first, keep_last) in enumerate(pieces):
        kept = array[:, row, keep_first - first : keep_last - first]
        outputs[i][:, keep_first:keep_last] = model.ops.asarray3f(kept)

    def backprop(d_outputs: ElmoOutput) -> list[Doc]:
        d_layers = torch.zeros_like(layers)
        for row, (i, first, _, keep_first, keep_last) in enumerate(pieces):
            d_kept = d_outputs[i][:, keep_first:keep_last]
            d_layers[:, row, keep_first - first : keep_last - first] = xp2torch(
                d_kept, device=d_layers.device
            )
        torch_backprop(ArgsKwargs(args=(layers,), kwargs={"grad_tensors": (d_layers,)}))
        return []

    return outputs, backprop


def _predict(
    model: Model, bilm: BiLM, docs: Sequence[Doc], n_layers: int, width: int
) -> ElmoOutput:
    """The docs' layers from `embed_tokens` (windows run in length-sorted
    chunks of at most max_batch_tokens padded tokens), the path that
    `elmo_spacy.Embedder` and `elmo-spacy embed` share. The biLM is left in
    eval mode (not switched back to training, as thinc's shim.predict does),
    so that what it keeps between batches stays valid."""
    outputs = embed_tokens(
        bilm,
        [[t.text for t in doc] for doc in docs],
        max_batch_tokens=model.attrs["max_batch_tokens"],
        window=model.attrs["window"],
        window_overlap=model.attrs["window_overlap"],
        initial_states=_initial_states(model, bilm),
    )
    return [model.ops.asarray3f(output) for output in outputs]


def set_initial_state(model: Model, state: str, warmup: Sequence[Sequence[str]] | None) -> None:
    """Start every doc from `state`: "zero", or "primed" by the warm-up
    sentences (None: the default warm-up; see `initial_states_for`)."""
    check_state(state)
    model.attrs["state"] = state
    model.attrs["warmup"] = None if warmup is None else [list(s) for s in warmup]


def _initial_states(model: Model, bilm: BiLM) -> States | None:
    return initial_states_for(bilm, model.attrs.get("state", "zero"), model.attrs.get("warmup"))


def _empty_outputs(model: Model, docs: Sequence[Doc], n_layers: int, width: int) -> ElmoOutput:
    return [model.ops.alloc3f(n_layers, len(doc), width) for doc in docs]


def no_backprop(d_outputs: ElmoOutput) -> list[Doc]:
    """The backprop callback of outputs that pass no gradient on."""
    return []
