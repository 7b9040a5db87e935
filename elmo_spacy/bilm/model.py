"""The biLM: a shared token encoder, forward and backward LSTM stacks, a shared softmax."""

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy
import torch
from torch import nn

from ..errors import ElmoSpacyError
from .chars import char_ids_for
from .config import BiLMConfig
from .encoders import CharCNNEncoder, WordCharEncoder, WordEncoder
from .lstm import LstmStack, LstmState, PackedWeights, onednn_packing
from .precision import in_precision, resolve_precision
from .softmax import SoftmaxHead
from .vocab import PAD_ID, WordVocab

BOS_TYPE, EOS_TYPE = 0, 1  # rows of TokenBatch.type_inputs
# LSTM states of both directions: "forward" and "backward" -> one (h, c) per layer.
States = dict[str, list[LstmState]]


@dataclass
class TokenBatch:
    """Tokenised docs as encoder inputs. Each distinct token is encoded once.

    type_inputs: (U, W) character ids (encoders that read characters) or
        (U,) word ids (word encoder) of the U distinct types; rows 0 and 1 are
        <S> and </S>.
    type_chars: (U,) number of character ids in each row, marks included.
    type_word_ids: (U,) vocabulary id of each type: the softmax targets, and
        the rows of a word embedding.
    index: (B, T + 2) type of each position of the framed docs
        (<S> tokens </S>, then padding).
    lengths: (B,) tokens per doc, unframed.
    types: the U - 2 token strings of rows 2 and on.
    """

    type_inputs: torch.Tensor
    type_chars: torch.Tensor
    type_word_ids: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor
    types: Sequence[str] = field(default=())

    def to(self, device: torch.device) -> "TokenBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return TokenBatch(**moved)


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

    Outside training and without gradients, what the biLM derives from its
    weights is kept across batches (`InferenceCache`): with the character CNN,
    the encodings of token strings (at most `type_cache_size`, least recently
    used dropped first), since they do not depend on context; and the LSTM
    weights packed for oneDNN. Any change to the weights that torch can see
    (new storage, an in-place update, `train()`) empties it; after writing
    weights where torch cannot see it (through numpy, as thinc's optimiser
    does), call `weights_changed()`.

    `stateful` (default False: every batch starts from zero states) replays
    the reference ELMo's carried state: batch row b starts each LSTM layer
    from the state that the previous batch left in row b, the forward
    direction's after the row's last token (</S>), the backward direction's
    after its first (<S>). Rows beyond the previous batch start from zero;
    stored rows beyond the current batch keep their state. Every doc row, even
    an empty doc's, holds its two boundary positions, so no row is all
    padding. `reset_state()` forgets the carried states.
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
        self.type_cache_size = type_cache_size
        self._cache: InferenceCache | None = None
        self._weights_generation = 0
        self.stateful = False
        self._states: dict[str, list[LstmState]] | None = None
        self._precision = "float32"
        dim = config.projection_dim
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
        """Encoder inputs for a batch of tokenised docs."""
        type_of: dict[str, int] = {}
        width = max((len(d) for d in docs), default=0) + 2
        index = numpy.full((len(docs), width), EOS_TYPE, dtype="int64")
        index[:, 0] = BOS_TYPE
        for row, tokens in enumerate(docs):
            index[row, 1 : len(tokens) + 1] = [
                type_of.setdefault(t, len(type_of) + 2) for t in tokens
            ]
        types = list(type_of)
        if self.config.char_ids == "char_vocab":  # the reference looks the cut token up
            type_word_ids = self.vocab.word_ids([t[: self.config.max_chars - 2] for t in types])
        else:
            type_word_ids = self.vocab.word_ids(types)
        if self.config.encoder == "word":
            type_inputs, type_chars = type_word_ids, torch.ones_like(type_word_ids)
        else:
            type_inputs, type_chars = self.chars.char_ids(types)
        lengths = torch.tensor([len(d) for d in docs], dtype=torch.int64)
        return TokenBatch(
            type_inputs, type_chars, type_word_ids, torch.from_numpy(index), lengths, types
        )

    @property
    def precision(self) -> str:
        """ "float32" (the default, conformant) or "bfloat16" (see
        `elmo_spacy.bilm.precision`): what `forward`, `forward_with_states`
        and `lm_loss` compute in. Setting "bfloat16" where it does not pay
        warns and keeps "float32"."""
        return self._precision

    @precision.setter
    def precision(self, precision: str) -> None:
        self._precision = resolve_precision(precision, self._device, "BiLM.precision")
        self.weights_changed()  # kept encodings and packed weights are of one precision

    @in_precision
    def forward(self, batch: TokenBatch, initial_states: "States | None" = None) -> torch.Tensor:
        """(L + 1, B, T, 2P) layers of the batch (see the class docstring).

        initial_states: each direction's per-layer (h (R, P), c (R, H)) to
            start every row from, R = B or R = 1 (one state for every row,
            e.g. `primed_states`); None starts from zeros. Not with `stateful`,
            which starts from the carried states.
        """
        return self._layers(batch, initial_states, final=self.stateful)[0]

    @in_precision
    def forward_with_states(
        self, batch: TokenBatch, initial_states: "States | None" = None
    ) -> tuple[torch.Tensor, "States"]:
        """`forward`'s layers (L + 1, B, T, 2P), and the states each row ends
        in: per direction and layer, (h (B, P), c (B, H)), the forward
        direction's after the row's </S>, the backward direction's after its
        <S> (what `stateful` mode carries to the next batch)."""
        return self._layers(batch, initial_states, final=True)

    def _layers(
        self, batch: TokenBatch, initial_states: "States | None", final: bool
    ) -> tuple[torch.Tensor, "States"]:
        if self.stateful:
            if initial_states is not None:
                raise ElmoSpacyError(
                    "A stateful biLM starts from the states it carried: pass no initial_states, "
                    "or set bilm.stateful = False"
                )
            initial_states = self._initial_states(len(batch.lengths))
        elif initial_states is not None:
            initial_states = repeat_states(initial_states, len(batch.lengths))
        encoded, forward_layers, backward_layers, finals = self._run(
            batch.to(self._device), initial_states, final
        )
        if self.stateful:
            self._keep_states(finals)
        layers = [torch.cat([encoded, encoded], dim=-1)]
        layers += [torch.cat(fb, dim=-1) for fb in zip(forward_layers, backward_layers)]
        return torch.stack(layers)[:, :, 1:-1], finals

    def primed_states(self, warmup: Sequence[Sequence[str]]) -> "States":
        """The states that reading the warm-up sentences leaves, one row:
        the sentences run in order, one at a time, each starting from the
        states the previous one ended in (bilm-tf's carried state, in a batch
        of one row), the first from zeros. Per direction and layer,
        (h (1, P), c (1, H)), without gradients, computed with dropout off
        and kept (in the `InferenceCache`) until the weights change."""
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

    @in_precision
    def lm_loss(self, batch: TokenBatch) -> LMLoss:
        """Language-model loss: every word and the closing </S> is predicted
        forwards, every word and the opening <S> backwards."""
        if self.softmax is None:
            raise RuntimeError("This biLM was built without its softmax head")
        batch = batch.to(self._device)
        _, forward_layers, backward_layers, _ = self._run(batch)
        targets = batch.type_word_ids[batch.index]
        # Position t of the framed doc predicts t + 1 forwards and, from t + 1,
        # predicts t backwards; valid while t + 1 < length + 2.
        steps = torch.arange(targets.shape[1] - 1, device=targets.device)
        mask = steps[None, :] < (batch.lengths + 1)[:, None]
        forward_hidden = self.dropout(forward_layers[-1][:, :-1][mask])
        backward_hidden = self.dropout(backward_layers[-1][:, 1:][mask])
        return LMLoss(
            forward_nll=self.softmax(forward_hidden, targets[:, 1:][mask]),
            backward_nll=self.softmax(backward_hidden, targets[:, :-1][mask]),
            n_tokens=int(mask.sum()),
        )

    @property
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _run(
        self, batch: TokenBatch, initial: "States | None" = None, final: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], "States"]:
        """Encode the types and run both stacks from `initial` (B rows; zeros
        without it). Returns the token encoding (B, T + 2, P), L forward and L
        backward outputs (B, T + 2, P), all in left-to-right order, and with
        `final` each direction's final states (see `forward_with_states`;
        empty lists without)."""
        cache = self.inference_cache()
        weight = self.forward_lstm.layers[0].weight_ih_l0
        can_pack = (
            weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_packing()
        )
        packed = cache.packed if cache is not None and can_pack else None
        types = self._encode_types(batch, cache)
        encoded = types[batch.index]
        lengths = batch.lengths + 2
        reverse = _reverse_index(lengths, batch.index.shape[1])
        backward_inputs = types[batch.index.gather(1, reverse)]
        initial = initial or {}
        forward_layers, forward_final = self.forward_lstm(
            encoded, lengths, initial.get("forward"), final=final, packed=packed
        )
        backward_layers, backward_final = self.backward_lstm(
            backward_inputs, lengths, initial.get("backward"), final=final, packed=packed
        )
        backward_layers = [_gather_time(y, reverse) for y in backward_layers]
        finals = {"forward": forward_final or [], "backward": backward_final or []}
        return encoded, forward_layers, backward_layers, finals

    def reset_state(self) -> None:
        """Forget the states carried across batches (stateful mode)."""
        self._states = None

    def _initial_states(self, n_rows: int) -> "States | None":
        """Each direction's per-layer (h, c) for the first n_rows rows: the
        carried ones, zeros for rows never seen."""
        if self._states is None:
            return None
        initial = {}
        for direction, layers in self._states.items():
            initial[direction] = [tuple(_rows(part, n_rows) for part in state) for state in layers]
        return initial

    def _keep_states(self, finals: "States") -> None:
        """Carry each row's final states to the next batch (without gradients)."""
        previous = self._states
        kept: dict[str, list[LstmState]] = {}
        for direction, layers in finals.items():
            kept[direction] = []
            for i, state in enumerate(layers):
                parts = []
                for j, part in enumerate(state):
                    part = part.detach()
                    if previous is not None:
                        old = previous[direction][i][j]
                        if len(old) > len(part):  # rows beyond this batch keep theirs
                            part = torch.cat([part, old[len(part) :]])
                    parts.append(part)
                kept[direction].append(tuple(parts))
        self._states = kept

    def train(self, mode: bool = True) -> "BiLM":
        if mode:  # a training step is coming, which may change the weights
            self.weights_changed()
        return super().train(mode)

    def __getstate__(self) -> dict:
        # Copies and pickles leave out what was derived from the weights: it is
        # rebuilt on demand, and oneDNN's packed tensors cannot be copied.
        return {**self.__dict__, "_cache": None}

    def weights_changed(self) -> None:
        """Forget what was derived from the weights (see `InferenceCache`)."""
        self._weights_generation += 1
        self._cache = None

    def cache_info(self) -> dict[str, int]:
        """What the inference cache holds now (all 0 when there is none):
        `types`, token strings whose encodings are kept; `primed`, warm-up
        texts whose primed states are kept; `packed`, LSTM layers whose weights
        are packed for oneDNN."""
        cache = self._cache
        if cache is None:
            return {"types": 0, "primed": 0, "packed": 0}
        return {"types": len(cache.types), "primed": len(cache.primed), "packed": len(cache.packed)}

    def inference_cache(self) -> "InferenceCache | None":
        """The cache for the current weights; None in training mode or with
        gradients enabled, where nothing is kept."""
        if self.training or torch.is_grad_enabled():
            return None
        stamp = (
            self._weights_generation,
            tuple((p.data_ptr(), p._version) for p in self.parameters()),
        )
        if self._cache is None or self._cache.stamp != stamp:
            self._cache = InferenceCache(stamp)
        return self._cache

    def _encode_types(self, batch: TokenBatch, cache: "InferenceCache | None") -> torch.Tensor:
        """(U, P) encodings of the batch's types, from the cache where possible."""
        cacheable = self.config.encoder != "word" and self.type_cache_size > 0
        if cache is None or not cacheable or not batch.types:
            return self.encoder(batch.type_inputs, batch.type_chars, batch.type_word_ids)
        types = cache.types
        encoded = [types.get(t) for t in batch.types]
        missing = [i for i, e in enumerate(encoded) if e is None]
        rows = [0, 1] if cache.boundaries is None else []
        rows += [i + 2 for i in missing]
        if rows:
            rows = torch.tensor(rows, device=batch.type_inputs.device)
            fresh = self._encode_alike(
                batch.type_inputs[rows], batch.type_chars[rows], batch.type_word_ids[rows]
            )
            if cache.boundaries is None:
                cache.boundaries, fresh = fresh[:2].clone(), fresh[2:]
            for i, row in zip(missing, fresh):
                encoded[i] = types[batch.types[i]] = row.clone()
        for t in batch.types:
            types.move_to_end(t)
        while len(types) > self.type_cache_size:
            types.popitem(last=False)
        return torch.cat([cache.boundaries, torch.stack(encoded)])

    def _encode_alike(
        self, char_ids: torch.Tensor, n_chars: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        """Encode types in blocks of one fixed shape (ENCODE_BLOCK rows of
        max_chars columns), so that a type's encoding is the same to the bit
        whatever else is in its batch: kept encodings then never make a
        pipeline's output depend on what it ran before. (U, W), (U,), (U,)
        -> (U, P)."""
        n_rows, width = char_ids.shape
        blocks = -(-n_rows // ENCODE_BLOCK)
        padded = char_ids.new_full(
            (blocks * ENCODE_BLOCK, self.config.max_chars), self.chars.padding
        )
        padded[:n_rows, :width] = char_ids
        lengths = n_chars.new_full((blocks * ENCODE_BLOCK,), 1)
        lengths[:n_rows] = n_chars
        words = word_ids.new_full((blocks * ENCODE_BLOCK,), PAD_ID)
        words[:n_rows] = word_ids
        encoded = [
            self.encoder(*(x[i : i + ENCODE_BLOCK] for x in (padded, lengths, words)))
            for i in range(0, len(padded), ENCODE_BLOCK)
        ]
        return torch.cat(encoded)[:n_rows]


ENCODE_BLOCK = 32  # rows of the char CNN's fixed-shape blocks at inference


@dataclass
class InferenceCache:
    """What a biLM derives from one version of its weights to run faster at
    inference.

    stamp: the weights it belongs to.
    types: (P,) encodings of token strings (char CNN), least recently used first.
    boundaries: (2, P) encodings of <S> and </S>.
    packed: LSTM weights packed for oneDNN, per layer (see `run_lstm_layer`).
    primed: `BiLM.primed_states` of each warm-up text.
    """

    stamp: tuple
    types: OrderedDict[str, torch.Tensor] = field(default_factory=OrderedDict)
    boundaries: torch.Tensor | None = None
    packed: PackedWeights = field(default_factory=dict)
    primed: dict[tuple, "States"] = field(default_factory=dict)


def repeat_states(states: States, n_rows: int) -> States:
    """States of R = n_rows rows as they are; of one row, that row for each of
    n_rows rows (a view, no copy)."""
    repeated: States = {}
    for direction, layers in states.items():
        repeated[direction] = []
        for state in layers:
            rows = len(state[0])
            if rows != n_rows and rows != 1:
                raise ElmoSpacyError(
                    f"Initial states of {rows} rows for a batch of {n_rows}: give one row "
                    "per batch row, or one row for all"
                )
            repeated[direction].append(tuple(part.expand(n_rows, -1) for part in state))
    return repeated


def _rows(state: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The first n_rows rows of a (R, D) state, zero rows appended past R."""
    if n_rows <= len(state):
        return state[:n_rows]
    return torch.cat([state, state.new_zeros(n_rows - len(state), state.shape[1])])


def _reverse_index(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) index that reverses each row's first lengths[b] positions and keeps
    the padding in place. It is its own inverse."""
    steps = torch.arange(length, device=lengths.device)[None, :]
    flipped = lengths[:, None] - 1 - steps
    return torch.where(flipped >= 0, flipped, steps)


def _gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T, D), index (B, T) -> x[b, index[b, t]]."""
    return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[2]))
