"""The biLM's network in plain torch: its layers and its language-model loss
over a `TokenBatch`."""

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
    """ELMo's bidirectional language model (Peters et al. 2018): a token
    encoder, forward and backward LSTM stacks over docs framed by <S> and
    </S>, a softmax (`with_softmax`) shared by both directions. The
    plain-torch reference of `elmo_spacy.bilm.BiLM`.
    """

    def __init__(
        self, config: BiLMConfig, vocab_size: int, chars: CharIds | None, with_softmax: bool
    ) -> None:
        super().__init__()
        self.config = config
        dim = config.projection_dim
        if config.encoder == "word":
            self.encoder: nn.Module = WordEncoder(config, vocab_size)
        elif config.encoder == "char_cnn":
            self.encoder = CharCNNEncoder(config, chars, dim)
        else:
            self.encoder = WordCharEncoder(config, chars, vocab_size)
        self.forward_lstm, self.backward_lstm = LstmStack(config), LstmStack(config)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = (
            SoftmaxHead(dim, vocab_size, config.softmax, config.cutoffs, config.div_value)
            if with_softmax
            else None
        )

    def layer_parameters(self) -> list[list[tuple[str, nn.Parameter]]]:
        """The (name, parameter) pairs behind each output layer 0..L: the token
        encoder's, then LSTM layer i's in both directions (not the softmax's)."""
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
        """`requires_grad` on for the parameters of `layers` (0..L) only."""
        for i, group in enumerate(self.layer_parameters()):
            for _, parameter in group:
                parameter.requires_grad_(i in layers)

    def forward(self, batch: TokenBatch, initial_states: States | None = None) -> torch.Tensor:
        """(L + 1, B, T, 2P) layers of the batch: the token encoding as [x; x],
        then each LSTM layer's [forward; backward], zero past each row's
        length. `initial_states`: each direction's per-layer (h (B, P), c (B,
        H)) to start from; None: zeros."""
        types = self.encoder(batch.type_inputs, batch.type_chars, batch.type_word_ids)
        return self.layers(*self.run(batch, types, initial_states)[:3], batch.lengths)

    def lm_loss(self, batch: TokenBatch, every_parameter: bool = False) -> LMLoss:
        """Language-model loss (`LMTargets`); `every_parameter`: see
        `SoftmaxHead.forward`."""
        batch = self.with_targets(batch)
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
        """Both stacks over the batch's encoded types (U, P), from `initial`.
        Returns the token encoding (B, T + 2, P), L forward and L backward
        outputs (B, T + 2, P), left to right, and with `final` each
        direction's final states (empty lists without)."""
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
        """The stacks' inputs (B, T + 2, P) from the encoded types (U, P), the
        backward's reversed within each row, and the rows' lengths (B,)."""
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
        """`forward`'s layers of `run`'s results for docs of `lengths` (B,)
        tokens; with `boundaries`, (L + 1, B, T + 2, 2P), <S> and </S> kept."""
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
        """The LM loss of the top layers of `run`'s results, for a batch
        `with_targets`."""

        def nll(layers: list[torch.Tensor], rows, words, splits) -> torch.Tensor:
            top = layers[-1]  # (B, T, P); rows (N,) its flat positions
            hidden = top.reshape(-1, top.shape[-1]).index_select(0, rows)
            return self.softmax(self.dropout(hidden), words, splits, every_parameter)

        t = batch.targets.to(forward_layers[-1].device)
        return LMLoss(
            nll(forward_layers, t.forward_rows, t.forward_words, t.forward_splits),
            nll(backward_layers, t.backward_rows, t.backward_words, t.backward_splits),
            t.n_tokens,
        )

    def with_targets(self, batch: TokenBatch) -> TokenBatch:
        """`batch` with its LM targets for this biLM's softmax."""
        if self.softmax is None:
            raise RuntimeError("This biLM was built without its softmax head")
        if batch.targets is not None:
            return batch
        return batch.with_targets(self.softmax.cluster_starts)


def left_to_right(backward_layers: list[torch.Tensor], lengths: torch.Tensor) -> list[torch.Tensor]:
    """The backward stack's outputs (B, T + 2, P), each row turned back into
    left-to-right order within its length (B,)."""
    reverse = reverse_index(lengths, backward_layers[0].shape[1])
    return [gather_time(y, reverse) for y in backward_layers]
