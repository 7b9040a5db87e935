"""The `elmo` pipe: runs the biLM and attaches per-layer vectors to every Doc."""

import operator
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path

import numpy
import srsly
import torch
from spacy import util
from spacy.language import Language
from spacy.pipeline import Tok2Vec, TrainablePipe
from spacy.tokens import Doc
from spacy.training import Example, validate_examples
from spacy.vocab import Vocab
from thinc.api import Model, Ops, Optimizer, set_dropout_rate

from .bilm import load_bilm
from .bilm.formats.directory import bilm_from_bytes, bilm_to_bytes, read_bilm_directory, save_bilm
from .bilm.formats.locate import BiLMPath
from .bilm.runner import resolve_layers
from .bilm.runtime.lru import LruCache
from .errors import ElmoSpacyError
from .extensions import annotate, install_extensions, store_layers
from .layers import ElmoListener, get_bilm, get_runner, set_bilm
from .layers.bilm_model import ElmoOutput, copy_dims, no_backprop, trains_now
from .loaders import BiLMLoader

DTYPES = ("float32", "float16")
STORES = ("layers", "tensor", "nothing")


@Language.factory(
    "elmo",
    default_config={
        "model": {
            "@architectures": "elmo_spacy.ElmoBiLM.v1",
            "run": {"@misc": "elmo_spacy.RunSettings.v1"},
        },
        "dtype": "float32",
        "cache_mb": 2048,
        "store": "layers",
    },
    assigns=["doc._.elmo", "doc.tensor"],
)
def make_elmo(
    nlp: Language,
    name: str,
    model: Model,
    dtype: str,
    cache_mb: int,
    store: str | list[int],
) -> "Elmo":
    return Elmo(nlp.vocab, model, name=name, dtype=dtype, cache_mb=cache_mb, store=store)


class FrozenOutputCache(LruCache[tuple[str, ...], numpy.ndarray]):
    """The (L + 1, n, width) layers of docs seen before, so that a frozen biLM
    runs once per training doc: kept on the host in float16 under the docs'
    token texts, at most `max_size` bytes (least recently used dropped first),
    returned as float32 copies. `max_size` <= 0: off, every call computes and
    nothing is rounded."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, size_of=operator.attrgetter("nbytes"))

    def get_or_compute(
        self, docs: Sequence[Doc], compute: Callable[[list[Doc]], ElmoOutput], ops: Ops
    ) -> ElmoOutput:
        """The layers of each doc: kept ones, and `compute` run once on the
        docs that have none; arrays of `ops`, as `compute` returns."""
        if self.max_size <= 0:
            return compute(list(docs))
        keys = [tuple(token.text for token in doc) for doc in docs]
        outputs = [self.get(key) for key in keys]
        missing = [i for i, entry in enumerate(outputs) if entry is None]
        if missing:
            for i, layers in zip(missing, compute([docs[i] for i in missing])):
                outputs[i] = ops.to_numpy(layers).astype("float16")
                self.put(keys[i], outputs[i])
        return [ops.asarray3f(entry) for entry in outputs]


class Elmo(TrainablePipe):
    """Runs a pretrained biLM over each doc and sets `doc._.elmo`, (L + 1,
    len(doc), width) with layer 0 the token encoding, and `doc.tensor`, their
    mean (docs/pipes.md). How the biLM runs is its model's `run` block; the
    pipe's own settings (`cfg`; a loaded pipeline takes its config's):

    dtype: "float32", or "float16" to store `doc._.elmo` in half the memory.
    cache_mb: the MB of float16 cache for a frozen biLM's training layers (0: none).
    store: what stays on each doc once its listeners have read it: "layers",
        a list of layer indices, "tensor" or "nothing" (docs/pipes.md).
    """

    def __init__(
        self,
        vocab: Vocab,
        model: Model,
        name: str = "elmo",
        *,
        dtype: str = "float32",
        cache_mb: int = 2048,
        store: str | Sequence[int] = "layers",
    ) -> None:
        where = f"[components.{name}]"
        if dtype not in DTYPES:
            raise ElmoSpacyError(f"{where} dtype = {dtype!r}: use one of {DTYPES}")
        if isinstance(store, str) and store not in STORES:
            raise ElmoSpacyError(
                f"{where} store = {store!r}: use one of {STORES}, or a list of layer indices"
            )
        if not isinstance(store, str) and not store:
            raise ElmoSpacyError(
                f'{where} store = []: name a layer to keep, or "tensor" or "nothing"'
            )
        if cache_mb < 0:
            raise ElmoSpacyError(f"{where} cache_mb = {cache_mb}: give 0 (no cache) or more")
        self.vocab = vocab
        self.model = model
        self.name = name
        store = store if isinstance(store, str) else [int(i) for i in store]
        self.cfg = {"dtype": dtype, "cache_mb": cache_mb, "store": store}
        self.listener_map: dict[str, list[ElmoListener]] = {}
        self.frozen_cache = FrozenOutputCache(cache_mb * 2**20)
        self._pid = os.getpid()
        self._stored_rows: list[int] | None = None  # rows of `store`, resolved with the biLM
        install_extensions()

    # -- listeners: the protocol of spaCy's Tok2Vec, with its methods ----------

    listeners = Tok2Vec.listeners
    listening_components = Tok2Vec.listening_components
    remove_listener = Tok2Vec.remove_listener

    def add_listener(self, listener: ElmoListener, component_name: str) -> None:
        Tok2Vec.add_listener(self, listener, component_name)
        self._link(listener)

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
        copy_dims(self.model, listener)

    # -- prediction ----------------------------------------------------------

    def predict(self, docs: Iterable[Doc]) -> ElmoOutput:
        """Returns one float32 (n_output_layers, len(doc), width) array per doc."""
        if os.getpid() != self._pid:
            # A fork of nlp.pipe(n_process=...): torch's OpenMP pool does not survive a
            # fork (the first parallel op hangs), and the workers share the cores anyway.
            torch.set_num_threads(1)
            self._pid = os.getpid()
        return self.model.predict(list(docs))

    def set_annotations(self, docs: Sequence[Doc], outputs: ElmoOutput) -> None:
        """Attach each doc's layers on the host for the listeners; once read,
        what `store` keeps stays (`elmo_spacy.extensions.annotate`)."""
        if self._stored_rows is None:
            self._stored_rows = self._resolve_store()
        readers = [listener.id for listener in self.listeners]
        store = {"rows": self._stored_rows, "dtype": self.cfg["dtype"]}
        for doc, layers in zip(docs, outputs):
            annotate(doc, self.model.ops.to_numpy(layers), readers, store)

    def store_layers(self, doc: Doc) -> Doc:
        """Apply `store` now to a doc that a listening pipe did not read (it was disabled)."""
        store_layers(doc)
        return doc

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
        The gradients of listeners with grad_factor != 0 are summed and the
        biLM is updated once the last of them has backpropagated; with none,
        or while `fine_tuning` keeps every layer frozen, the biLM only predicts."""
        if losses is None:
            losses = {}
        validate_examples(examples, "Elmo.update")
        docs = [eg.predicted for eg in examples]
        losses.setdefault(self.name, 0.0)
        batch_id = ElmoListener.get_batch_id(docs)
        learners = [listener for listener in self.listeners if listener.attrs["grad_factor"] != 0]
        if not learners or not trains_now(self.model):
            outputs = self.frozen_cache.get_or_compute(docs, self.predict, self.model.ops)
            for listener in self.listeners:
                listener.receive(batch_id, outputs, no_backprop)
            if learners and sgd is not None:
                self.finish_update(sgd)  # a step of the fine-tuning's schedules
            return losses
        self.frozen_cache.clear()  # the biLM is about to change
        set_dropout_rate(self.model, drop)
        outputs, backprop_bilm = self.model.begin_update(docs)
        d_outputs = [self.model.ops.alloc3f(*o.shape) for o in outputs]

        def accumulate_gradient(one_d_outputs: ElmoOutput) -> list[Doc]:
            for d_total, d_one in zip(d_outputs, one_d_outputs):
                d_total += d_one
                losses[self.name] += float((d_one**2).sum())
            return []

        def backprop(one_d_outputs: ElmoOutput) -> list[Doc]:
            accumulate_gradient(one_d_outputs)
            backprop_bilm(d_outputs)
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
        bilm_path: BiLMPath | None = None,
        bilm_loader: BiLMLoader | None = None,
        untrained: bool = False,
    ) -> None:
        """Load the pretrained biLM at `bilm_path` (anything `load_bilm` reads)
        or the one `bilm_loader` reads; only with `untrained = true` (and a
        warning), build one of random weights from the model's `bilm`
        settings and a vocabulary of the example docs."""
        if bilm_path is not None and bilm_loader is not None:
            raise ElmoSpacyError(
                f"[initialize.components.{self.name}] sets both bilm_path and bilm_loader: keep one"
            )
        if bilm_loader is not None:
            self._set_bilm(bilm_loader())
        elif bilm_path is not None:
            self._set_bilm(load_bilm(bilm_path, with_softmax=False))
        elif untrained:
            warnings.warn(
                f"The '{self.name}' pipe runs an untrained biLM of random weights "
                "(untrained = true): its vectors carry no meaning.",
                stacklevel=2,
            )
            docs = [eg.reference for eg in islice(get_examples(), 1000)]
            self.model.initialize(X=docs)
            self._bilm_changed()
        else:
            raise ElmoSpacyError(
                f"The '{self.name}' pipe needs a pretrained biLM: set "
                f"[initialize.components.{self.name}] bilm_path (e.g. training/bilm/model-best, "
                "or --paths.bilm if the config reads it from [paths]). For a biLM of random "
                "weights, set untrained = true there instead."
            )

    # -- serialisation: the biLM directory format, never pickle ----------------
    # The settings are the config's: the saved cfg is not read back.

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> None:
        serializers = {
            "cfg": lambda p: srsly.write_json(p, self.cfg),
            "bilm": lambda p: save_bilm(self._require_bilm(), p),
        }
        util.to_disk(path, serializers, exclude)

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> "Elmo":
        deserializers = {
            "cfg": lambda p: None,
            "bilm": lambda p: self._set_bilm(read_bilm_directory(p, with_softmax=False)),
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
        deserializers = {
            "cfg": lambda cfg: None,
            "bilm": lambda b: self._set_bilm(bilm_from_bytes(b, with_softmax=False)),
        }
        util.from_bytes(bytes_data, deserializers, exclude)
        return self

    def _set_bilm(self, bilm) -> None:
        set_bilm(self.model, bilm)
        self._bilm_changed()

    def _bilm_changed(self) -> None:
        self._check_tokenization()
        self._stored_rows = self._resolve_store()
        self.frozen_cache.clear()
        for listener in self.listeners:
            self._link(listener)

    def _resolve_store(self) -> str | list[int]:
        """The `store` setting as rows of the layers the listeners get: "all",
        a list of rows, "tensor" or "nothing"."""
        store = self.cfg["store"]
        if store == "layers":
            return "all"
        if isinstance(store, str):
            return store
        n_layers = get_bilm(self.model).config.n_output_layers
        handed_out = get_runner(self.model).layers or list(range(n_layers))
        where = f"[components.{self.name}] store"
        wanted = resolve_layers(store, n_layers, where)
        missing = [i for i in wanted if i not in handed_out]
        if missing:
            raise ElmoSpacyError(
                f"{where} = {store} names layers {missing} that the pipe does not compute "
                f"([components.{self.name}.model.run] layers = "
                f"{list(get_runner(self.model).settings.layers)}): keep layers among those, or "
                "widen layers"
            )
        return [handed_out.index(i) for i in wanted]

    def _check_tokenization(self) -> None:
        """Warn where the biLM learned the tokens of another language's tokenizer
        than the pipeline's: the docs it gets are cut another way."""
        recorded, lang = get_bilm(self.model).tokenization, self.vocab.lang
        if recorded and recorded.tokenizer == "spacy" and lang and lang != recorded.lang:
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
