"""ELMo vectors without a spaCy pipeline: `Embedder`, the Python API behind
`elmo-spacy embed` (the successor of AllenNLP's `ElmoEmbedder`)."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

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
    """Per-layer ELMo vectors of tokenised sentences, the `elmo` pipe's
    `doc._.elmo` under the same run settings (docs/embedding.md).

    path: anything `load_bilm` reads, or a `BiLM`.
    run: a `RunSettings`; keywords set its fields, over `run`'s. Without a
        precision, a `BiLM` keeps its own (a path loads in float32).
    """

    def __init__(
        self,
        path: BiLMPath | BiLM,
        run: RunSettings | None = None,
        *,
        device: str | torch.device = "cpu",
        **settings: Any,
    ) -> None:
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
        return self.runner.n_layers

    @property
    def width(self) -> int:
        return self.runner.width

    def embed(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[numpy.ndarray]:
        """One float32 array (n_layers, n, D) per sentence of n tokens, in order.
        `progress` is called with the tokens of each batch run."""
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
        """(index, (n_layers, n, D) array) for every sentence, shortest first, a
        block of at most `block_tokens` padded tokens (default 16 x
        max_batch_tokens) at a time, for corpora that do not fit in memory."""
        sentences = _check_sentences(sentences)
        limit = block_tokens or 16 * self.runner.settings.max_batch_tokens
        order = numpy.argsort([len(s) for s in sentences], kind="stable")
        bounds = length_runs(numpy.array([len(sentences[i]) for i in order]), limit)
        for block in (order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])):
            outputs = self.embed([sentences[i] for i in block], progress=progress)
            yield from zip(block, outputs)

    @property
    def tokenization(self) -> Tokenization | None:
        return self.bilm.tokenization

    def tokenize(self, texts: Iterable[str]) -> list[list[str]]:
        """Texts cut into tokens as the biLM's own text was."""
        return tokenizer_for(self.bilm.tokenization)(texts)

    def initial_states(self) -> States | None:
        """The state every sentence starts from: None (zeros), or the primed one."""
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
    """texts -> token lists, cut by spaCy's tokenizer for `tokenization`'s
    language, or on white space (also where it is None)."""
    if tokenization is None or tokenization.tokenizer == "whitespace":
        return lambda texts: [text.split() for text in texts]
    from .tokenizer import blank

    tokenizer = blank(tokenization.lang, str(tokenization)).tokenizer
    return lambda texts: [[t.text for t in doc] for doc in tokenizer.pipe(texts)]


OUTPUTS = ("all", "top", "average")  # `shape_vectors`' (`elmo-spacy embed --all/--top/--average`)


def shape_vectors(layers: numpy.ndarray, output: str) -> numpy.ndarray:
    """(n_layers, n, D) layers as `output` asks: "all" as they are, "top" the
    last (n, D), "average" their mean (n, D)."""
    if output == "top":
        return layers[-1]
    if output == "average":
        return layers.mean(axis=0)  # numpy.average (AllenNLP's) fails on 0 tokens
    return layers


def read_lines(file: IO[str] | str | Path) -> list[str]:
    """A UTF-8 text file's lines (a path, or an open file, closed when read),
    stripped as AllenNLP strips them; an empty line stays."""
    try:
        with open(file, encoding="utf-8") if isinstance(file, (str, Path)) else file as lines:
            return [line.strip() for line in lines]
    except UnicodeDecodeError as err:
        name = getattr(file, "name", file)
        raise ElmoSpacyError(f"{name} is not UTF-8 text ({err}): convert it to UTF-8") from err
