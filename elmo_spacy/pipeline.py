"""The `elmo` pipe: runs the biLM and attaches per-layer vectors to every Doc."""

import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path

import srsly
import torch
from spacy import util
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc
from spacy.training import Example, validate_examples
from spacy.vocab import Vocab
from thinc.api import Config, Model, Optimizer, set_dropout_rate

from .bilm.formats.directory import bilm_from_bytes, bilm_to_bytes, load_bilm, save_bilm
from .bilm.inference import check_state, resolve_layers
from .bilm.runtime.precision import check_precision, resolve_precision
from .cache import FrozenOutputCache
from .errors import ElmoSpacyError
from .extensions import install_extensions, set_layers
from .layers import ElmoListener, get_bilm, set_bilm
from .layers.bilm_model import ElmoOutput, no_backprop, set_initial_state
from .layers.dims import N_OUTPUT_LAYERS

DEFAULT_ELMO_MODEL = """
[model]
@architectures = "elmo_spacy.ElmoBiLM.v1"
max_batch_tokens = 4096
"""
DTYPES = ("float32", "float16")
SETTINGS = ("layers", "dtype", "cache_mb", "state", "warmup", "precision")


@Language.factory(
    "elmo",
    default_config={
        "model": Config().from_str(DEFAULT_ELMO_MODEL)["model"],
        "layers": None,
        "dtype": "float32",
        "cache_mb": 2048,
        "state": "zero",
        "warmup": None,
        "precision": "float32",
    },
    assigns=["doc._.elmo", "doc.tensor"],
)
def make_elmo(
    nlp: Language,
    name: str,
    model: Model,
    layers: list[int] | None,
    dtype: str,
    cache_mb: int,
    state: str,
    warmup: list[str] | None,
    precision: str,
) -> "Elmo":
    return Elmo(
        nlp.vocab,
        model,
        name=name,
        layers=layers,
        dtype=dtype,
        cache_mb=cache_mb,
        state=state,
        warmup=warmup,
        precision=precision,
    )


class Elmo(TrainablePipe):
    """Runs a pretrained biLM over each doc and sets:

    - `doc._.elmo`: (L + 1, len(doc), width); layer 0 is the token encoding,
      layers 1..L the biLSTM layers ([forward; backward]). `token._.elmo`
      (L + 1, width) and `span._.elmo` (L + 1, len(span), width) are views of it.
    - `doc.tensor`: the default mix, the mean of the layers, (n, width) float32.
      User hooks make `token.vector`, `span.vector`, `doc.vector` and
      `doc.similarity` use the same mix, also when the vocab has static vectors.

    Downstream pipes use the layers through `elmo_spacy.ElmoListener.v1`.

    layers: keep only these layers (indices into 0..L), in this order, on the
        docs and for the listeners; None keeps all L + 1.
    dtype: "float32", or "float16" to store `doc._.elmo` in half the memory
        (listeners still compute in float32).
    cache_mb: while training with a frozen biLM (no listener with
        grad_factor != 0), the layers of each training doc are computed once
        and kept in a float16 cache of at most this many MB (0: no cache, no
        rounding). Prediction outside training never uses the cache; the cache
        is emptied when the biLM changes and when training ends (with the
        `elmo_spacy.ReleaseTrainingCaches.v1` logger of the shipped configs).
    state: the LSTM state every doc starts from: "zero" (the default), or
        "primed": the state that reading a warm-up text leaves, as the
        published ELMo models (trained with the state carried from batch to
        batch) expect. Either way a doc's vectors do not depend on the other
        docs of its batch. The primed state is computed once per version of
        the weights (again after a fine-tuning step).
    warmup: the warm-up sentences of state = "primed", tokens separated by
        spaces; null: a few sentences of news English shipped with the
        plugin (`elmo_spacy.bilm.inference.DEFAULT_WARMUP`).
    precision: what the biLM computes in: "float32" (the default, conformant)
        or "bfloat16" (faster where the CPU multiplies in it, e.g. AVX512-BF16
        or AMX; each layer moves by under 1% of its largest value; float32 with a
        warning elsewhere). `doc._.elmo` is float32 (or `dtype`) either way;
        see `elmo_spacy.bilm.precision`.

    These settings are the factory's config, the one place they live: the
    pipe's `cfg` mirrors them (and is what `to_disk` saves beside the biLM),
    a saved pipeline loads with those of its config.cfg, and
    `spacy.load(path, config={"components": {"elmo": {...}}})` changes them.
    They are read-only on the pipe.
    """

    def __init__(
        self,
        vocab: Vocab,
        model: Model,
        name: str = "elmo",
        *,
        layers: Sequence[int] | None = None,
        dtype: str = "float32",
        cache_mb: int = 2048,
        state: str = "zero",
        warmup: Sequence[str] | None = None,
        precision: str = "float32",
    ) -> None:
        if dtype not in DTYPES:
            raise ElmoSpacyError(f"[components.{name}] dtype = {dtype!r}: use one of {DTYPES}")
        if layers is not None and not layers:
            raise ElmoSpacyError(f"[components.{name}] layers is empty: name at least one, or null")
        check_state(state, f"[components.{name}] state")
        check_precision(precision, f"[components.{name}] precision")
        self.vocab = vocab
        self.model = model
        self.name = name
        self.cfg: dict = {
            "layers": None if layers is None else [int(i) for i in layers],
            "dtype": dtype,
            "cache_mb": cache_mb,
            "state": state,
            "warmup": _warmup(warmup, name),
            "precision": precision,
        }
        self._layers = self.cfg["layers"]  # resolved against the biLM's layers once it is there
        self.listener_map: dict[str, list[ElmoListener]] = {}
        self.frozen_cache = FrozenOutputCache(cache_mb * 2**20)
        self._pid = os.getpid()
        warmup_tokens = None if self.warmup is None else [s.split() for s in self.warmup]
        set_initial_state(self.model, state, warmup_tokens)
        install_extensions()

    # -- settings: the factory's, read-only here (see the class docstring) ----

    @property
    def layers(self) -> list[int] | None:
        """The layers kept, as indices into 0..L (None: all)."""
        return self._layers

    @property
    def dtype(self) -> str:
        return self.cfg["dtype"]

    @property
    def cache_mb(self) -> int:
        return self.cfg["cache_mb"]

    @property
    def state(self) -> str:
        """ "zero" or "primed": see the class docstring."""
        return self.cfg["state"]

    @property
    def warmup(self) -> list[str] | None:
        """The warm-up sentences of the primed state (None: the default ones)."""
        return self.cfg["warmup"]

    @property
    def precision(self) -> str:
        """ "float32" or "bfloat16": see the class docstring."""
        return self.cfg["precision"]

    def __setattr__(self, name: str, value) -> None:
        if name in SETTINGS and name in getattr(self, "cfg", {}):
            raise ElmoSpacyError(
                f"[components.{self.name}] {name} is set when the pipe is made, in its config: "
                f"nlp.add_pipe('elmo', config={{'{name}': ...}}), or for a saved pipeline "
                f"spacy.load(path, config={{'components': {{'{self.name}': {{'{name}': ...}}}}}})"
            )
        super().__setattr__(name, value)

    def _apply_precision(self) -> None:
        bilm = get_bilm(self.model)
        where = f"[components.{self.name}] precision"
        bilm.precision = resolve_precision(self.precision, next(bilm.parameters()).device, where)

    @property
    def n_output_layers(self) -> int:
        """Layers per doc on `doc._.elmo` and for the listeners."""
        if self.layers is not None:
            return len(self.layers)
        return self.model.get_dim(N_OUTPUT_LAYERS)

    # -- listeners (the protocol of spaCy's Tok2Vec) -------------------------

    @property
    def listeners(self) -> list[ElmoListener]:
        return [m for c in self.listening_components for m in self.listener_map[c]]

    @property
    def listening_components(self) -> list[str]:
        return list(self.listener_map.keys())

    def add_listener(self, listener: ElmoListener, component_name: str) -> None:
        self.listener_map.setdefault(component_name, [])
        if listener not in self.listener_map[component_name]:
            self.listener_map[component_name].append(listener)
        self._link(listener)

    def remove_listener(self, listener: ElmoListener, component_name: str) -> bool:
        if listener in self.listener_map.get(component_name, []):
            self.listener_map[component_name].remove(listener)
            if not self.listener_map[component_name]:
                del self.listener_map[component_name]
            return True
        return False

    def find_listeners(self, component) -> None:
        """Register the ElmoListener layers of `component` whose upstream is
        '*' or this pipe's name."""
        names = ("*", self.name)
        if isinstance(getattr(component, "model", None), Model):
            for node in component.model.walk():
                if isinstance(node, ElmoListener) and node.upstream_name in names:
                    self.add_listener(node, component.name)

    def _link(self, listener: ElmoListener) -> None:
        listener.upstream_pipe = self
        if self.model.has_dim("nO"):
            listener.set_dim("nO", self.model.get_dim("nO"), force=True)
            listener.set_dim(N_OUTPUT_LAYERS, self.n_output_layers, force=True)

    # -- prediction ----------------------------------------------------------

    def predict(self, docs: Iterable[Doc]) -> ElmoOutput:
        """Returns one float32 (layers, len(doc), width) array per doc."""
        self._one_thread_in_forked_workers()
        return self.select_layers(self.model.predict(list(docs)))

    def set_annotations(self, docs: Sequence[Doc], outputs: ElmoOutput) -> None:
        """Attach each doc's layers, as a numpy array on the host whatever
        device the biLM ran on."""
        for doc, layers in zip(docs, outputs):
            set_layers(doc, self.model.ops.to_numpy(layers).astype(self.dtype, copy=False))

    def select_layers(self, outputs: ElmoOutput) -> ElmoOutput:
        """The configured `layers` of each (L + 1, n, width) output."""
        if self.layers is None:
            return outputs
        return [output[self.layers] for output in outputs]

    def _one_thread_in_forked_workers(self) -> None:
        """spaCy's nlp.pipe(n_process=...) forks, and torch's OpenMP thread pool
        does not survive a fork: the first parallel op in the child hangs.
        Workers share the cores anyway, so a forked copy of this pipe runs
        torch on one thread."""
        if os.getpid() != self._pid:
            torch.set_num_threads(1)
            self._pid = os.getpid()

    # -- training --------------------------------------------------------------

    def update(
        self,
        examples: Iterable[Example],
        *,
        drop: float = 0.0,
        sgd: Optimizer | None = None,
        losses: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """Run the biLM on a batch and broadcast its outputs to the listeners.
        If some listener has grad_factor != 0, their gradients flow back into
        the biLM and it is updated once the last of them has backpropagated;
        otherwise the biLM only predicts and its weights never change."""
        if losses is None:
            losses = {}
        validate_examples(examples, "Elmo.update")
        docs = [eg.predicted for eg in examples]
        losses.setdefault(self.name, 0.0)
        batch_id = ElmoListener.get_batch_id(docs)
        learners = [listener for listener in self.listeners if listener.wants_gradient]
        if not learners:
            outputs = self.frozen_cache.get_or_compute(docs, self.predict, self.model.ops)
            for listener in self.listeners:
                listener.receive(batch_id, outputs, no_backprop)
            return losses
        self.frozen_cache.clear()  # the biLM is about to change
        set_dropout_rate(self.model, drop)
        all_layers, backprop_bilm = self.model.begin_update(docs)
        outputs = self.select_layers(all_layers)
        d_layers = [self.model.ops.alloc3f(*o.shape) for o in all_layers]
        keep = slice(None) if self.layers is None else self.layers

        def accumulate_gradient(one_d_outputs: ElmoOutput) -> list[Doc]:
            for d_total, d_one in zip(d_layers, one_d_outputs):
                d_total[keep] += d_one
                losses[self.name] += float((d_one**2).sum())
            return []

        def backprop(one_d_outputs: ElmoOutput) -> list[Doc]:
            accumulate_gradient(one_d_outputs)
            backprop_bilm(d_layers)
            if sgd is not None:
                self.finish_update(sgd)
            return []

        for listener in self.listeners:
            callback = backprop if listener is learners[-1] else accumulate_gradient
            listener.receive(batch_id, outputs, callback)
        return losses

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]],
        *,
        nlp: Language | None = None,
        bilm_path: str | Path | None = None,
        untrained: bool = False,
    ) -> None:
        """Load the pretrained biLM at `bilm_path`: whatever `load_bilm` takes
        (a biLM directory, a folder with a published bilm-tf model, an NLPL
        folder or .zip; see `elmo_spacy.bilm.locate`). Only with `untrained = true` (and a
        warning) is a biLM of random weights built instead, from the model's
        `bilm` settings and a vocabulary of the example docs."""
        if bilm_path is not None:
            set_bilm(self.model, load_bilm(bilm_path, with_softmax=False))
        elif untrained:
            warnings.warn(
                f"The '{self.name}' pipe runs an untrained biLM of random weights "
                "(untrained = true): its vectors carry no meaning.",
                stacklevel=2,
            )
            docs = [eg.reference for eg in islice(get_examples(), 1000)]
            self.model.initialize(X=docs)
        else:
            raise ElmoSpacyError(
                f"The '{self.name}' pipe needs a pretrained biLM: set "
                f"[initialize.components.{self.name}] bilm_path (e.g. training/bilm/model-best, "
                "or --paths.bilm if the config reads it from [paths]). For a biLM of random "
                "weights, set untrained = true there instead."
            )
        self._bilm_changed()

    # -- serialisation: the biLM directory format, never pickle ----------------

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> None:
        serializers = {
            "cfg": lambda p: srsly.write_json(p, self.cfg),
            "bilm": lambda p: save_bilm(self._require_bilm(), p),
        }
        util.to_disk(path, serializers, exclude)

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> "Elmo":
        def load_bilm_dir(p: Path) -> None:
            set_bilm(self.model, load_bilm(p, with_softmax=False))
            self._bilm_changed()

        deserializers = {
            "cfg": lambda p: None,  # the settings are the config's (see the class docstring)
            "bilm": load_bilm_dir,
        }
        util.from_disk(path, deserializers, exclude)
        return self

    def to_bytes(self, *, exclude: Iterable[str] = tuple()) -> bytes:
        serializers = {
            "cfg": lambda: self.cfg,
            "bilm": lambda: bilm_to_bytes(self._require_bilm()),
        }
        return util.to_bytes(serializers, exclude)

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = tuple()) -> "Elmo":
        def load_bilm_bytes(payload: dict) -> None:
            set_bilm(self.model, bilm_from_bytes(payload, with_softmax=False))
            self._bilm_changed()

        deserializers = {"cfg": lambda cfg: None, "bilm": load_bilm_bytes}
        util.from_bytes(bytes_data, deserializers, exclude)
        return self

    def _bilm_changed(self) -> None:
        self._apply_precision()
        self._check_tokenization()
        n_layers = self.model.get_dim(N_OUTPUT_LAYERS)
        where = f"[components.{self.name}] layers"
        self._layers = resolve_layers(self.cfg["layers"], n_layers, where)
        self.frozen_cache.clear()
        for listener in self.listeners:
            self._link(listener)

    def _check_tokenization(self) -> None:
        """Warn where the biLM learned the tokens of another language's tokenizer
        than the pipeline's: the docs it gets are cut another way."""
        recorded = get_bilm(self.model).tokenization
        lang = self.vocab.lang
        if (
            recorded is not None
            and recorded.tokenizer == "spacy"
            and lang
            and recorded.lang != lang
        ):
            warnings.warn(
                f"The '{self.name}' pipe's biLM learned {recorded}, but this pipeline's docs "
                f"are cut by spaCy's tokenizer for {lang!r}: its vectors are for tokens cut "
                "another way. Use a pipeline of the biLM's language, or pretrain on text "
                f"prepared with --lang {lang}.",
                stacklevel=3,
            )

    def _require_bilm(self):
        bilm = get_bilm(self.model)
        if bilm is None:
            raise ElmoSpacyError(
                f"The '{self.name}' pipe has no biLM to save: initialize it first."
            )
        return bilm


def _warmup(warmup: Sequence[str] | None, name: str) -> list[str] | None:
    """The warm-up sentences checked: a list of strings with a token at least."""
    if warmup is None:
        return None
    if isinstance(warmup, str) or not all(isinstance(s, str) for s in warmup):
        raise ElmoSpacyError(
            f"[components.{name}] warmup must be a list of sentences (strings, tokens "
            f"separated by spaces); got {warmup!r}"
        )
    if not any(s.split() for s in warmup):
        raise ElmoSpacyError(
            f"[components.{name}] warmup holds no token: give at least one sentence, or null "
            "for the default warm-up"
        )
    return [s for s in warmup if s.split()]
