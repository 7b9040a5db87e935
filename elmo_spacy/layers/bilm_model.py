"""The biLM as a thinc model: List[Doc] -> one (n_layers, len(doc), width)
array per doc; and the same model run inline by a downstream pipe, which is
what a listener becomes in spaCy's `replace_listeners`."""

import copy
from collections.abc import Callable
from typing import Any

import srsly
import torch
from spacy.tokens import Doc
from thinc.api import (
    ArgsKwargs,
    Model,
    Optimizer,
    PyTorchGradScaler,
    PyTorchShim,
    get_torch_default_device,
    torch2xp,
    xp2torch,
)
from thinc.types import Floats3d

from ..bilm import BiLM, BiLMConfig, WordVocab, load_bilm
from ..bilm.formats.directory import bilm_from_bytes, bilm_to_bytes
from ..bilm.formats.locate import BiLMPath
from ..bilm.runner import Runner, RunSettings
from ..errors import ElmoSpacyError
from .fine_tuning import FineTuning

ElmoOutput = list[Floats3d]
# The thinc dim of the layers per doc on `doc._.elmo`: L + 1, or those `run.layers` keeps.
N_OUTPUT_LAYERS = "n_output_layers"
TOK2VEC_ARCHITECTURE = "elmo_spacy.ElmoTok2Vec.v1"
LISTENER_ARCHITECTURE = "elmo_spacy.ElmoListener.v1"


def build_bilm_model(
    bilm_config: dict[str, Any],
    settings: RunSettings,
    grad_scaler_config: dict[str, Any] | None = None,
    fine_tuning: FineTuning | None = None,
) -> Model[list[Doc], ElmoOutput]:
    """A thinc model that runs a biLM over docs with `settings`. The torch
    module is attached by `set_bilm`, or built by `init` from `bilm_config`
    and the initialisation docs' words. Its bytes carry the biLM, not the settings."""
    BiLMConfig.from_dict(bilm_config)  # fail at config time, not at init
    shim = BiLMShim(Runner(None, settings), grad_scaler_config or {}, fine_tuning)
    return Model(
        "elmo_bilm",
        forward,
        init=init,
        dims={"nO": None, N_OUTPUT_LAYERS: None},
        attrs={
            "bilm_config": dict(bilm_config),
            # spaCy's replace_listeners callbacks (not serialised: thinc skips functions)
            "replace_listener": replace_listener,
            "replace_listener_cfg": replace_listener_cfg,
        },
        shims=[shim],
    )


class BiLMShim(PyTorchShim):
    """thinc's PyTorchShim around a `Runner`, whose biLM (None until one is
    attached) is the torch module, serialised and copied in the biLM directory
    format. After a step it drops the gradients (None, not zeros, so that
    momentum does not move a parameter that gets no gradient next time) and
    tells the biLM its weights changed; with `fine_tuning`, that steps the biLM."""

    def __init__(
        self,
        runner: Runner,
        grad_scaler_config: dict[str, Any],
        fine_tuning: FineTuning | None = None,
    ) -> None:
        self.runner = runner
        self.grad_scaler_config = dict(grad_scaler_config)
        self.fine_tuning = fine_tuning
        super().__init__(
            runner.bilm,
            serialize_model=_bilm_bytes,
            deserialize_model=_bilm_from_bytes,
            grad_scaler=self._scaler(),
        )

    @property
    def _model(self) -> BiLM | None:
        return self.runner.bilm

    @_model.setter
    def _model(self, bilm: BiLM | None) -> None:
        if bilm is not self.runner.bilm:
            self.runner.bilm = bilm
        if hasattr(self, "_grad_scaler"):
            self._grad_scaler = self._scaler()

    def _scaler(self) -> PyTorchGradScaler:
        """On where the biLM computes in float16 on a GPU (thinc's scaler refuses the CPU)."""
        bilm = self.runner.bilm
        device = get_torch_default_device() if bilm is None else _device(bilm)
        enabled = bilm is not None and bilm.precision == "float16" and device.type == "cuda"
        scaler = PyTorchGradScaler(enabled=enabled, **self.grad_scaler_config)
        scaler.to_(device)
        return scaler

    def copy(self) -> "BiLMShim":
        bilm = self.runner.bilm
        if bilm is not None:
            bilm = bilm_from_bytes(bilm_to_bytes(bilm), with_softmax=False).to(_device(bilm))
        fine_tuning = None if self.fine_tuning is None else self.fine_tuning.copy()
        return BiLMShim(Runner(bilm, self.runner.settings), self.grad_scaler_config, fine_tuning)

    def finish_update(self, optimizer: Optimizer) -> None:
        parameters = list(self._model.parameters())
        stepped = any(p.grad is not None for p in parameters)
        if self.fine_tuning is None:
            super().finish_update(optimizer)
        else:
            if stepped and not self._grad_scaler.found_inf:
                self.fine_tuning.update(self.id, self._model)
            self.fine_tuning.step += 1
            self._grad_scaler.update()
        if stepped:
            for parameter in parameters:
                parameter.grad = None
            self._model.weights_changed()


def _device(bilm: BiLM) -> torch.device:
    return next(bilm.parameters()).device


def _bilm_bytes(bilm: BiLM | None) -> bytes:
    return b"" if bilm is None else srsly.msgpack_dumps(bilm_to_bytes(bilm))


def _bilm_from_bytes(_old: BiLM | None, data: bytes, device: torch.device) -> BiLM | None:
    if not data:
        return None
    return bilm_from_bytes(srsly.msgpack_loads(data), with_softmax=False).to(device)


def get_runner(model: Model) -> Runner:
    """The runner of a biLM model (`build_bilm_model`)."""
    return model.shims[0].runner


def trains_now(model: Model) -> bool:
    """Whether a training step may now change the biLM of `model`
    (`build_bilm_model`): not while its fine-tuning keeps every layer frozen."""
    fine_tuning = model.shims[0].fine_tuning
    return fine_tuning is None or bool(fine_tuning.trainable(get_bilm(model)))


def get_bilm(model: Model) -> BiLM | None:
    """The torch biLM attached to `model`, or None before initialisation."""
    return get_runner(model).bilm


def set_bilm(model: Model, bilm: BiLM) -> None:
    """Attach (or replace) the torch biLM that `model` runs."""
    bilm.softmax = None  # only the pretraining loss needs it
    model.shims[0]._model = bilm.to(get_torch_default_device())
    runner = get_runner(model)
    model.set_dim("nO", runner.width, force=True)
    model.set_dim(N_OUTPUT_LAYERS, runner.n_layers, force=True)


def init(model: Model, X: list[Doc] | None = None, Y=None) -> None:
    if get_bilm(model) is not None:
        return
    config = BiLMConfig.from_dict(model.attrs["bilm_config"])
    words = [[t.text for t in doc] for doc in X or []]
    vocab = WordVocab.build(words, max_size=config.max_vocab_size, min_count=1)
    set_bilm(model, BiLM(config, vocab, with_softmax=False))


def forward(model: Model, docs: list[Doc], is_train: bool) -> tuple[ElmoOutput, Callable]:
    runner = get_runner(model)
    if runner.bilm is None:
        raise ElmoSpacyError(
            "The elmo pipe has no biLM yet: call nlp.initialize() (with "
            "[initialize.components.elmo] bilm_path set) or load a trained pipeline."
        )
    tokens = [[t.text for t in doc] for doc in docs]
    if not is_train:
        return [model.ops.asarray3f(output) for output in runner.embed(tokens)], no_backprop
    windows = runner.windows([len(t) for t in tokens])
    outputs = windows.empty_outputs(runner.n_layers, runner.width, model.ops.xp)
    if not windows.pieces:
        return outputs, no_backprop
    bilm = runner.bilm
    fine_tuning = model.shims[0].fine_tuning
    if fine_tuning is not None:
        bilm.set_trainable(fine_tuning.trainable(bilm))  # gradients for those layers only
    inputs = ArgsKwargs(
        args=(bilm.batch(windows.window_tokens(tokens)),),
        kwargs={"initial_states": runner.initial_states()},
    )
    layers, torch_backprop = model.shims[0](inputs, is_train)
    kept = runner.select(layers)  # (n_layers, pieces, T, width)
    windows.gather(torch2xp(kept.detach().float()), outputs)
    if not kept.requires_grad:  # the layers kept are all below the trainable ones
        return outputs, no_backprop

    def backprop(d_outputs: ElmoOutput) -> list[Doc]:
        d_kept = torch.zeros_like(kept)
        windows.scatter(d_outputs, d_kept, lambda a: xp2torch(a, device=d_kept.device))
        torch_backprop(ArgsKwargs(args=(kept,), kwargs={"grad_tensors": (d_kept,)}))
        return []

    return outputs, backprop


def no_backprop(d_outputs: ElmoOutput) -> list[Doc]:
    """The backprop callback of outputs that pass no gradient on."""
    return []


# -- the biLM run inline by a downstream pipe -------------------------------


def inline_bilm(
    bilm_model: Model[list[Doc], ElmoOutput],
    grad_factor: float,
    bilm_path: BiLMPath | None = None,
) -> Model[list[Doc], ElmoOutput]:
    """`bilm_model` run by a downstream pipe in the place of a listener
    (`elmo_spacy.ElmoTok2Vec.v1`), its gradient scaled by `grad_factor`;
    `initialize` reads the biLM at `bilm_path` if none is attached yet."""
    model = Model(
        "elmo_inline_bilm",
        _inline_forward,
        init=_inline_init,
        layers=[bilm_model],
        dims={"nO": None, N_OUTPUT_LAYERS: None},
        attrs={"grad_factor": grad_factor, "bilm_path": bilm_path},
    )
    copy_dims(bilm_model, model)
    return model


def _inline_forward(model: Model, docs: list[Doc], is_train: bool) -> tuple[ElmoOutput, Callable]:
    bilm_model = model.layers[0]
    grad_factor = model.attrs["grad_factor"]
    if not is_train or grad_factor == 0 or not trains_now(bilm_model):
        return bilm_model.predict(docs), no_backprop
    outputs, backprop_bilm = bilm_model.begin_update(docs)

    def backprop(d_outputs: ElmoOutput) -> list[Doc]:
        return backprop_bilm([d * grad_factor for d in d_outputs])

    return outputs, backprop


def _inline_init(model: Model, X: list[Doc] | None = None, Y=None) -> None:
    bilm_model = model.layers[0]
    if get_bilm(bilm_model) is None:
        path = model.attrs["bilm_path"]
        if path is None:
            raise ElmoSpacyError(
                f"{TOK2VEC_ARCHITECTURE} has no biLM to initialise from: set its bilm_path "
                "(e.g. bilm_path = ${paths.bilm}) to a pretrained biLM"
            )
        set_bilm(bilm_model, load_bilm(path, with_softmax=False))
    copy_dims(bilm_model, model)


def copy_dims(bilm_model: Model, model: Model) -> None:
    """Give `model` (a listener, an inline biLM) the dims that `bilm_model` has set."""
    for dim in ("nO", N_OUTPUT_LAYERS):
        if bilm_model.has_dim(dim):
            model.set_dim(dim, bilm_model.get_dim(dim), force=True)


def replace_listener(bilm_model: Model, listener: Model, pipe: Any) -> Model:
    """spaCy's `replace_listeners` callback: `bilm_model`, a copy of the `elmo`
    pipe's model, takes the listener's place with its grad_factor."""
    return inline_bilm(bilm_model, listener.attrs["grad_factor"])


def replace_listener_cfg(
    bilm_model_cfg: dict[str, Any], tok2vec_cfg: dict[str, Any]
) -> dict[str, Any]:
    """spaCy's `replace_listeners` callback for the config: the listener's block
    (in `tok2vec_cfg`) becomes the `elmo_spacy.ElmoTok2Vec.v1` block of `replace_listener`'s."""
    found = _listener_blocks(tok2vec_cfg)
    if len(found) != 1:
        raise ElmoSpacyError(
            f"replace_listeners: the component's model.tok2vec block holds {len(found)} "
            f"{LISTENER_ARCHITECTURE} blocks; one can be replaced"
        )
    listener_cfg = found[0]
    return {
        "@architectures": TOK2VEC_ARCHITECTURE,
        "bilm": copy.deepcopy(dict(bilm_model_cfg)),
        "mix": copy.deepcopy(listener_cfg["mix"]),
        "grad_factor": listener_cfg.get("grad_factor", 1.0),
        "width": listener_cfg.get("width"),
        "bilm_path": None,
    }


def _listener_blocks(block: Any) -> list[dict[str, Any]]:
    """The ElmoListener blocks in a config block (which may be one)."""
    if not isinstance(block, dict):
        return []
    if block.get("@architectures") == LISTENER_ARCHITECTURE:
        return [block]
    return [found for value in block.values() for found in _listener_blocks(value)]
