"""Context-independent token encoders: a character CNN, a word table, or both.

Each maps the types of a batch (see `elmo_spacy.bilm.inputs.batch.TokenBatch`) to
(U, P) encodings: `forward(type_inputs, type_chars, type_word_ids)`.
"""

import torch
from torch import nn

from ...errors import ElmoSpacyError
from ..inputs.chars import CharIds
from .dtypes import widened


class Highway(nn.Module):
    """y = g * x + (1 - g) * relu(W x), g = sigmoid(V x), on (..., dim) inputs.

    bilm-tf writes the same layer with the gate on the other side,
    y = c * relu(W x) + (1 - c) * x with c = sigmoid(C x): g = 1 - c, so
    V = -C (see `elmo_spacy.bilm.formats.bilm_tf`)."""

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(n_layers))
        for layer in self.layers:
            # Start by carrying the input through (gate bias 1), as ELMo does.
            nn.init.constant_(layer.bias[dim:], 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden, gate = layer(x).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            x = gate * x + (1 - gate) * torch.relu(hidden)
        return x


class CharCNNEncoder(nn.Module):
    """ELMo's token encoder: character embeddings, convolutions of several widths
    max-pooled over the characters, an activation, highway layers and a linear
    projection.

    Input (U, W) int64 character ids and (U,) ids per row (see
    `elmo_spacy.bilm.inputs.chars`); output (U, P).

    The batch holds only the W <= max_chars columns it needs. With masked
    ids, windows past a token's end-of-word mark are left out of the pooling;
    with bilm-tf's, a window wholly in the padding beyond W scores the same
    for every token, so it is computed once and joins each token's max.
    """

    def __init__(
        self,
        chars: CharIds,
        char_dim: int,
        filters: list[tuple[int, int]],
        n_highway: int,
        projection_dim: int | None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        max_chars = chars.max_chars
        if any(width > max_chars for width, _ in filters):
            raise ElmoSpacyError(f"A char CNN filter is wider than max_chars={max_chars}")
        self.max_chars = max_chars
        self.padding = chars.padding
        self.masked = chars.masked
        self.embed = nn.Embedding(
            chars.n_ids, char_dim, padding_idx=chars.padding if self.masked else None
        )
        self.convs = nn.ModuleList(nn.Conv1d(char_dim, n, w) for w, n in filters)
        self.activation = torch.relu if activation == "relu" else torch.tanh
        n_filters = sum(n for _, n in filters)
        self.highway = Highway(n_filters, n_highway)
        # bilm-tf projects only when the widths differ; other models always do.
        keep_width = chars.scheme == "bilm_tf" and n_filters == projection_dim
        self.projection: nn.Module = (
            nn.Identity()
            if projection_dim is None or keep_width
            else nn.Linear(n_filters, projection_dim)
        )
        self.output_dim = projection_dim or n_filters

    def forward(
        self,
        char_ids: torch.Tensor,
        n_chars: torch.Tensor,
        word_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        chars = self.embed(char_ids).transpose(1, 2)  # (U, char_dim, W)
        width = chars.shape[2]
        if not self.masked and width < self.max_chars:
            padding = self.embed.weight[self.padding][None, :, None]
        pooled = []
        for conv in self.convs:
            windows = widened(conv(chars))  # (U, n, W - w + 1); max-pooled fastest in float32
            if self.masked:
                starts = torch.arange(windows.shape[2], device=windows.device)
                outside = starts[None, None, :] >= n_chars[:, None, None]
                best = windows.masked_fill(outside, float("-inf")).amax(-1)
            else:
                best = windows.amax(-1)
                if width < self.max_chars:  # windows in the padding beyond W
                    all_padding = conv(padding.expand(-1, -1, conv.kernel_size[0]))
                    best = torch.maximum(best, widened(all_padding)[:, :, 0])
            pooled.append(self.activation(best))
        return self.projection(self.highway(torch.cat(pooled, dim=-1)))


class WordEncoder(nn.Module):
    """A word-embedding table and a projection: (U,) word ids -> (U, P)."""

    def __init__(self, vocab_size: int, word_dim: int, projection_dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.projection = nn.Linear(word_dim, projection_dim)

    def forward(
        self, word_ids: torch.Tensor, n_chars: torch.Tensor, _: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.projection(self.embed(word_ids))


class WordCharEncoder(nn.Module):
    """A word embedding beside the char CNN: [embed(word); highway(char CNN)]
    projected to P with a bias (ELMoForManyLangs' token encoder). The word
    table knows the vocabulary; the char CNN reads every word, seen or not.

    Input (U, W) character ids, (U,) ids per row and (U,) word ids; output (U, P).
    """

    def __init__(
        self,
        chars: CharIds,
        vocab_size: int,
        word_dim: int,
        char_dim: int,
        filters: list[tuple[int, int]],
        n_highway: int,
        projection_dim: int,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.chars = CharCNNEncoder(chars, char_dim, filters, n_highway, None, activation)
        self.projection = nn.Linear(word_dim + self.chars.output_dim, projection_dim)

    def forward(
        self, char_ids: torch.Tensor, n_chars: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        words = self.embed(word_ids)
        chars = self.chars(char_ids, n_chars)
        return self.projection(torch.cat([words, chars], dim=-1))
