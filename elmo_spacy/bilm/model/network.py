"""The biLM's network: a shared token encoder, forward and backward LSTM
stacks, a shared softmax; its layers and its language-model loss over a
`TokenBatch`, in plain torch."""

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

from ..inputs.batch import TokenBatch, gather_time, reverse_index
from ..inputs.chars import CharIds
from .config import BiLMConfig
from .encoders import CharCNNEncoder, WordCharEncoder, WordEncoder
from .lstm import LstmStack, LstmState
from .softmax import SoftmaxHead

States = dict[str, list[LstmState]]  # "forward" and "backward" -> one (h, c) per layer


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


class BiLMNetwork(nn.Module):
    """ELMo's bidirectional language model (Peters et al. 2018), as modules.

    Each doc is framed by <S> and </S>; the forward stack predicts the next
    word, the backward stack the previous one; both share the token encoder
    and the softmax. chars: the char CNN's ids (None for the word encoder);
    with_softmax: build the softmax head (the LM loss needs it). This is the
    plain-torch reference; `elmo_spacy.bilm.BiLM` runs it on the runtime's kernels.
    """

    def __init__(
        self, config: BiLMConfig, vocab_size: int, chars: CharIds | None, with_softmax: bool
    ) -> None:
        super().__init__()
        self.config = config
        dim = config.projection_dim
        if config.encoder == "word":
            self.encoder: nn.Module = WordEncoder(vocab_size, config.word_dim, dim)
        else:
            char_cnn = (config.char_dim, config.filters, config.n_highway)
            if config.encoder == "char_cnn":
                self.encoder = CharCNNEncoder(chars, *char_cnn, dim, config.char_activation)
            else:
                self.encoder = WordCharEncoder(
                    chars, vocab_size, config.word_dim, *char_cnn, dim, config.char_activation
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
            SoftmaxHead(dim, vocab_size, config.softmax, config.cutoffs, config.div_value)
            if with_softmax
            else None
        )

    def layer_parameters(self) -> list[list[tuple[str, nn.Parameter]]]:
        """The parameters behind each output layer, bottom up, by their names
        in the network (L + 1 lists): [0] the token encoder's, [i] LSTM layer
        i's in both directions. In none: the softmax's."""
        groups = [list(self.encoder.named_parameters(prefix="encoder"))]
        for i in range(self.config.n_layers):
            groups.append(
                [
                    (f"{stack}.layers.{i}.{name}", parameter)
                    for stack in ("forward_lstm", "backward_lstm")
                    for name, parameter in getattr(self, stack).layers[i].named_parameters()
                ]
            )
        return groups

    def set_trainable(self, layers: Collection[int]) -> None:
        """Gradients for the parameters of `layers` only (indices into
        `layer_parameters`, 0..L): the others' `requires_grad` goes off, so
        that backpropagation stops below the lowest trainable layer."""
        for i, group in enumerate(self.layer_parameters()):
            for _, parameter in group:
                parameter.requires_grad_(i in layers)

    def forward(self, batch: TokenBatch, initial_states: States | None = None) -> torch.Tensor:
        """(L + 1, B, T, 2P) layers of the batch: layer 0 is the token
        encoding repeated as [x; x], layers 1..L are [forward; backward] LSTM
        outputs, the boundary positions stripped, zero past each row's
        length (`TokenBatch.mask`).

        initial_states: each direction's per-layer (h (B, P), c (B, H)) to
            start from; None starts from zeros."""
        types = self.encoder(batch.type_inputs, batch.type_chars, batch.type_word_ids)
        return self.layers(*self.run(batch, types, initial_states)[:3], batch.lengths)

    def lm_loss(self, batch: TokenBatch, every_parameter: bool = False) -> LMLoss:
        """Language-model loss: every word and the closing </S> is predicted
        forwards, every word and the opening <S> backwards (see `LMTargets`).
        every_parameter: every parameter gets a gradient, zero where the
        batch does not reach it (see `SoftmaxHead.forward`)."""
        types = self.encoder(batch.type_inputs, batch.type_chars, batch.type_word_ids)
        _, forward_layers, backward_layers, _ = self.run(batch, types)
        return self.loss(batch, forward_layers, backward_layers, every_parameter)

    def run(
        self,
        batch: TokenBatch,
        types: torch.Tensor,
        initial: States | None = None,
        final: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], States]:
        """Both stacks over the batch's encoded types (U, P) (`encoder`'s
        output), from `initial` (B rows; zeros without it). Returns the token
        encoding (B, T + 2, P), L forward and L backward outputs (B, T + 2,
        P), all in left-to-right order, and with `final` each direction's
        final states (see `BiLM.forward_with_states`; empty lists without)."""
        encoded, backward_inputs, lengths = self.lstm_inputs(batch, types)
        initial = initial or {}
        forward_layers, forward_final = self.forward_lstm(
            encoded, lengths, initial.get("forward"), final
        )
        backward_layers, backward_final = self.backward_lstm(
            backward_inputs, lengths, initial.get("backward"), final
        )
        finals = {"forward": forward_final, "backward": backward_final}
        return encoded, forward_layers, left_to_right(backward_layers, lengths), finals

    @staticmethod
    def lstm_inputs(
        batch: TokenBatch, types: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the stacks read: the forward stack's inputs, the batch's
        encoded types (U, P) in place (B, T + 2, P); the backward stack's, the
        same with each row reversed within its length; and each row's length
        with <S> and </S> (B,)."""
        lengths = batch.lengths + 2
        reverse = reverse_index(lengths, batch.index.shape[1])
        return types[batch.index], types[batch.index.gather(1, reverse)], lengths

    @staticmethod
    def layers(
        encoded: torch.Tensor,
        forward_layers: list[torch.Tensor],
        backward_layers: list[torch.Tensor],
        lengths: torch.Tensor,
        boundaries: bool = False,
    ) -> torch.Tensor:
        """The (L + 1, B, T, 2P) output layers of `run`'s results for docs
        of `lengths` (B,) tokens, zero past each doc's length; with
        `boundaries`, (L + 1, B, T + 2, 2P) with <S> at position 0 and </S>
        at lengths[b] + 1 (AllenNLP's `_ElmoBiLm` activations)."""
        layers = [torch.cat([encoded, encoded], dim=-1)]
        layers += [torch.cat(fb, dim=-1) for fb in zip(forward_layers, backward_layers)]
        layers = torch.stack(layers)
        if not boundaries:
            layers = layers[:, :, 1:-1]
        extra = 2 if boundaries else 0
        steps = torch.arange(layers.shape[2], device=layers.device)
        outside = steps[None, :] >= (lengths.to(layers.device) + extra)[:, None]  # (B, T)
        return layers.masked_fill(outside[None, :, :, None], 0.0)

    def loss(
        self,
        batch: TokenBatch,
        forward_layers: list[torch.Tensor],
        backward_layers: list[torch.Tensor],
        every_parameter: bool = False,
    ) -> LMLoss:
        """The LM loss of the top layers (B, T + 2, P) of `run`'s results
        (`every_parameter`: see `lm_loss`)."""
        if self.softmax is None:
            raise RuntimeError("This biLM was built without its softmax head")
        if batch.targets is None:
            batch = batch.with_targets(self.softmax.cluster_starts)
        targets = batch.targets.to(forward_layers[-1].device)
        forward_hidden = _rows(forward_layers[-1], targets.forward_rows)
        backward_hidden = _rows(backward_layers[-1], targets.backward_rows)
        return LMLoss(
            forward_nll=self.softmax(
                self.dropout(forward_hidden),
                targets.forward_words,
                targets.forward_splits,
                every_parameter,
            ),
            backward_nll=self.softmax(
                self.dropout(backward_hidden),
                targets.backward_words,
                targets.backward_splits,
                every_parameter,
            ),
            n_tokens=targets.n_tokens,
        )


def left_to_right(backward_layers: list[torch.Tensor], lengths: torch.Tensor) -> list[torch.Tensor]:
    """The backward stack's outputs (B, T + 2, P), each row turned back into
    left-to-right order within its length (B,)."""
    reverse = reverse_index(lengths, backward_layers[0].shape[1])
    return [gather_time(y, reverse) for y in backward_layers]


def _rows(layer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """layer (B, T, P), rows (N,) flat positions -> (N, P)."""
    return layer.reshape(-1, layer.shape[-1]).index_select(0, rows)
