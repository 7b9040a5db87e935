"""The biLM: a shared token encoder, forward and backward LSTM stacks, a shared softmax."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy
import torch
from torch import nn

from ..errors import ElmoSpacyError
from .batch import TokenBatch, gather_time, reverse_index, token_batch
from .chars import CharIds, char_ids_for
from .config import BiLMConfig
from .encoders import CharCNNEncoder, WordCharEncoder, WordEncoder
from .inference_cache import InferenceCache, InferenceCacheSlot, encode_types, packed_weights
from .lstm import LstmStack, run_training_stacks
from .precision import in_precision, resolve_precision
from .softmax import SoftmaxHead
from .states import CarriedStates, States, primed_states
from .vocab import WordVocab


@dataclass
class LMLoss:
    """Summed negative log-likelihoods of one batch, per direction (nats)."""

    forward_nll: torch.Tensor
    backward_nll: torch.Tensor
    n_tokens: int

    @property
    def mean(self) -> torch.Tensor:
        """Mean NLL per predicted token over both directions: the training loss."""
        return (self.forward_nll + self.backward_nll) / (2 * max(self.n_tokens, 1))


class BiLM(nn.Module):
    """ELMo's bidirectional language model (Peters et al. 2018).

    Each doc is framed by <S> and </S> inside the model. The forward stack reads
    it left to right and predicts the next word; the backward stack reads it
    right to left and predicts the previous word. The token encoder and the
    softmax are shared by both directions.

    `forward(batch)` returns (L + 1, B, T, 2P): layer 0 is the token encoding
    repeated as [x; x], layers 1..L are [forward; backward] LSTM outputs, and
    the boundary positions are stripped again.

    This class holds the architecture; its other jobs are pieces of their
    own, which it reaches through thin methods:

    - `batch`: token strings to a `TokenBatch` (`elmo_spacy.bilm.batch`).
    - `stateful`, `reset_state`: `stateful` (default False: every batch
      starts from zero states) replays the reference ELMo's state carried
      across batches (`CarriedStates` in `elmo_spacy.bilm.states`). Every doc
      row, even an empty doc's, holds its two boundary positions, so no row
      is all padding. `primed_states`: the state a warm-up text leaves.
    - `inference_cache`, `weights_changed`, `cache_info`, `type_cache_size`:
      outside training and without gradients, what the biLM derives from its
      weights is kept across batches (`elmo_spacy.bilm.inference_cache`):
      with an encoder that reads characters, on the CPU, the encodings of
      token strings (at most `type_cache_size`, least recently used dropped
      first: on a GPU the char CNN costs less than keeping them); the
      LSTM weights packed for oneDNN, or on a GPU the CUDA graphs of the
      clipped recurrence; primed states. Any change to the
      weights that torch can see (new storage, an in-place update, `train()`)
      empties it; after writing weights where torch cannot see it (through
      numpy, as thinc's optimiser does), call `weights_changed()`.
    """

    def __init__(
        self,
        config: BiLMConfig,
        vocab: WordVocab,
        with_softmax: bool = True,
        type_cache_size: int = 100_000,
        char_vocab: Sequence[str] | None = None,
    ) -> None:
        """char_vocab: the character vocabulary, in id order, of a biLM with
        char_ids = "char_vocab" (a converted ELMoForManyLangs model)."""
        super().__init__()
        self.config = config
        self.vocab = vocab
        self.char_vocab = list(char_vocab) if char_vocab is not None else None
        self.cache_slot = InferenceCacheSlot(type_cache_size)
        self.carried = CarriedStates()
        self._precision = "float32"
        dim = config.projection_dim
        self.chars: CharIds | None = None  # None: the word encoder reads no characters
        if config.encoder == "word":
            self.encoder: nn.Module = WordEncoder(len(vocab), config.word_dim, dim)
        else:
            widest = max(width for width, _ in config.filters)
            self.chars = char_ids_for(config.char_ids, config.max_chars, widest, char_vocab)
            char_cnn = (config.char_dim, config.filters, config.n_highway)
            if config.encoder == "char_cnn":
                self.encoder = CharCNNEncoder(self.chars, *char_cnn, dim, config.char_activation)
            else:
                self.encoder = WordCharEncoder(
                    self.chars, len(vocab), config.word_dim, *char_cnn, dim, config.char_activation
                )
        lstm = {
            "cell_clip": config.cell_clip,
            "proj_clip": config.proj_clip,
            "skip_connections": config.skip_connections,
            "forget_bias": config.forget_bias,
        }
        self.forward_lstm = LstmStack(config.n_layers, dim, config.lstm_dim, config.dropout, **lstm)
        self.backward_lstm = LstmStack(
            config.n_layers, dim, config.lstm_dim, config.dropout, **lstm
        )
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = (
            SoftmaxHead(dim, len(vocab), config.softmax, config.cutoffs) if with_softmax else None
        )

    def init_word_vectors(self, vectors: Mapping[str, numpy.ndarray]) -> int:
        """Start the word encoder's embedding rows from given vectors, e.g.
        count-based vectors of the same text, so that rare words begin with a
        distributional vector rather than noise. The vectors are scaled by one
        factor so that their mean norm is that of the rows they replace.
        Returns the number of vocabulary words found in `vectors`."""
        if self.config.encoder not in ("word", "word_char"):
            raise ElmoSpacyError(
                "Initial word vectors need a word embedding (encoder 'word' or 'word_char'); "
                f"this biLM's encoder is {self.config.encoder!r}"
            )
        table = self.encoder.embed.weight
        rows = [(i, vectors[w]) for i, w in enumerate(self.vocab.words) if w in vectors]
        if not rows:
            return 0
        ids = torch.tensor([i for i, _ in rows])
        given = torch.as_tensor(numpy.stack([v for _, v in rows]), dtype=table.dtype)
        if given.shape[1] != table.shape[1]:
            raise ElmoSpacyError(
                f"Initial word vectors have width {given.shape[1]}, the biLM's word_dim is "
                f"{table.shape[1]}: make the two widths the same"
            )
        with torch.no_grad():
            scale = table[ids].norm(dim=1).mean() / given.norm(dim=1).mean().clamp_min(1e-12)
            table[ids] = given * scale
        return len(rows)

    def batch(self, docs: Sequence[Sequence[str]]) -> TokenBatch:
        """Encoder inputs for a batch of tokenised docs (see `token_batch`)."""
        return token_batch(docs, self.config, self.vocab, self.chars)

    @property
    def stateful(self) -> bool:
        """Whether batches start from the states the previous batch left
        (see `CarriedStates`); default False: from zeros, or given states."""
        return self.carried.enabled

    @stateful.setter
    def stateful(self, stateful: bool) -> None:
        self.carried.enabled = stateful

    def reset_state(self) -> None:
        """Forget the states carried across batches (stateful mode)."""
        self.carried.reset()

    def primed_states(self, warmup: Sequence[Sequence[str]]) -> States:
        """The states the warm-up sentences leave, one row per direction and
        layer (see `elmo_spacy.bilm.states.primed_states`)."""
        return primed_states(self, warmup)

    @property
    def type_cache_size(self) -> int:
        """Token strings whose encodings are kept at inference (0: none)."""
        return self.cache_slot.type_cache_size

    @type_cache_size.setter
    def type_cache_size(self, size: int) -> None:
        self.cache_slot.type_cache_size = size

    def inference_cache(self) -> InferenceCache | None:
        """The cache for the current weights; None in training mode or with
        gradients enabled, where nothing is kept."""
        return self.cache_slot.for_weights(self)

    def weights_changed(self) -> None:
        """Forget what was derived from the weights (see `InferenceCache`)."""
        self.cache_slot.weights_changed()

    def cache_info(self) -> dict[str, int]:
        """What the inference cache holds now (see `InferenceCacheSlot.info`)."""
        return self.cache_slot.info()

    @property
    def precision(self) -> str:
        """ "float32" (the default, conformant) or "bfloat16" (see
        `elmo_spacy.bilm.precision`): what `forward`, `forward_with_states`
        and `lm_loss` compute in. Setting "bfloat16" where it does not pay
        warns and keeps "float32"."""
        return self._precision

    @precision.setter
    def precision(self, precision: str) -> None:
        # the warning points at the assignment, past torch's Module.__setattr__
        self._precision = resolve_precision(precision, self._device, "BiLM.precision", 4)
        self.weights_changed()  # kept encodings and packed weights are of one precision

    @in_precision
    def forward(self, batch: TokenBatch, initial_states: States | None = None) -> torch.Tensor:
        """(L + 1, B, T, 2P) layers of the batch (see the class docstring).

        initial_states: each direction's per-layer (h (R, P), c (R, H)) to
            start every row from, R = B or R = 1 (one state for every row,
            e.g. `primed_states`); None starts from zeros. Not with `stateful`,
            which starts from the carried states.
        """
        return self._layers(batch, initial_states, final=self.stateful)[0]

    @in_precision
    def forward_with_states(
        self, batch: TokenBatch, initial_states: States | None = None
    ) -> tuple[torch.Tensor, States]:
        """`forward`'s layers (L + 1, B, T, 2P), and the states each row ends
        in: per direction and layer, (h (B, P), c (B, H)), the forward
        direction's after the row's </S>, the backward direction's after its
        <S> (what `stateful` mode carries to the next batch)."""
        return self._layers(batch, initial_states, final=True)

    def _layers(
        self, batch: TokenBatch, initial_states: States | None, final: bool
    ) -> tuple[torch.Tensor, States]:
        initial_states = self.carried.starting_states(len(batch.lengths), initial_states)
        encoded, forward_layers, backward_layers, finals = self._run(
            batch.to(self._device), initial_states, final
        )
        self.carried.keep(finals)
        layers = [torch.cat([encoded, encoded], dim=-1)]
        layers += [torch.cat(fb, dim=-1) for fb in zip(forward_layers, backward_layers)]
        return torch.stack(layers)[:, :, 1:-1], finals

    @in_precision
    def lm_loss(self, batch: TokenBatch) -> LMLoss:
        """Language-model loss: every word and the closing </S> is predicted
        forwards, every word and the opening <S> backwards (see `LMTargets`).
        A batch built with its targets (`TokenBatch.with_targets`) runs without
        waiting on the device."""
        if self.softmax is None:
            raise RuntimeError("This biLM was built without its softmax head")
        if batch.targets is None:
            batch = batch.with_targets(self.softmax.cluster_starts)
        batch = batch.to(self._device)
        targets = batch.targets
        _, forward_layers, backward_layers, _ = self._run(batch)
        forward_hidden = _rows(forward_layers[-1], targets.forward_rows)
        backward_hidden = _rows(backward_layers[-1], targets.backward_rows)
        return LMLoss(
            forward_nll=self.softmax(
                self.dropout(forward_hidden), targets.forward_words, targets.forward_splits
            ),
            backward_nll=self.softmax(
                self.dropout(backward_hidden), targets.backward_words, targets.backward_splits
            ),
            n_tokens=targets.n_tokens,
        )

    @property
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _run(
        self, batch: TokenBatch, initial: States | None = None, final: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], States]:
        """Encode the types and run both stacks from `initial` (B rows; zeros
        without it). Returns the token encoding (B, T + 2, P), L forward and L
        backward outputs (B, T + 2, P), all in left-to-right order, and with
        `final` each direction's final states (see `forward_with_states`;
        empty lists without)."""
        cache = self.inference_cache()
        packed = packed_weights(cache, self.forward_lstm.layers[0].weight_ih_l0)
        graphs = cache.graphs if cache is not None and self._device.type == "cuda" else None
        types = encode_types(self.encoder, self.chars, batch, cache)
        encoded = types[batch.index]
        lengths = batch.lengths + 2
        reverse = reverse_index(lengths, batch.index.shape[1])
        backward_inputs = types[batch.index.gather(1, reverse)]
        initial = initial or {}
        stacks = {"forward": self.forward_lstm, "backward": self.backward_lstm}
        kernels = {
            k: s.kernel_for(encoded, initial.get(k), final, packed, graphs=graphs)
            for k, s in stacks.items()
        }
        if set(kernels.values()) == {"training"}:  # both directions' layers run together
            forward_layers, backward_layers = run_training_stacks(
                list(stacks.values()), [encoded, backward_inputs]
            )
            forward_final = backward_final = None
        else:
            forward_layers, forward_final = self.forward_lstm(
                encoded, lengths, initial.get("forward"), final=final, packed=packed, graphs=graphs
            )
            backward_layers, backward_final = self.backward_lstm(
                backward_inputs,
                lengths,
                initial.get("backward"),
                final=final,
                packed=packed,
                graphs=graphs,
            )
        backward_layers = [gather_time(y, reverse) for y in backward_layers]
        finals = {"forward": forward_final or [], "backward": backward_final or []}
        return encoded, forward_layers, backward_layers, finals

    def train(self, mode: bool = True) -> "BiLM":
        if mode:  # a training step is coming, which may change the weights
            self.weights_changed()
        return super().train(mode)


def _rows(layer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """layer (B, T, P), rows (N,) flat positions -> (N, P)."""
    return layer.reshape(-1, layer.shape[-1]).index_select(0, rows)
