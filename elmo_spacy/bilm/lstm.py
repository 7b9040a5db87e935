"""One direction of the biLM: a stack of projected LSTM layers."""

import warnings

import torch
from torch import nn


class LstmStack(nn.Module):
    """L layers of `torch.nn.LSTM` with a projection of the cell to `dim` (the
    fused native kernel, so no cell clipping), with dropout between layers and a
    residual connection from each layer's input to its output after the first.

    Input (B, T, P); returns L tensors of shape (B, T, P), one per layer.
    Sequences are right-padded: positions after a row's length never affect the
    positions before it, so no packing is needed.
    """

    def __init__(self, n_layers: int, dim: int, cell_dim: int, dropout: float) -> None:
        super().__init__()
        # proj_size=0 when the cell is as wide as the output: no projection,
        # and torch can use its faster oneDNN kernel.
        proj_size = dim if cell_dim != dim else 0
        self.layers = nn.ModuleList(
            nn.LSTM(dim, cell_dim, proj_size=proj_size, batch_first=True) for _ in range(n_layers)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs = []
        for i, layer in enumerate(self.layers):
            with warnings.catch_warnings():
                # Noise: torch runs its own kernel instead, as it should.
                warnings.filterwarnings("ignore", "LSTM with projections is not supported")
                y, _ = layer(self.dropout(x))
            x = y + x if i > 0 else y
            outputs.append(x)
        return outputs
