"""The biLM a user holds: the network (`model/`), the vocabulary and character
ids that turn tokens into its inputs (`inputs/`), and the runtime that runs it
fast and keeps its state (`runtime/`)."""

from collections.abc import Mapping, Sequence

import numpy
import torch

from ..errors import ElmoSpacyError
from .inputs.batch import TokenBatch, token_batch
from .inputs.chars import CharIds, char_ids_for
from .inputs.tokenization import Tokenization
from .inputs.vocab import WordVocab
from .model.config import BiLMConfig
from .model.network import BiLMNetwork, LMLoss, States, left_to_right
from .runtime import kernels
from .runtime.caches import InferenceCache, InferenceCacheSlot, encode_types, packed_products_of
from .runtime.precision import in_precision, resolve_precision
from .runtime.states import CarriedStates


class BiLM(BiLMNetwork):
    """ELMo's biLM (`BiLMNetwork`) on tokens: `batch(docs)` makes a
    `TokenBatch`, `forward(batch)` gives the (L + 1, B, T, 2P) layers and
    `lm_loss(batch)` the loss, on the runtime's kernels, in `precision`.
    At inference it keeps what it derives from its weights (`InferenceCache`);
    after writing weights behind torch's back, call `weights_changed()`.

    tokenization: how its training text was cut into tokens (None: unknown).
    char_vocab: the character vocabulary, in id order, of char_ids = "char_vocab".
    """

    def __init__(
        self,
        config: BiLMConfig,
        vocab: WordVocab,
        with_softmax: bool = True,
        type_cache_size: int = 100_000,
        char_vocab: Sequence[str] | None = None,
        tokenization: Tokenization | None = None,
    ) -> None:
        chars: CharIds | None = None  # None: the word encoder reads no characters
        if config.encoder != "word":
            widest = max(width for width, _ in config.filters)
            chars = char_ids_for(config.char_ids, config.max_chars, widest, char_vocab)
        super().__init__(config, len(vocab), chars, with_softmax)
        self.vocab = vocab
        self.chars = chars
        self.char_vocab = list(char_vocab) if char_vocab is not None else None
        self.tokenization = tokenization
        self.cache_slot = InferenceCacheSlot(type_cache_size)
        self.carried = CarriedStates()
        self._precision = "float32"

    def init_word_vectors(self, vectors: Mapping[str, numpy.ndarray]) -> int:
        """Start the word embedding's rows from given vectors, scaled by one
        factor to the mean norm of the rows they replace. Returns the number
        of vocabulary words found."""
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
        cut = self.config.max_chars - 2 if self.config.char_ids == "char_vocab" else None
        return token_batch(docs, self.vocab, self.chars, cut)

    @property
    def stateful(self) -> bool:
        """Whether each batch row starts from the state the previous batch
        left in it, as bilm-tf trained (`CarriedStates`); default False."""
        return self.carried.enabled

    @stateful.setter
    def stateful(self, stateful: bool) -> None:
        self.carried.enabled = stateful

    def reset_state(self) -> None:
        """Forget the states carried across batches."""
        self.carried.reset()

    def primed_states(self, warmup: Sequence[Sequence[str]]) -> States:
        """The states (per direction and layer, h (1, P), c (1, H)) that reading
        the warm-up sentences one after the other from zeros leaves; kept in
        the inference cache."""
        if not warmup:
            raise ElmoSpacyError("A primed state needs at least one warm-up sentence")
        key = tuple(tuple(sentence) for sentence in warmup)
        was_training, stateful = self.training, self.stateful
        self.eval()
        self.stateful = False
        try:
            with torch.no_grad():
                cache = self.inference_cache()
                if cache is not None and key in cache.primed:
                    return cache.primed[key]
                states: States | None = None
                for sentence in warmup:
                    states = self.forward_with_states(self.batch([sentence]), states)[1]
                if cache is not None:
                    cache.primed[key] = states
                return states
        finally:
            self.stateful = stateful
            if was_training:
                self.train()

    @property
    def type_cache_size(self) -> int:
        """Token encodings kept at inference (0: none)."""
        return self.cache_slot.type_cache_size

    @type_cache_size.setter
    def type_cache_size(self, size: int) -> None:
        self.cache_slot.type_cache_size = size
        if self.cache_slot.cache is not None:  # holds at once
            self.cache_slot.cache.types.max_size = size

    def inference_cache(self) -> InferenceCache | None:
        """The cache for the current weights; None where nothing is kept."""
        return self.cache_slot.for_weights(self)

    def weights_changed(self) -> None:
        """Forget what was derived from the weights (see `InferenceCache`)."""
        self.cache_slot.weights_changed()

    def cache_info(self) -> dict[str, int]:
        """What the inference cache holds now (see `InferenceCacheSlot.info`)."""
        return self.cache_slot.info()

    @property
    def precision(self) -> str:
        """ "float32", "bfloat16" or "float16"; set to any of `RunSettings.precision`."""
        return self._precision

    @precision.setter
    def precision(self, precision: str) -> None:
        self.set_precision(precision)

    def set_precision(self, precision: str, where: str = "BiLM.precision") -> None:
        """Set `precision`; `where` names the setting in what it warns."""
        self._precision = resolve_precision(precision, self._device, where)
        self.weights_changed()  # kept encodings and packed weights are of one precision

    @in_precision
    def forward(
        self,
        batch: TokenBatch,
        initial_states: States | None = None,
        *,
        boundaries: bool = False,
        types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(L + 1, B, T, 2P) layers of the batch (see `BiLMNetwork.forward`).

        initial_states: as `BiLMNetwork.forward`'s, or of one row for every
            row (e.g. `primed_states`); not with `stateful`.
        boundaries: keep <S> and </S>: (L + 1, B, T + 2, 2P).
        types: the batch's (U, P) type encodings, in place of the encoder's.
        """
        return self._layers(batch, initial_states, self.stateful, boundaries, types)[0]

    @in_precision
    def forward_with_states(
        self, batch: TokenBatch, initial_states: States | None = None
    ) -> tuple[torch.Tensor, States]:
        """`forward`'s layers, and the states (h (B, P), c (B, H)) each row
        ends in, per direction and layer."""
        return self._layers(batch, initial_states, final=True)

    @in_precision
    def token_encodings(self, batch: TokenBatch) -> torch.Tensor:
        """(B, T + 2, P) token encodings of <S>, the tokens and </S>, zero past
        each doc's </S>."""
        _check_batch(batch)
        batch = batch.to(self._device)
        types = encode_types(self.encoder, self.chars, batch, self.inference_cache())
        return types[batch.index].masked_fill(~batch.mask(boundaries=True)[:, :, None], 0.0)

    @in_precision
    def lm_loss(self, batch: TokenBatch, every_parameter: bool = False) -> LMLoss:
        """`BiLMNetwork.lm_loss`. A batch built with its targets
        (`TokenBatch.with_targets`) runs without waiting on the device."""
        batch = self.with_targets(batch).to(self._device)
        _, forward_layers, backward_layers, _ = self._run(batch)
        return self.loss(batch, forward_layers, backward_layers, every_parameter)

    def _layers(
        self,
        batch: TokenBatch,
        initial_states: States | None,
        final: bool,
        boundaries: bool = False,
        types: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, States]:
        _check_batch(batch)
        initial_states = self.carried.starting_states(len(batch.lengths), initial_states)
        batch = batch.to(self._device)
        encoded, forward_layers, backward_layers, finals = self._run(
            batch, initial_states, final, types
        )
        self.carried.keep(finals)
        layers = self.layers(encoded, forward_layers, backward_layers, batch.lengths, boundaries)
        return layers, finals

    def _run(
        self,
        batch: TokenBatch,
        initial: States | None = None,
        final: bool = False,
        types: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], States]:
        """The network's `run` on `kernels.choose_kernel`'s kernel, with what
        the cache keeps."""
        cache = self.inference_cache()
        if types is None:
            types = encode_types(self.encoder, self.chars, batch, cache)
        product_of = packed_products_of(cache, self.forward_lstm.layers[0].weight_ih_l0)
        kernel = kernels.choose_kernel(
            self._device,
            clipped=self.forward_lstm.clipped,
            states=initial is not None or final,
            packed=product_of is not None,
        )
        encoded, backward_inputs, lengths = self.lstm_inputs(batch, types)
        stacks = [self.forward_lstm, self.backward_lstm]
        inputs = [encoded, backward_inputs]
        starts = [(initial or {}).get(direction) for direction in ("forward", "backward")]
        if kernel == "training":
            outputs, ends = kernels.run_training_stacks(stacks, inputs, lengths, starts, final)
        else:  # one stack after the other, in the network's order: dropout draws its masks
            fused = kernel == "fused"
            runs = [
                stack(x, lengths, start, final, fused=fused, product_of=product_of)
                for stack, x, start in zip(stacks, inputs, starts)
            ]
            outputs, ends = zip(*runs)
        finals = {"forward": ends[0], "backward": ends[1]}
        return encoded, outputs[0], left_to_right(outputs[1], lengths), finals

    @property
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def train(self, mode: bool = True) -> "BiLM":
        if mode:  # a training step is coming, which may change the weights
            self.weights_changed()
        return super().train(mode)


def _check_batch(batch: object) -> None:
    if not isinstance(batch, TokenBatch):
        raise ElmoSpacyError(
            f"A BiLM runs on a TokenBatch, not a {type(batch).__name__}: make one with "
            "bilm.batch(token_lists). For AllenNLP's character-id tensors (batch_to_ids), use "
            "elmo_spacy.allennlp.Elmo or ElmoBiLm, which take them."
        )
