"""The softmax over the word vocabulary, shared by both directions."""

import torch
from torch import nn

from .precision import autocast_dtype, padded_rows


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
        if self.adaptive and autocast_dtype(hidden.device.type) is not None:
            return adaptive_nll(self.head, hidden, targets)
        if self.adaptive:
            return self.head(hidden, targets).loss * hidden.shape[0]
        # Under autocast, cross_entropy takes the logits in float32.
        return nn.functional.cross_entropy(self.head(hidden), targets, reduction="sum")


def adaptive_nll(
    softmax: nn.AdaptiveLogSoftmaxWithLoss, hidden: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The summed NLL that `softmax(hidden, targets).loss * N` gives, for
    reduced precision: the head's logits come from its layer in the ambient
    precision (autocast), over rows padded to a few sizes (`padded_rows`:
    each new shape of a bfloat16 product costs a kernel build); the tail
    clusters, narrow products (dim / 4 and less) of a different number of
    rows each batch, run in float32; the log-softmax and the sums are
    float32. hidden (N, dim), targets (N,) int64 -> scalar float32."""
    head_targets = targets.clone()
    nll = hidden.new_zeros((), dtype=torch.float32)
    bounds = [softmax.shortlist_size, *softmax.cutoffs[1:]]
    for i, tail in enumerate(softmax.tail):
        rows = ((targets >= bounds[i]) & (targets < bounds[i + 1])).nonzero().squeeze(1)
        if len(rows) == 0:
            continue
        head_targets[rows] = softmax.shortlist_size + i
        with torch.autocast(hidden.device.type, enabled=False):
            logits = tail(hidden[rows].float())
        logprob = torch.log_softmax(logits, dim=1)
        nll = nll - logprob.gather(1, (targets[rows] - bounds[i])[:, None]).sum()
    n = hidden.shape[0]
    padded = hidden.new_zeros(padded_rows(n), hidden.shape[1])
    padded[:n] = hidden
    head_logprob = torch.log_softmax(softmax.head(padded)[:n].float(), dim=1)
    return nll - head_logprob.gather(1, head_targets[:, None]).sum()
