"""ELMo vectors without a spaCy pipeline: `Embedder`, the Python API behind
`elmo-spacy embed` (the successor of AllenNLP's `ElmoEmbedder`)."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy
import torch

from .bilm import BiLM, load_bilm
from .bilm.formats.locate import BiLMPath
from .bilm.inputs.batch import length_runs
from .bilm.inputs.tokenization import Tokenization
from .bilm.model import States
from .bilm.runner import Runner, RunSettings
from .bilm.runtime.devices import resolve_device
from .errors import ElmoSpacyError


class Embedder:
    """Per-layer ELMo vectors of tokenised sentences.

    Like AllenNLP's `ElmoEmbedder`, but deterministic: every sentence starts
    from the same LSTM state (`run.state`), so the same sentence always gets the
    same vectors, whatever else is embedded with it and in whatever order.
    It runs the same code as the `elmo` pipe, so `Embedder(...).embed([tokens])`
    equals the pipe's `doc._.elmo` for a doc of those tokens (same run
    settings).

    path: a biLM in any format `elmo_spacy.bilm.load_bilm` reads: a path,
        or a bilm-tf model's two files as a pair, `(options_json,
        weights_hdf5)`, of any names in any folders (what AllenNLP's
        `ElmoEmbedder(options_file, weight_file)` took); or a `BiLM`.
    run: how the biLM runs, an `elmo_spacy.bilm.runner.RunSettings` (layers,
        state, warmup, precision, max_batch_tokens, window, window_overlap);
        keywords set its fields, over `run`'s where both are given:
        `Embedder(path, state="primed", layers=[-1])`. Where no precision is
        given, a `BiLM` keeps its own (a path loads in float32).
    device: where the biLM runs ("cpu", "cuda", "cuda:1", a torch.device).

    A `Runner` runs the biLM with the settings, as in the `elmo` pipe's model.
    """

    def __init__(
        self,
        path: BiLMPath | BiLM,
        run: RunSettings | None = None,
        *,
        device: str | torch.device = "cpu",
        **settings: Any,
    ) -> None:
        if settings.get("precision", "") is None:  # as not given
            del settings["precision"]
        own_precision = run is None and "precision" not in settings
        run = replace(run or RunSettings(), **settings)  # checked before any file is read
        bilm = path if isinstance(path, BiLM) else load_bilm(path, with_softmax=False)
        if own_precision:
            run = replace(run, precision=bilm.precision)
        self.device = resolve_device(device)
        self.runner = Runner(bilm.to(self.device), run)

    @property
    def bilm(self) -> BiLM:
        return self.runner.bilm

    @property
    def n_layers(self) -> int:
        """Layers of each output: len(layers), or L + 1 for all."""
        return self.runner.n_layers

    @property
    def width(self) -> int:
        """Width D of every layer: 2P, [forward; backward]."""
        return self.runner.width

    def embed(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[numpy.ndarray]:
        """One float32 array (n_layers, n, D) per sentence of n tokens, in the
        order given; an empty sentence gives (n_layers, 0, D). Batched by
        length inside. `progress` is called with the tokens of each batch run."""
        return self.runner.embed(_check_sentences(sentences), progress)

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
        `block_tokens` padded tokens (sentences x the longest; default 16 x
        max_batch_tokens; a longer sentence is a block alone), and each
        block's vectors are yielded once
        it has run. Indices come shortest sentence first, not in input order."""
        sentences = _check_sentences(sentences)
        limit = block_tokens or 16 * self.runner.settings.max_batch_tokens
        order = numpy.argsort([len(s) for s in sentences], kind="stable")
        bounds = length_runs(numpy.array([len(sentences[i]) for i in order]), limit)
        for block in (order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])):
            outputs = self.embed([sentences[i] for i in block], progress=progress)
            yield from zip(block, outputs)

    @property
    def tokenization(self) -> Tokenization | None:
        """How the biLM's own text was cut into tokens (None where unknown)."""
        return self.bilm.tokenization

    def tokenize(self, texts: Iterable[str]) -> list[list[str]]:
        """Texts cut into tokens as the biLM's own text was (see
        `tokenizer_for`): `embedder.embed(embedder.tokenize(texts))`."""
        return tokenizer_for(self.bilm.tokenization)(texts)

    def initial_states(self) -> States | None:
        """The state every sentence starts from: None (zeros), or the primed
        state, per direction and layer (h (1, P), c (1, H))."""
        return self.runner.initial_states()


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


def tokenizer_for(tokenization: Tokenization | None) -> Callable[[Iterable[str]], list[list[str]]]:
    """A function texts -> token lists that cuts text as `tokenization` says:
    spaCy's tokenizer for its language, or white space (also where the
    tokenisation is unknown)."""
    if tokenization is None or tokenization.tokenizer == "whitespace":
        return lambda texts: [text.split() for text in texts]
    from .tokenizer import blank

    tokenizer = blank(tokenization.lang, str(tokenization)).tokenizer
    return lambda texts: [[t.text for t in doc] for doc in tokenizer.pipe(texts)]


# How `shape_vectors` gives a sentence's vectors (`elmo-spacy embed --all/--top/--average`).
OUTPUTS = ("all", "top", "average")


def shape_vectors(layers: numpy.ndarray, output: str) -> numpy.ndarray:
    """One sentence's vectors as `output` asks: "all" keeps the
    (n_layers, n, D) layers, "top" is the last kept layer (n, D), "average"
    the mean of the kept layers (n, D). `elmo-spacy embed --all/--top/--average`."""
    if output == "top":
        return layers[-1]
    if output == "average":
        return layers.mean(axis=0)  # numpy.average (AllenNLP's) fails on 0 tokens
    return layers
