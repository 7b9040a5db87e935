"""Running a biLM over tokenised sentences: `RunSettings` (checked once) and
the `Runner` that holds a biLM with them, which the `elmo` pipe's model,
`Embedder` and `elmo-spacy embed` all run a biLM through."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy
import torch

from ..errors import ElmoSpacyError
from .bilm import BiLM
from .inputs.batch import length_runs
from .model.network import States
from .runtime.precision import check_precision

# state = "primed"'s default warm-up: news English (as the published models'
# 1B Word Benchmark), tokenised as spaCy's English tokenizer does.
DEFAULT_WARMUP: tuple[str, ...] = (
    "The city council met on Tuesday evening to discuss the new budget .",
    "Officials said the plan would add two bus lines and repair several roads "
    "before the end of the year .",
    "Some residents welcomed the proposal , while others asked how it would be paid for .",
    "The council is expected to vote on the budget next month .",
    "Meanwhile , shares in the region 's largest employer rose 3 percent after "
    "it reported higher profits .",
)
STATES = ("zero", "primed")


@dataclass(frozen=True)
class RunSettings:
    """How a biLM runs over sentences, each setting documented, defaulted and
    checked here: the `elmo` pipe model's `run` block (`elmo_spacy.RunSettings.v1`),
    `Embedder`'s `run` or keywords, `elmo-spacy embed`'s options (docs/pipes.md).

    layers: the layers handed out, in this order, as indices into 0..L (0 = the
        token encoding; negative ones count from the top); None: all L + 1.
    state: the LSTM state every sentence starts from: "zero", or "primed" (the
        state reading `warmup` leaves, computed once per version of the weights).
    warmup: the warm-up sentences of "primed", each a string of space-separated
        tokens or a list of tokens; None: `DEFAULT_WARMUP`.
    precision: "float32", "bfloat16", "float16" or "auto" (docs/precision-and-gpus.md);
        outputs are float32 either way.
    max_batch_tokens: padded tokens per chunk of length-sorted windows, at prediction.
    window, window_overlap: a sentence longer than `window` tokens runs in pieces
        overlapping by 2 * `window_overlap` (see `windows`), in training as at
        prediction, so memory stays bounded.
    """

    layers: Sequence[int] | None = None
    state: str = "zero"
    warmup: Sequence[str | Sequence[str]] | None = None
    precision: str = "float32"
    max_batch_tokens: int = 4096
    window: int = 1024
    window_overlap: int = 64

    def __post_init__(self) -> None:
        if self.layers is not None:
            layers = tuple(int(i) for i in self.layers)
            if not layers:
                raise ElmoSpacyError(
                    "run.layers is empty: name at least one layer, or null for all"
                )
            object.__setattr__(self, "layers", layers)
        if self.state not in STATES:
            raise ElmoSpacyError(f"run.state = {self.state!r}: use one of {STATES}")
        if self.warmup is not None:
            object.__setattr__(self, "warmup", warmup_tokens(self.warmup))
        check_precision(self.precision, "run.precision")
        if self.max_batch_tokens < 1:
            raise ElmoSpacyError(f"run.max_batch_tokens = {self.max_batch_tokens}: give at least 1")
        if not 0 <= 2 * self.window_overlap < self.window:
            raise ElmoSpacyError(
                f"run.window = {self.window}, window_overlap = {self.window_overlap}: "
                "need 0 <= 2 * window_overlap < window."
            )


class Runner:
    """Runs `bilm` over tokenised sentences with `settings`: `embed` predicts;
    `windows` and `initial_states` serve a training step (the thinc model's).
    Setting `bilm` (None until one is there) puts it in eval mode, sets its
    precision and resolves `layers` against its depth."""

    def __init__(self, bilm: BiLM | None, settings: RunSettings) -> None:
        self.settings = settings
        self.layers: list[int] | None = None  # `settings.layers` resolved against the biLM
        self.bilm = bilm

    @property
    def bilm(self) -> BiLM | None:
        return self._bilm

    @bilm.setter
    def bilm(self, bilm: BiLM | None) -> None:
        self._bilm = bilm
        if bilm is not None:
            bilm.eval()
            bilm.set_precision(self.settings.precision, "run.precision")
            self.layers = resolve_layers(self.settings.layers, bilm.config.n_output_layers)

    def require_bilm(self) -> BiLM:
        if self._bilm is None:
            raise ElmoSpacyError(
                "This biLM runner has no biLM yet: initialise the pipeline (with a bilm_path) "
                "or load a trained one."
            )
        return self._bilm

    @property
    def n_layers(self) -> int:
        """Layers of each output: len(layers), or L + 1 for all."""
        bilm = self.require_bilm()
        return bilm.config.n_output_layers if self.layers is None else len(self.layers)

    @property
    def width(self) -> int:
        """Width of every layer: 2P, [forward; backward]."""
        return self.require_bilm().config.width

    def initial_states(self) -> States | None:
        """None (zeros), or the primed state (`BiLM.primed_states`)."""
        if self.settings.state == "zero":
            return None
        warmup = self.settings.warmup
        if warmup is None:
            warmup = tuple(tuple(sentence.split()) for sentence in DEFAULT_WARMUP)
        return self.require_bilm().primed_states(warmup)

    def windows(self, lengths: Sequence[int]) -> "Windows":
        """The windows of sentences of these lengths."""
        return Windows.of(lengths, self.settings.window, self.settings.window_overlap)

    def select(self, layers: torch.Tensor) -> torch.Tensor:
        """The kept `layers` of a biLM output (L + 1, ...) -> (n_layers, ...)."""
        return layers if self.layers is None else layers[self.layers]

    def embed(
        self, sentences: Sequence[Sequence[str]], progress: Callable[[int], None] | None = None
    ) -> list[numpy.ndarray]:
        """One float32 array (n_layers, n, width) per sentence of n tokens, in
        order; windows sorted by length run in chunks of `max_batch_tokens`.
        `progress` gets the tokens of each chunk once it has run."""
        bilm = self.require_bilm()
        if bilm.stateful:
            raise ElmoSpacyError(
                "Inference runs the biLM stateless (sentences are batched by length, so a "
                "carried state would join unrelated sentences): set bilm.stateful = False, or "
                "use state = 'primed' for a state that every sentence starts from"
            )
        bilm.eval()
        initial_states = self.initial_states()
        windows = self.windows([len(s) for s in sentences])
        outputs = windows.empty_outputs(self.n_layers, self.width)
        lengths = windows.window_lengths()
        order = numpy.argsort(lengths, kind="stable")  # shortest window first
        bounds = length_runs(lengths[order], self.settings.max_batch_tokens)
        for chunk in (order[a:b] for a, b in zip(bounds[:-1], bounds[1:])):
            tokens = windows.window_tokens(sentences, chunk)
            with torch.inference_mode():
                layers = self.select(bilm(bilm.batch(tokens), initial_states))
                array = layers.float().cpu().numpy()  # (n_layers, B, T, 2P)
            windows.gather(array, outputs, chunk)
            if progress is not None:
                progress(sum(len(t) for t in tokens))
        return outputs


@dataclass(frozen=True)
class Windows:
    """The windows that cover a batch of sentences. Row r of `pieces` is
    (sentence, first, last, keep_first, keep_last): run tokens [first,
    last) of the sentence, keep [keep_first, keep_last)."""

    lengths: tuple[int, ...]
    pieces: tuple[tuple[int, int, int, int, int], ...]

    @classmethod
    def of(cls, lengths: Sequence[int], window: int, overlap: int) -> "Windows":
        pieces = tuple(
            (i, *span) for i, n in enumerate(lengths) for span in windows(n, window, overlap)
        )
        return cls(tuple(int(n) for n in lengths), pieces)

    def window_lengths(self) -> numpy.ndarray:
        return numpy.array([last - first for _, first, last, _, _ in self.pieces], dtype="int64")

    def window_tokens(
        self, sentences: Sequence[Sequence[str]], rows: Sequence[int] | None = None
    ) -> list[Sequence[str]]:
        """The tokens of each window (of `rows`, default all, in that order)."""
        rows = range(len(self.pieces)) if rows is None else rows
        return [sentences[i][first:last] for i, first, last, _, _ in (self.pieces[r] for r in rows)]

    def empty_outputs(self, n_layers: int, width: int, xp=numpy) -> list:
        """Zeroed float32 (n_layers, n, width) arrays, one per sentence."""
        return [xp.zeros((n_layers, n, width), dtype="float32") for n in self.lengths]

    def gather(self, array, outputs: list, rows: Sequence[int] | None = None) -> None:
        """Each window's kept part of `array` (n_layers, len(rows), T, width)
        into its sentence's output."""
        rows = range(len(self.pieces)) if rows is None else rows
        for j, r in enumerate(rows):
            i, first, _, keep_first, keep_last = self.pieces[r]
            outputs[i][:, keep_first:keep_last] = array[
                :, j, keep_first - first : keep_last - first
            ]

    def scatter(self, d_outputs: Sequence, d_array: torch.Tensor, to_torch: Callable) -> None:
        """`gather`'s reverse for gradients, into the zeroed (n_layers, rows,
        T, width) `d_array`; `to_torch` makes a slice of `d_outputs` a tensor
        on its device."""
        for r, (i, first, _, keep_first, keep_last) in enumerate(self.pieces):
            d_array[:, r, keep_first - first : keep_last - first] = to_torch(
                d_outputs[i][:, keep_first:keep_last]
            )


def windows(n_tokens: int, window: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """Pieces (first, last, keep_first, keep_last) of a sentence of n_tokens,
    as in `Windows.pieces`: the kept parts tile it, each kept token with at
    least `overlap` tokens of context each side (or the sentence's edge)."""
    if n_tokens <= window:
        return [(0, n_tokens, 0, n_tokens)] if n_tokens else []
    step = window - 2 * overlap
    return [
        (
            max(0, keep - overlap),
            min(n_tokens, keep + step + overlap),
            keep,
            min(n_tokens, keep + step),
        )
        for keep in range(0, n_tokens, step)
    ]


def warmup_tokens(
    warmup: Sequence[str | Sequence[str]], where: str = "run.warmup"
) -> tuple[tuple[str, ...], ...]:
    """Warm-up sentences (strings of space-separated tokens, or lists of
    tokens) as tuples of tokens, empty ones dropped."""
    if isinstance(warmup, str) or not all(
        isinstance(s, str) or all(isinstance(t, str) for t in s) for s in warmup
    ):
        raise ElmoSpacyError(
            f"{where} must be a list of sentences (strings of tokens separated by spaces, "
            f"or lists of tokens); got {warmup!r:.80}"
        )
    tokens = tuple(tuple(s.split() if isinstance(s, str) else s) for s in warmup)
    tokens = tuple(t for t in tokens if t)
    if not tokens:
        raise ElmoSpacyError(
            f"{where} holds no token: give at least one sentence, or null for the default warm-up"
        )
    return tokens


def resolve_layers(
    layers: Sequence[int] | None, n_layers: int, where: str = "run.layers"
) -> list[int] | None:
    """Layer indices into 0..n_layers - 1 (negative ones count from the top),
    checked: each in range, none twice. None (all layers) stays None."""
    if layers is None:
        return None
    layers = [int(i) for i in layers]
    if not all(-n_layers <= i < n_layers for i in layers):
        raise ElmoSpacyError(
            f"{where} = {layers}, but the biLM has {n_layers} layers "
            f"(0 = token encoding, 1..{n_layers - 1} = LSTM layers)"
        )
    resolved = [i % n_layers for i in layers]
    if len(set(resolved)) < len(resolved):
        raise ElmoSpacyError(f"{where} = {layers} names a layer twice")
    return resolved
