"""The softmax over the word vocabulary, shared by both directions."""

import torch
from torch import nn


class SoftmaxHead(nn.Module):
    """Summed negative log-likelihood of target word ids.

    kind="adaptive" uses torch's adaptive softmax (Grave et al. 2017): frequent
    words in a small head, rare ones in cheaper tail clusters. Its probabilities
    are exactly normalised over the whole vocabulary, so perplexities are exact.
    kind="full" is one linear layer over the vocabulary (the costly baseline).
    Falls back to "full" when the vocabulary is too small for any cutoff.
    """

    def __init__(self, dim: int, vocab_size: int, kind: str, cutoffs: list[int]) -> None:
        super().__init__()
        cutoffs = [c for c in cutoffs if 0 < c < vocab_size - 1]
        self.adaptive = kind == "adaptive" and bool(cutoffs)
        if self.adaptive:
            self.head = nn.AdaptiveLogSoftmaxWithLoss(dim, vocab_size, cutoffs, div_value=4.0)
        else:
            self.head = nn.Linear(dim, vocab_size)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """hidden (N, dim) float, targets (N,) int64 -> scalar summed NLL."""
        if hidden.shape[0] == 0:
            return hidden.sum() * 0.0
        if self.adaptive:
            return self.head(hidden, targets).loss * hidden.shape[0]
        return nn.functional.cross_entropy(self.head(hidden), targets, reduction="sum")
