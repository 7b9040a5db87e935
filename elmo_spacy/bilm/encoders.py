"""Context-independent token encoders: a character CNN or a word table."""

import torch
from torch import nn

from .vocab import N_CHARS


class Highway(nn.Module):
    """y = g * x + (1 - g) * relu(W x), g = sigmoid(V x), on (..., dim) inputs."""

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
    max-pooled over the characters, highway layers and a linear projection.

    Input (U, W) int64 character ids and (U,) ids per row; output (U, P).
    Unlike ELMo, windows that start in the padding after the end-of-word mark
    are masked out of the max-pooling, so a token's encoding does not depend
    on how wide the other tokens in its batch are.
    """

    def __init__(
        self,
        char_dim: int,
        filters: list[tuple[int, int]],
        n_highway: int,
        projection_dim: int,
        max_chars: int,
    ) -> None:
        super().__init__()
        if any(width > max_chars for width, _ in filters):
            raise ValueError(f"A char CNN filter is wider than max_chars={max_chars}")
        self.embed = nn.Embedding(N_CHARS, char_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(char_dim, n, w) for w, n in filters)
        n_filters = sum(n for _, n in filters)
        self.highway = Highway(n_filters, n_highway)
        self.projection = nn.Linear(n_filters, projection_dim)

    @property
    def widest_filter(self) -> int:
        return max(conv.kernel_size[0] for conv in self.convs)

    def forward(self, char_ids: torch.Tensor, n_chars: torch.Tensor) -> torch.Tensor:
        chars = self.embed(char_ids).transpose(1, 2)
        pooled = []
        for conv in self.convs:
            windows = conv(chars)
            starts = torch.arange(windows.shape[2], device=windows.device)
            outside = starts[None, None, :] >= n_chars[:, None, None]
            pooled.append(torch.relu(windows.masked_fill(outside, float("-inf")).amax(-1)))
        return self.projection(self.highway(torch.cat(pooled, dim=-1)))


class WordEncoder(nn.Module):
    """A word-embedding table and a projection: (U,) ids -> (U, P)."""

    def __init__(self, vocab_size: int, word_dim: int, projection_dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.projection = nn.Linear(word_dim, projection_dim)

    def forward(self, word_ids: torch.Tensor, n_chars: torch.Tensor) -> torch.Tensor:
        return self.projection(self.embed(word_ids))
