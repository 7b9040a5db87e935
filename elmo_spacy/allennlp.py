"""AllenNLP's ELMo API (`allennlp.modules.elmo`, 0.9's `allennlp.commands.elmo`)
with AllenNLP's names, arguments and numbers, over this package's biLM.
docs/allennlp.md is the migration guide, name by name, and says what goes
beyond AllenNLP (other biLMs, `state`, `precision`, token lists as inputs).
"""

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import IO

import numpy
import torch
from torch import nn

from .bilm import BiLM, load_bilm
from .bilm.inputs.batch import BOS_TYPE, EOS_TYPE, TokenBatch
from .bilm.inputs.chars import BilmTfCharIds
from .bilm.model import States
from .bilm.runner import DEFAULT_WARMUP, warmup_tokens
from .embedder import OUTPUTS, read_lines, shape_vectors
from .errors import ElmoSpacyError
from .files import write_file
from .hdf5 import hdf5_keys, write_hdf5

STATES = ("carried", "zero", "primed")
DEFAULT_BATCH_SIZE = 64  # sentences a batch in ElmoEmbedder, as in AllenNLP

ModelFile = str | Path | BiLM | None
Tokens = Sequence[Sequence[str]]


class ConfigurationError(ElmoSpacyError):
    """A wrong argument, where AllenNLP raised its ConfigurationError."""


# -- character ids ---------------------------------------------------------------


class ELMoCharacterMapper:
    """AllenNLP's character ids of a token: bilm-tf's ids + 1, so that 0 pads
    whole tokens; `tokens_to_add` maps more tokens to one id each (below 256)."""

    max_word_length = 50
    beginning_of_sentence_character = 256
    end_of_sentence_character = 257
    beginning_of_word_character = 258
    end_of_word_character = 259
    padding_character = 260
    bos_token = "<S>"
    eos_token = "</S>"

    def __init__(self, tokens_to_add: dict[str, int] | None = None) -> None:
        self.tokens_to_add = tokens_to_add or {}

    def convert_word_to_char_ids(self, word: str) -> list[int]:
        if word in self.tokens_to_add:
            units = [self.tokens_to_add[word]]
        elif word == self.bos_token:
            units = [self.beginning_of_sentence_character]
        elif word == self.eos_token:
            units = [self.end_of_sentence_character]
        else:
            units = list(word.encode("utf-8", "ignore")[: self.max_word_length - 2])
        ids = [self.beginning_of_word_character, *units, self.end_of_word_character]
        ids += [self.padding_character] * (self.max_word_length - len(ids))
        return [i + 1 for i in ids]


def batch_to_ids(batch: Tokens) -> torch.Tensor:
    """(B, T, 50) int64 character ids of B tokenised sentences, T the longest,
    shorter ones padded with rows of 0."""
    _refuse_strings(batch)
    mapper = ELMoCharacterMapper()
    known: dict[str, list[int]] = {}
    steps = max((len(sentence) for sentence in batch), default=0)
    ids = numpy.zeros((len(batch), steps, mapper.max_word_length), dtype="int64")
    for row, sentence in enumerate(batch):
        for position, token in enumerate(sentence):
            if token not in known:
                known[token] = mapper.convert_word_to_char_ids(token)
            ids[row, position] = known[token]
    return torch.from_numpy(ids)


def _refuse_strings(batch: Tokens) -> None:
    for row, sentence in enumerate([batch] if isinstance(batch, str) else batch):
        if isinstance(sentence, str):
            raise ConfigurationError(
                f"Sentence {row} is a string ({sentence!r:.40}): give each sentence as a list "
                "of tokens, e.g. text.split()"
            )


def remove_sentence_boundaries(
    tensor: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T + 2, D) and its (B, T + 2) mask -> (B, T, D) without <S> and </S>,
    zero past each sentence, and its (B, T) bool mask."""
    inner = mask[:, 2:].bool()
    return tensor[:, 1:-1] * inner[:, :, None], inner


def token_batch(bilm: BiLM, inputs: torch.Tensor | Tokens) -> TokenBatch:
    """The biLM's TokenBatch of character ids (B, T, 50) or of B token lists.
    Ids go to a bilm-tf biLM as they are, each distinct row a type; another
    biLM reads the tokens they stand for."""
    if not isinstance(inputs, torch.Tensor):
        return bilm.batch([list(sentence) for sentence in inputs])
    if inputs.dim() != 3:
        raise ConfigurationError(
            f"Character ids of shape {tuple(inputs.shape)}: give (batch, tokens, 50), as "
            "batch_to_ids makes them (Elmo takes more leading dimensions)"
        )
    chars = bilm.chars
    if isinstance(chars, BilmTfCharIds) and inputs.shape[-1] != chars.max_chars:
        raise ConfigurationError(
            f"Character ids of {inputs.shape[-1]} a token, but this biLM reads "
            f"{chars.max_chars} (its max_characters_per_token)"
        )
    inputs = inputs.detach().to("cpu", torch.int64)
    present = (inputs > 0).any(-1)  # a token: any id but 0
    lengths = present.sum(-1)
    leading = torch.arange(inputs.shape[1])[None, :] < lengths[:, None]
    if not torch.equal(present, leading):
        row = int((present != leading).any(-1).nonzero()[0])
        raise ConfigurationError(
            f"Row {row} of the character ids has a padding token (all 0) before a real one: "
            "the tokens of a sentence come first, then the padding (as batch_to_ids makes them)"
        )
    rows, inverse = torch.unique(inputs[present] - 1, dim=0, return_inverse=True)  # bilm-tf's
    if not isinstance(chars, BilmTfCharIds):
        tokens = [_token_of(row) for row in rows.tolist()]
        return bilm.batch(
            [[tokens[k] for k in row.tolist()] for row in inverse.split(lengths.tolist())]
        )
    boundaries, boundary_chars = chars.char_ids([])  # <S>, </S>: 3 ids each
    columns = torch.arange(rows.shape[1])
    n_chars = torch.where(rows != chars.padding, columns + 1, 0).amax(-1)  # marks included
    longest = max([3, *n_chars.tolist()])
    width = min(chars.max_chars, longest + chars.min_width - 1)  # as CharIds.char_ids cuts
    type_inputs = torch.full((2 + len(rows), width), chars.padding, dtype=torch.int64)
    type_inputs[:2, : boundaries.shape[1]] = boundaries[:, :width]
    type_inputs[2:] = rows[:, :width]
    index = torch.full((len(inputs), inputs.shape[1] + 2), EOS_TYPE, dtype=torch.int64)
    index[:, 0] = BOS_TYPE
    inner = index[:, 1:-1]
    inner[present] = inverse + 2
    return TokenBatch(
        type_inputs,
        torch.cat([boundary_chars, n_chars]),
        torch.zeros(2 + len(rows), dtype=torch.int64),
        index,
        lengths,
    )


def _token_of(ids: list[int]) -> str:
    """The token whose bilm-tf character ids (ELMoCharacterMapper's - 1) these are."""
    mapper = ELMoCharacterMapper
    if ids[0] == mapper.beginning_of_word_character and mapper.end_of_word_character in ids:
        end = ids.index(mapper.end_of_word_character)
        units = ids[1:end]
        if all(i == mapper.padding_character for i in ids[end + 1 :]):
            if units == [mapper.beginning_of_sentence_character]:
                return mapper.bos_token
            if units == [mapper.end_of_sentence_character]:
                return mapper.eos_token
            with contextlib.suppress(ValueError):  # UnicodeDecodeError is one
                return bytes(units).decode("utf-8")
    raise ConfigurationError(
        f"Character ids {ids[:12]}... are no token's: this biLM reads tokens in its own "
        "scheme, so it takes the token lists themselves (elmo(sentences) in place of "
        "elmo(batch_to_ids(sentences)))"
    )


# -- the biLM ----------------------------------------------------------------------


def _load(options_file: ModelFile, weight_file: str | Path | None) -> BiLM:
    """The biLM of AllenNLP's (options_file, weight_file) pair, or of any
    path `load_bilm` reads (weight_file None), or a BiLM as it is."""
    if isinstance(options_file, BiLM):
        return options_file
    if options_file is None:
        raise ConfigurationError(
            "Give the model: options_file and weight_file (a bilm-tf model's two files), or a "
            "folder that load_bilm reads as options_file with weight_file=None"
        )
    for name in (options_file, weight_file):
        if name is not None and str(name).startswith(("http://", "https://", "s3://")):
            raise ConfigurationError(
                f"{name} is a URL: download the file once and give its local path (nothing is "
                "downloaded at run time)"
            )
    path = options_file if weight_file is None else (options_file, weight_file)
    return load_bilm(path, with_softmax=False)


def _frozen_scope(bilm: BiLM, *more: torch.Tensor | None) -> contextlib.AbstractContextManager:
    """torch.no_grad() where neither the biLM's parameters nor `more` train,
    so that the biLM runs as at inference (its caches kept)."""
    trains = any(p.requires_grad for p in bilm.parameters()) or any(
        t is not None and t.requires_grad for t in more
    )
    return contextlib.nullcontext() if trains else torch.no_grad()


class _OnBiLM(nn.Module):
    """A module over a biLM, which runs alike in training (ELMo's biLM has no
    dropout). precision: None keeps a given BiLM's."""

    def __init__(
        self,
        options_file: ModelFile = None,
        weight_file: str | Path | None = None,
        requires_grad: bool = False,
        *,
        precision: str | None = None,
    ) -> None:
        super().__init__()
        self.bilm = _load(options_file, weight_file)
        self.bilm.eval()
        self.bilm.requires_grad_(requires_grad)
        if precision is not None:
            self.bilm.precision = precision

    def train(self, mode: bool = True) -> "_OnBiLM":
        super().train(mode)
        self.bilm.eval()
        return self


class ElmoCharacterEncoder(_OnBiLM):
    """AllenNLP's `_ElmoCharacterEncoder`: `forward(inputs)`, character ids
    (B, T, 50) or B token lists -> {"token_embedding": (B, T + 2, P), "mask":
    (B, T + 2) bool}, framed by <S> and </S>, zero where the mask is False."""

    def get_output_dim(self) -> int:
        return self.bilm.config.projection_dim

    def forward(self, inputs: torch.Tensor | Tokens) -> dict[str, torch.Tensor]:
        batch = token_batch(self.bilm, inputs)
        with _frozen_scope(self.bilm):
            embedding = self.bilm.token_encodings(batch)
        return {"token_embedding": embedding, "mask": batch.mask(True).to(embedding.device)}

    @classmethod
    def of(cls, bilm: BiLM) -> "ElmoCharacterEncoder":
        """The encoder of `bilm` as it is (its settings untouched)."""
        encoder = cls.__new__(cls)
        nn.Module.__init__(encoder)
        encoder.bilm = bilm
        return encoder


class ElmoBiLm(_OnBiLM):
    """AllenNLP's `_ElmoBiLm`: `forward(inputs, word_inputs=None)`, character
    ids (B, T, 50) or B token lists -> {"activations": L + 1 tensors
    (B, T + 2, 2P) (layer 0 [x; x], then [forward; backward]), "mask":
    (B, T + 2) bool}, framed by <S> and </S>, zero where the mask is False.
    `word_inputs` (B, T) index `vocab_to_cache` (0 pads); a batch with an id
    outside it runs the char CNN. `state`, `warmup`, `precision`: see
    docs/allennlp.md. Calls run one at a time (a lock), as the carried state
    is the module's.
    """

    def __init__(
        self,
        options_file: ModelFile = None,
        weight_file: str | Path | None = None,
        requires_grad: bool = False,
        vocab_to_cache: Sequence[str] | None = None,
        *,
        state: str = "carried",
        warmup: Sequence[str | Sequence[str]] | None = None,
        precision: str | None = None,
    ) -> None:
        if state not in STATES:
            raise ConfigurationError(f"state = {state!r}: use one of {', '.join(STATES)}")
        super().__init__(options_file, weight_file, requires_grad, precision=precision)
        self.bilm.stateful = state == "carried"
        self.bilm.reset_state()
        self.state = state
        self.warmup = warmup_tokens(warmup or DEFAULT_WARMUP, "warmup")
        self._requires_grad = requires_grad
        self._word_embedding: nn.Embedding | None = None
        self._lock = threading.Lock()
        if vocab_to_cache:
            self.create_cached_cnn_embeddings(list(vocab_to_cache))

    @property
    def num_layers(self) -> int:
        """L + 1: the token encoding and each LSTM layer."""
        return self.bilm.config.n_output_layers

    def get_output_dim(self) -> int:
        return self.bilm.config.width

    @property
    def _token_embedder(self) -> ElmoCharacterEncoder:
        return ElmoCharacterEncoder.of(self.bilm)

    @property
    def _elmo_lstm(self) -> "ElmoBiLm":
        """What holds the carried state: `_elmo_lstm.reset_states()`, as in AllenNLP."""
        return self

    def reset_states(self) -> None:
        """Forget the carried state: the next batch starts from zeros."""
        self.bilm.reset_state()

    def create_cached_cnn_embeddings(self, tokens: list[str]) -> None:
        """Compute the token encodings of `tokens` once: `word_inputs` id i
        (0 pads) looks up tokens[i]'s; they train with `requires_grad`."""
        with torch.no_grad():
            encoded = [
                self.bilm.token_encodings(self.bilm.batch([tokens[i : i + 1024]]))[0]
                for i in range(0, max(len(tokens), 1), 1024)
            ]
        boundaries = encoded[0][[0, -1]]  # <S>, </S>
        table = torch.cat([e[1:-1] for e in encoded]).float()
        self._word_embedding = nn.Embedding(len(tokens), table.shape[1], padding_idx=0)
        self._word_embedding.weight = nn.Parameter(table, requires_grad=self._requires_grad)
        self.register_buffer("_boundary_embeddings", boundaries.float(), persistent=False)

    def forward(
        self, inputs: torch.Tensor | Tokens, word_inputs: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        with self._lock:
            batch, types = self._batch(inputs, word_inputs)
            with _frozen_scope(self.bilm, types):
                layers = self.bilm(batch, self._initial_states(), boundaries=True, types=types)
        mask = batch.mask(boundaries=True).to(layers.device)
        return {"activations": list(layers.unbind(0)), "mask": mask}

    def _batch(
        self, inputs: torch.Tensor | Tokens, word_inputs: torch.Tensor | None
    ) -> tuple[TokenBatch, torch.Tensor | None]:
        """The batch to run, and the (U, P) encodings of its types where the
        word cache gives them."""
        table = self._word_embedding
        if table is None or word_inputs is None:
            return token_batch(self.bilm, inputs), None
        word_inputs = word_inputs.detach().to("cpu", torch.int64)
        if bool(((word_inputs < 0) | (word_inputs >= table.num_embeddings)).any()):
            return token_batch(self.bilm, inputs), None  # a word the cache lacks
        present = word_inputs > 0
        lengths = present.sum(-1)
        index = torch.full((len(word_inputs), word_inputs.shape[1] + 2), EOS_TYPE)
        index[:, 0] = BOS_TYPE
        index[:, 1:-1] = torch.where(present, word_inputs + 2, EOS_TYPE)
        empty = torch.zeros(0, dtype=torch.int64)
        batch = TokenBatch(empty, empty, empty, index, lengths)
        types = torch.cat([self._boundary_embeddings, table.weight])
        return batch, types

    def _initial_states(self) -> States | None:
        if self.state == "primed":
            return self.bilm.primed_states(self.warmup)
        return None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()


class ScalarMix(nn.Module):
    """AllenNLP's ScalarMix: gamma * sum_k softmax(s)_k * tensor_k, of N
    tensors (B, T, D); with `do_layer_norm`, each normalised first over the
    elements where `mask` (B, T) is True, across the batch."""

    def __init__(
        self,
        mixture_size: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * mixture_size
        elif len(initial_scalar_parameters) != mixture_size:
            raise ConfigurationError(
                f"initial_scalar_parameters has {len(initial_scalar_parameters)} values for "
                f"{mixture_size} layers: give one per layer"
            )
        self.scalar_parameters = nn.ParameterList(
            nn.Parameter(torch.tensor([float(s)]), requires_grad=trainable)
            for s in initial_scalar_parameters
        )
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def forward(
        self, tensors: Sequence[torch.Tensor], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if len(tensors) != self.mixture_size:
            raise ConfigurationError(
                f"{len(tensors)} tensors for a ScalarMix of {self.mixture_size}: give one per layer"
            )
        weights = torch.softmax(torch.cat(list(self.scalar_parameters)), dim=0).split(1)
        if not self.do_layer_norm:
            return self.gamma * sum(w * t for w, t in zip(weights, tensors))
        if mask is None:
            raise ConfigurationError("ScalarMix(do_layer_norm=True) needs the mask")
        broadcast_mask = mask.unsqueeze(-1)
        n = torch.sum(mask) * tensors[0].size(-1)
        tiny = 1e-4 if tensors[0].dtype == torch.float16 else 1e-13

        def normed(tensor: torch.Tensor) -> torch.Tensor:
            masked = tensor * broadcast_mask
            mean = torch.sum(masked) / n
            variance = torch.sum(((masked - mean) * broadcast_mask) ** 2) / n
            return (tensor - mean) / torch.sqrt(variance + tiny)

        return self.gamma * sum(w * normed(t) for w, t in zip(weights, tensors))


class Elmo(nn.Module):
    """AllenNLP's `Elmo`: `num_output_representations` mixes of the biLM's
    layers (a `ScalarMix` each), with dropout. `forward(inputs, word_inputs=None)`:
    character ids (..., T, 50) or B token lists, and ids (..., T) into
    `vocab_to_cache` -> {"elmo_representations": tensors (..., T, 2P) (T + 2
    with `keep_sentence_boundaries`), "mask": (..., T) bool}."""

    def __init__(
        self,
        options_file: ModelFile = None,
        weight_file: str | Path | None = None,
        num_output_representations: int = 1,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: Sequence[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        module: ElmoBiLm | None = None,
        *,
        state: str = "carried",
        warmup: Sequence[str | Sequence[str]] | None = None,
        precision: str | None = None,
    ) -> None:
        super().__init__()
        if module is not None:
            if options_file is not None or weight_file is not None:
                raise ConfigurationError("Don't provide options_file or weight_file with module")
            self._elmo_lstm = module
        else:
            self._elmo_lstm = ElmoBiLm(
                options_file,
                weight_file,
                requires_grad=requires_grad,
                vocab_to_cache=vocab_to_cache,
                state=state,
                warmup=warmup,
                precision=precision,
            )
        self._has_cached_vocab = vocab_to_cache is not None
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._dropout = nn.Dropout(p=dropout)
        self._scalar_mixes: list[ScalarMix] = []
        for k in range(num_output_representations):
            mix = ScalarMix(
                self._elmo_lstm.num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=scalar_mix_parameters is None,
            )
            self.add_module(f"scalar_mix_{k}", mix)
            self._scalar_mixes.append(mix)

    def get_output_dim(self) -> int:
        return self._elmo_lstm.get_output_dim()

    def forward(
        self, inputs: torch.Tensor | Tokens, word_inputs: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        shape = None  # the leading dimensions to restore, where more than (B, T)
        if isinstance(inputs, torch.Tensor) and inputs.dim() > 3:
            shape = inputs.shape[:-1]
            inputs = inputs.reshape(-1, *inputs.shape[-2:])
        if word_inputs is not None and not self._has_cached_vocab:
            word_inputs = None  # AllenNLP warns and runs the char CNN
        elif word_inputs is not None and word_inputs.dim() > 2:
            shape = word_inputs.shape
            word_inputs = word_inputs.reshape(-1, shape[-1])
        output = self._elmo_lstm(inputs, word_inputs)
        activations, mask = output["activations"], output["mask"]
        representations = []
        for mix in self._scalar_mixes:
            mixed = mix(activations, output["mask"])
            if not self._keep_sentence_boundaries:
                mixed, mask = remove_sentence_boundaries(mixed, output["mask"])
            representations.append(self._dropout(mixed))
        if shape is not None:
            mask = mask.view(shape)
            representations = [r.view(*shape, -1) for r in representations]
        return {"elmo_representations": representations, "mask": mask}


# -- arrays and files (AllenNLP 0.9's allennlp.commands.elmo) ---------------------


class ElmoEmbedder:
    """AllenNLP 0.9's `ElmoEmbedder`: the biLM's L + 1 layers as numpy arrays,
    and `embed_file`. Thread-safe: calls run one batch at a time."""

    def __init__(
        self,
        options_file: ModelFile = None,
        weight_file: str | Path | None = None,
        cuda_device: int = -1,
        *,
        state: str = "carried",
        warmup: Sequence[str | Sequence[str]] | None = None,
        precision: str | None = None,
    ) -> None:
        self.elmo_bilm = ElmoBiLm(
            options_file, weight_file, state=state, warmup=warmup, precision=precision
        )
        if cuda_device >= 0:
            self.elmo_bilm = self.elmo_bilm.cuda(device=cuda_device)
        self.elmo_bilm.eval()
        self.cuda_device = cuda_device

    def batch_to_embeddings(self, batch: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L + 1, T, 2P) activations of B sentences, zero past each one,
        and the (B, T) bool mask."""
        _refuse_strings(batch)
        with torch.inference_mode():
            output = self.elmo_bilm(batch)
        layers = torch.stack(output["activations"], dim=1)[:, :, 1:-1]
        return layers, output["mask"][:, 2:]

    def embed_sentence(self, sentence: Sequence[str]) -> numpy.ndarray:
        """(L + 1, n, 2P) float32 vectors of one sentence of n tokens."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: Tokens) -> list[numpy.ndarray]:
        """One (L + 1, n, 2P) float32 array per sentence, in one batch; an
        empty sentence gives (L + 1, 0, 2P)."""
        if not batch:
            return []
        layers = self.batch_to_embeddings(batch)[0].float().cpu().numpy()
        return [layers[i, :, : len(sentence)] for i, sentence in enumerate(batch)]

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[numpy.ndarray]:
        """`embed_batch` over `sentences`, `batch_size` at a time, in order."""
        sentences = iter(sentences)
        while batch := list(islice(sentences, batch_size)):
            yield from self.embed_batch(batch)

    def embed_file(
        self,
        input_file: IO[str] | str | Path,
        output_file_path: str | Path,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """Embed a file (a path, or an open text file, closed when read) of
        sentences, one a line, into an HDF5 file of `allennlp elmo`'s layout.
        Blank lines are refused; the file appears once complete."""
        from tqdm import tqdm

        if output_format not in OUTPUTS:
            raise ConfigurationError(
                f"output_format = {output_format!r}: use one of {', '.join(OUTPUTS)}"
            )
        lines = read_lines(input_file)
        blank = [i + 1 for i, line in enumerate(lines) if not line]
        if blank:
            shown = ", ".join(map(str, blank[:20])) + (" ..." if len(blank) > 20 else "")
            raise ConfigurationError(
                f"{getattr(input_file, 'name', input_file)} has empty lines (lines {shown}, "
                "from 1): remove them, since each line is one sentence"
            )
        keys, index = hdf5_keys(
            lines, range(len(lines)), use_sentence_keys, forget_sentences, "use_sentence_keys"
        )
        embedded = self.embed_sentences((line.split() for line in lines), batch_size)
        with tqdm(embedded, total=len(lines), unit=" sentences") as bar:
            vectors = ((i, shape_vectors(layers, output_format)) for i, layers in enumerate(bar))
            write_file(output_file_path, lambda path: write_hdf5(path, keys, vectors, index))


# Where AllenNLP kept each name that code imports: `as_allennlp_modules`.
ALLENNLP_MODULES = {
    "allennlp.modules.elmo": ("Elmo", "_ElmoBiLm", "_ElmoCharacterEncoder", "batch_to_ids"),
    "allennlp.modules.scalar_mix": ("ScalarMix",),
    "allennlp.commands.elmo": ("ElmoEmbedder", "DEFAULT_BATCH_SIZE"),
    "allennlp.data.token_indexers.elmo_indexer": ("ELMoCharacterMapper",),
    "allennlp.nn.util": ("remove_sentence_boundaries",),
    "allennlp.common.checks": ("ConfigurationError",),
}


def as_allennlp_modules() -> None:
    """Make `import allennlp.modules.elmo` (and `ALLENNLP_MODULES`) import
    these classes, for code whose import lines users cannot change (Flair,
    bio_embeddings): call it first. Only where AllenNLP is not installed."""
    import importlib.util
    import sys
    import types

    if "allennlp" in sys.modules and not getattr(sys.modules["allennlp"], "elmo_spacy", False):
        raise ElmoSpacyError("AllenNLP itself is imported already: use it, or a fresh process")
    if "allennlp" not in sys.modules and importlib.util.find_spec("allennlp") is not None:
        raise ElmoSpacyError(
            "AllenNLP is installed: uninstall it (pip uninstall allennlp) to put elmo_spacy's "
            "ELMo in its place, or import elmo_spacy.allennlp directly"
        )
    this = sys.modules[__name__]
    for name, names in ALLENNLP_MODULES.items():
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            package = ".".join(parts[:depth])
            if package not in sys.modules:
                module = types.ModuleType(package, "elmo_spacy.allennlp in AllenNLP's place")
                module.__path__ = []  # a package, so that its submodules import
                module.elmo_spacy = True
                sys.modules[package] = module
                if depth > 1:
                    setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], module)
        for attribute in names:
            setattr(sys.modules[name], attribute, getattr(this, attribute))


# AllenNLP's names, underscores included, which code in the wild imports.
_ElmoBiLm = ElmoBiLm
_ElmoCharacterEncoder = ElmoCharacterEncoder

__all__ = [
    "ConfigurationError",
    "ELMoCharacterMapper",
    "Elmo",
    "ElmoBiLm",
    "ElmoCharacterEncoder",
    "ElmoEmbedder",
    "ScalarMix",
    "_ElmoBiLm",
    "_ElmoCharacterEncoder",
    "as_allennlp_modules",
    "batch_to_ids",
    "remove_sentence_boundaries",
]
