"""One direction of the biLM: a stack of projected LSTM layers."""

from typing import List

import torch
from torch import nn


class LstmStack(nn.Module):
    """L layers of `torch.nn.LSTM(proj_size=...)` (the fused native kernel, so no
    cell clipping), with dropout between layers and a residual connection from
    each layer's input to its output after the first layer.

    Input (B, T, P); returns L tensors of shape (B, T, P), one per layer.
    Sequences are right-padded: positions after a row's length never affect the
    positions before it, so no packing is needed.
    """

    def __init__(self, n_layers: int, dim: int, cell_dim: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.LSTM(dim, cell_dim, proj_size=dim, batch_first=True)
            for _ in range(n_layers)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        outputs = []
        for i, layer in enumerate(self.layers):
            y, _ = layer(self.dropout(x))
            x = y + x if i > 0 else y
            outputs.append(x)
        return outputs
