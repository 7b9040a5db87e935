"""Token encoders (a character CNN, a word table, or both): each maps a
`TokenBatch`'s types to (U, P), `forward(type_inputs, type_chars, type_word_ids)`.
"""

import torch
from torch import nn

from ...errors import ElmoSpacyError
from ..inputs.chars import CharIds
from .config import BiLMConfig
from .dtypes import widened


class Highway(nn.Module):
    """y = g * x + (1 - g) * relu(W x), g = sigmoid(V x), on (..., dim) inputs
    (bilm-tf's gate is 1 - g: V = -C)."""

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(n_layers))
        for layer in self.layers:
            # start by carrying the input through, as ELMo does
            nn.init.constant_(layer.bias[dim:], 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden, gate = layer(x).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            x = gate * x + (1 - gate) * torch.relu(hidden)
        return x


class CharCNNEncoder(nn.Module):
    """ELMo's token encoder: character embeddings, convolutions max-pooled over
    the characters, an activation, highway layers and a projection (none for
    `projection_dim` None). (U, W) character ids and (U,) ids per row -> (U, P).

    A batch holds only the W <= max_chars columns it needs. With masked ids,
    windows past a token's end mark are left out of the pooling; with
    unmasked ones, a window wholly in the padding beyond W scores the same for
    every token, so it is computed once and joins each token's max.
    """

    def __init__(self, config: BiLMConfig, chars: CharIds, projection_dim: int | None) -> None:
        super().__init__()
        char_dim, filters, max_chars = config.char_dim, config.filters, chars.max_chars
        if any(width > max_chars for width, _ in filters):
            raise ElmoSpacyError(f"A char CNN filter is wider than max_chars={max_chars}")
        self.max_chars = max_chars
        self.padding = chars.padding
        self.masked = chars.masked
        self.embed = nn.Embedding(
            chars.n_ids, char_dim, padding_idx=chars.padding if self.masked else None
        )
        self.convs = nn.ModuleList(nn.Conv1d(char_dim, n, w) for w, n in filters)
        self.activation = torch.relu if config.char_activation == "relu" else torch.tanh
        n_filters = sum(n for _, n in filters)
        self.highway = Highway(n_filters, config.n_highway)
        # bilm-tf projects only when the widths differ; other models always do.
        keep_width = chars.scheme == "bilm_tf" and n_filters == projection_dim
        self.projection: nn.Module = (
            nn.Identity()
            if projection_dim is None or keep_width
            else nn.Linear(n_filters, projection_dim)
        )
        self.output_dim = projection_dim or n_filters

    def forward(
        self, char_ids: torch.Tensor, n_chars: torch.Tensor, word_ids: torch.Tensor | None = None
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

    def __init__(self, config: BiLMConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.word_dim, padding_idx=0)
        self.projection = nn.Linear(config.word_dim, config.projection_dim)

    def forward(
        self, word_ids: torch.Tensor, n_chars: torch.Tensor, _: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.projection(self.embed(word_ids))


class WordCharEncoder(nn.Module):
    """[embed(word); highway(char CNN)] projected to P (ELMoForManyLangs'
    token encoder): (U, W) character ids, (U,) ids per row, (U,) word ids.
    """

    def __init__(self, config: BiLMConfig, chars: CharIds, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.word_dim, padding_idx=0)
        self.chars = CharCNNEncoder(config, chars, None)
        width = config.word_dim + self.chars.output_dim
        self.projection = nn.Linear(width, config.projection_dim)

    def forward(
        self, char_ids: torch.Tensor, n_chars: torch.Tensor, word_ids: torch.Tensor
    ) -> torch.Tensor:
        words = self.embed(word_ids)
        chars = self.chars(char_ids, n_chars)
        return self.projection(torch.cat([words, chars], dim=-1))
