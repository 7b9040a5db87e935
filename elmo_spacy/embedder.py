"""ELMo vectors without a spaCy pipeline: `Embedder`, the Python API behind
`elmo-spacy embed` (the successor of AllenNLP's `ElmoEmbedder`)."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy
import torch

from .bilm.inference import (
    check_state,
    check_window,
    embed_tokens,
    initial_states_for,
    resolve_layers,
)
from .bilm.io import load_bilm
from .bilm.model import BiLM
from .bilm.precision import check_precision, resolve_precision
from .bilm.states import States
from .errors import ElmoSpacyError


class Embedder:
    """Per-layer ELMo vectors of tokenised sentences.

    Like AllenNLP's `ElmoEmbedder`, but deterministic: every sentence starts
    from the same LSTM state (`state`), so the same sentence always gets the
    same vectors, whatever else is embedded with it and in whatever order.
    It runs the same code as the `elmo` pipe, so `Embedder(...).embed([tokens])`
    equals the pipe's `doc._.elmo` for a doc of those tokens (same `layers`,
    `state` and windows).

    path: a biLM: a directory written by `elmo-spacy pretrain` or
        `convert-elmo`, a folder with a bilm-tf model (options.json +
        weights.hdf5), anything `elmo_spacy.bilm.load_bilm` reads; or a
        `BiLM` already loaded.
    layers: keep only these layers (indices into 0..L, negative ones from the
        top), in this order; None keeps all L + 1 (0 = the token encoding,
        1..L the biLSTM layers, each [forward; backward]).
    state: "zero" (every sentence starts from zero LSTM states) or "primed"
        (from the state that reading `warmup` leaves: closer to how the
        published ELMo models were trained, with the state carried across
        batches).
    warmup: the warm-up sentences of state = "primed", each a list of tokens
        or a string of space-separated tokens; None: the shipped default
        (`elmo_spacy.bilm.inference.DEFAULT_WARMUP`).
    max_batch_tokens: sentences are sorted by length and run in batches of
        at most this many padded tokens.
    window, window_overlap: a sentence longer than `window` tokens runs in
        overlapping pieces (see `elmo_spacy.bilm.inference.windows`).
    device: where the biLM runs ("cpu", "cuda", "cuda:1", a torch.device).
    precision: "float32" (conformant) or "bfloat16" (faster where the hardware
        multiplies in it; see `elmo_spacy.bilm.precision`); None (the
        default): float32 for a path, a `BiLM`'s own setting for a `BiLM`.
        The arrays handed back are float32 either way.
    """

    def __init__(
        self,
        path: str | Path | BiLM,
        *,
        layers: Sequence[int] | None = None,
        state: str = "zero",
        warmup: Sequence[str | Sequence[str]] | None = None,
        max_batch_tokens: int = 4096,
        window: int = 1024,
        window_overlap: int = 64,
        device: str | torch.device = "cpu",
        precision: str | None = None,
    ) -> None:
        where = "Embedder: precision"
        if precision is not None:
            check_precision(precision, where)
        check_state(state)
        check_window(window, window_overlap)
        if max_batch_tokens < 1:
            raise ElmoSpacyError(f"max_batch_tokens = {max_batch_tokens}: give at least 1")
        self.device = _device(device)
        bilm = path if isinstance(path, BiLM) else load_bilm(path, with_softmax=False)
        self.bilm = bilm.to(self.device).eval()
        if precision is not None:
            self.bilm.precision = resolve_precision(precision, self.device, where)
        self.layers = resolve_layers(layers, bilm.config.n_output_layers)
        self.state = state
        self.warmup = None if warmup is None else _warmup_tokens(warmup)
        self.max_batch_tokens = max_batch_tokens
        self.window = window
        self.window_overlap = window_overlap

    @property
    def n_layers(self) -> int:
        """Layers of each output: len(layers), or L + 1 for all."""
        return self.bilm.config.n_output_layers if self.layers is None else len(self.layers)

    @property
    def width(self) -> int:
        """Width D of every layer: 2P, [forward; backward]."""
        return self.bilm.config.width

    def embed(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[numpy.ndarray]:
        """One float32 array (n_layers, n, D) per sentence of n tokens, in the
        order given; an empty sentence gives (n_layers, 0, D). Batched by
        length inside. `progress` is called with the tokens of each batch run."""
        sentences = _check_sentences(sentences)
        outputs = embed_tokens(
            self.bilm,
            sentences,
            max_batch_tokens=self.max_batch_tokens,
            window=self.window,
            window_overlap=self.window_overlap,
            initial_states=self.initial_states(),
            progress=progress,
        )
        return outputs if self.layers is None else [output[self.layers] for output in outputs]

    def embed_sentence(self, tokens: Sequence[str]) -> numpy.ndarray:
        """(n_layers, n, D) float32 vectors of one tokenised sentence."""
        return self.embed([tokens])[0]

    def embed_iter(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        block_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, numpy.ndarray]]:
        """(index, (n_layers, n, D) array) for every sentence, a block of
        sentences at a time, for corpora whose vectors do not fit in memory:
        the sentences are sorted by length and cut into blocks of at most
        `block_tokens` tokens (default 16 x max_batch_tokens; a longer
        sentence is a block alone), and each block's vectors are yielded once
        it has run. Indices come shortest sentence first, not in input order."""
        sentences = _check_sentences(sentences)
        limit = block_tokens or 16 * self.max_batch_tokens
        for block in _blocks(sentences, limit):
            outputs = self.embed([sentences[i] for i in block], progress=progress)
            yield from zip(block, outputs)

    def initial_states(self) -> States | None:
        """The state every sentence starts from: None (zeros), or the primed
        state, per direction and layer (h (1, P), c (1, H))."""
        return initial_states_for(self.bilm, self.state, self.warmup)


def _blocks(sentences: Sequence[Sequence[str]], limit: int) -> Iterator[list[int]]:
    """Indices of the sentences sorted by length, cut into runs of at most
    `limit` tokens (at least one sentence each)."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    block: list[int] = []
    size = 0
    for i in order:
        if block and size + len(sentences[i]) > limit:
            yield block
            block, size = [], 0
        block.append(i)
        size += len(sentences[i])
    if block:
        yield block


def _check_sentences(sentences: Iterable[Sequence[str]]) -> list[Sequence[str]]:
    """The sentences as a list, refusing what is not a list of token lists."""
    if isinstance(sentences, str):
        raise ElmoSpacyError(
            "embed takes tokenised sentences (a list of lists of strings), not a string: "
            "use embed_sentence(text.split()) for one sentence"
        )
    sentences = list(sentences)
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, str) or not all(isinstance(t, str) for t in sentence):
            raise ElmoSpacyError(
                f"Sentence {i} is {sentence!r:.60}: give each sentence as a list of token "
                "strings (e.g. text.split())"
            )
    return sentences


def _warmup_tokens(warmup: Sequence[str | Sequence[str]]) -> list[list[str]]:
    if isinstance(warmup, str):
        raise ElmoSpacyError("warmup is a list of sentences, not one string: wrap it in a list")
    tokens = [s.split() if isinstance(s, str) else list(s) for s in warmup]
    tokens = [t for t in tokens if t]
    if not tokens:
        raise ElmoSpacyError("warmup holds no token: give at least one sentence, or None")
    return tokens


def _device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ElmoSpacyError(f"device = {device!r} is not a torch device ({err})") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ElmoSpacyError(
                f"device = {str(device)!r}, but torch finds no CUDA GPU: use 'cpu', or a torch "
                "build with CUDA on a machine with a GPU"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ElmoSpacyError(
                f"device = {str(device)!r}, but torch finds {torch.cuda.device_count()} GPU(s) "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
    return device
