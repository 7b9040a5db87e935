"""The `elmo` pipe: runs the biLM and attaches per-layer vectors to every Doc."""

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path

import numpy
import srsly
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc, Span, Token
from spacy.training import Example, validate_examples
from spacy.util import ensure_path
from spacy.vocab import Vocab
from thinc.api import Config, Model, Optimizer, set_dropout_rate

from .bilm.io import bilm_from_bytes, bilm_to_bytes, load_bilm, save_bilm
from .cache import FrozenOutputCache
from .layers import ElmoListener, get_bilm, set_bilm
from .layers.bilm_model import ElmoOutput, no_backprop

DEFAULT_ELMO_MODEL = """
[model]
@architectures = "elmo_spacy.ElmoBiLM.v1"
max_batch_tokens = 4096
"""


@Language.factory(
    "elmo",
    default_config={"model": Config().from_str(DEFAULT_ELMO_MODEL)["model"], "cache_mb": 2048},
    assigns=["doc._.elmo", "doc.tensor"],
)
def make_elmo(nlp: Language, name: str, model: Model, cache_mb: int) -> "Elmo":
    return Elmo(nlp.vocab, model, name=name, cache_mb=cache_mb)


class Elmo(TrainablePipe):
    """Runs a pretrained biLM over each doc and sets:

    - `doc._.elmo`: float32 (L + 1, len(doc), width); layer 0 is the token
      encoding, layers 1..L the biLSTM layers ([forward; backward]).
      `token._.elmo` (L + 1, width) and `span._.elmo` (L + 1, len(span), width)
      are views of it.
    - `doc.tensor`: the default mix, the mean of the L + 1 layers (n, width).
      User hooks make `token.vector`, `span.vector`, `doc.vector` and
      `doc.similarity` use the same mix, also when the vocab has static vectors.

    Downstream pipes use the layers through `elmo_spacy.ElmoListener.v1`.

    cache_mb: while training with a frozen biLM (no listener with
        grad_factor != 0), the layers of each training doc are computed once
        and kept in a float16 cache of at most this many MB (0 disables it).
        Prediction outside training never uses the cache.
    """

    def __init__(
        self, vocab: Vocab, model: Model, name: str = "elmo", cache_mb: int = 2048
    ) -> None:
        self.vocab = vocab
        self.model = model
        self.name = name
        self.listener_map: dict[str, list[ElmoListener]] = {}
        self.cfg: dict = {}
        self.frozen_cache = FrozenOutputCache(cache_mb * 2**20)
        install_extensions()

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
        listener.upstream_model = self.model
        if self.model.has_dim("nO"):
            listener.set_dim("nO", self.model.get_dim("nO"), force=True)
            listener.set_dim("n_layers", self.model.get_dim("n_layers"), force=True)

    # -- prediction ----------------------------------------------------------

    def predict(self, docs: Iterable[Doc]) -> ElmoOutput:
        """Returns one float32 (L + 1, len(doc), width) array per doc."""
        return self.model.predict(list(docs))

    def set_annotations(self, docs: Sequence[Doc], outputs: ElmoOutput) -> None:
        for doc, layers in zip(docs, outputs):
            doc._.elmo = layers
            doc.tensor = default_mix(layers)
            for hooks, vector in (
                (doc.user_hooks, _doc_vector),
                (doc.user_span_hooks, _span_vector),
                (doc.user_token_hooks, _token_vector),
            ):
                hooks["vector"] = vector
                hooks["has_vector"] = _has_vector
                hooks["similarity"] = _cosine_similarity

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
            outputs = self.frozen_cache.get_or_compute(docs, self.predict)
            for listener in self.listeners:
                listener.receive(batch_id, outputs, no_backprop)
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
        bilm_path: str | Path | None = None,
    ) -> None:
        """Load the pretrained biLM at `bilm_path` (a directory written by
        `elmo-spacy pretrain`); without one, build a randomly initialised biLM
        from the model's `bilm` settings and a vocabulary of the example docs."""
        if bilm_path is not None:
            set_bilm(self.model, load_bilm(bilm_path, with_softmax=False))
        else:
            docs = [eg.reference for eg in islice(get_examples(), 1000)]
            self.model.initialize(X=docs)
        self._bilm_changed()

    # -- serialisation: the biLM directory format, never pickle ----------------

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> None:
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        srsly.write_json(path / "cfg", self.cfg)
        save_bilm(self._require_bilm(), path / "bilm")

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = tuple()) -> "Elmo":
        path = ensure_path(path)
        if (path / "cfg").exists():
            self.cfg.update(srsly.read_json(path / "cfg"))
        set_bilm(self.model, load_bilm(path / "bilm", with_softmax=False))
        self._bilm_changed()
        return self

    def to_bytes(self, *, exclude: Iterable[str] = tuple()) -> bytes:
        return srsly.msgpack_dumps({"cfg": self.cfg, "bilm": bilm_to_bytes(self._require_bilm())})

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = tuple()) -> "Elmo":
        msg = srsly.msgpack_loads(bytes_data)
        self.cfg.update(msg["cfg"])
        set_bilm(self.model, bilm_from_bytes(msg["bilm"], with_softmax=False))
        self._bilm_changed()
        return self

    def _bilm_changed(self) -> None:
        self.frozen_cache.clear()
        for listener in self.listeners:
            self._link(listener)

    def _require_bilm(self):
        bilm = get_bilm(self.model)
        if bilm is None:
            raise ValueError(f"The '{self.name}' pipe has no biLM to save: initialize it first.")
        return bilm


def install_extensions() -> None:
    """Register `doc._.elmo`, `span._.elmo` and `token._.elmo` (once)."""
    if not Doc.has_extension("elmo"):
        Doc.set_extension("elmo", default=None)
    if not Span.has_extension("elmo"):
        Span.set_extension("elmo", getter=_span_layers)
    if not Token.has_extension("elmo"):
        Token.set_extension("elmo", getter=_token_layers)


def _span_layers(span: Span) -> numpy.ndarray | None:
    layers = span.doc._.elmo
    return None if layers is None else layers[:, span.start : span.end]


def _token_layers(token: Token) -> numpy.ndarray | None:
    layers = token.doc._.elmo
    return None if layers is None else layers[:, token.i]


def default_mix(layers: numpy.ndarray) -> numpy.ndarray:
    """The default mix behind doc.tensor and the .vector hooks: the mean of the
    L + 1 layers. (L + 1, n, width) -> (n, width)."""
    return layers.mean(axis=0)


def _token_vector(token: Token) -> numpy.ndarray:
    return default_mix(token.doc._.elmo[:, token.i : token.i + 1])[0]


def _span_vector(span: Span) -> numpy.ndarray:
    return _mean_rows(default_mix(span._.elmo))


def _doc_vector(doc: Doc) -> numpy.ndarray:
    return _mean_rows(default_mix(doc._.elmo))


def _mean_rows(rows: numpy.ndarray) -> numpy.ndarray:
    return rows.mean(axis=0) if len(rows) else numpy.zeros(rows.shape[1], dtype="float32")


def _has_vector(obj) -> bool:
    return True


def _cosine_similarity(obj, other) -> float:
    """Cosine of the two objects' vectors (0.0 if either is all zeros)."""
    a, b = obj.vector, other.vector
    norms = float(numpy.linalg.norm(a) * numpy.linalg.norm(b))
    return float(numpy.dot(a, b) / norms) if norms else 0.0
