"""The softmax over the word vocabulary, shared by both directions."""

import math

import torch
from torch import nn

from ...errors import ElmoSpacyError
from .dtypes import padded_rows, without_autocast


class SoftmaxHead(nn.Module):
    """Summed negative log-likelihood of target word ids, over torch's
    adaptive softmax (kind "adaptive", exactly normalised) or one linear
    layer ("full", also where the vocabulary is too small for a cutoff)."""

    def __init__(
        self, dim: int, vocab_size: int, kind: str, cutoffs: list[int] | str, div_value: float = 4.0
    ) -> None:
        super().__init__()
        if cutoffs == "auto":
            cutoffs, div_value = fitted_cutoffs(vocab_size, dim, div_value)
        cutoffs = [c for c in cutoffs if 0 < c < vocab_size - 1]
        self.adaptive = kind == "adaptive" and bool(cutoffs)
        if self.adaptive and dim // div_value ** len(cutoffs) < 1:
            raise ElmoSpacyError(
                f"cutoffs = {cutoffs} (those below the vocabulary's {vocab_size} words), "
                f"div_value = {div_value}: the last tail cluster would be projected to "
                f"projection_dim / div_value^{len(cutoffs)} = {dim / div_value ** len(cutoffs):g} "
                "dimensions, below 1; give fewer cutoffs or a smaller div_value"
            )
        if self.adaptive:
            self.head = nn.AdaptiveLogSoftmaxWithLoss(dim, vocab_size, cutoffs, div_value=div_value)
        else:
            self.head = nn.Linear(dim, vocab_size)

    @property
    def div_value(self) -> float | None:
        return self.head.div_value if self.adaptive else None

    @property
    def cluster_starts(self) -> list[int]:
        """The first vocabulary id of each tail cluster."""
        return list(self.head.cutoffs[:-1]) if self.adaptive else []

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        splits: list[int],
        every_parameter: bool = False,
    ) -> torch.Tensor:
        """hidden (N, dim), targets (N,) int64, grouped by cluster as
        `LMTargets` groups them -> scalar summed NLL. `every_parameter`:
        parameters no row reaches join the sum times zero, so that
        data-parallel training needs no `find_unused_parameters`."""
        if hidden.shape[0] == 0:
            return hidden.sum() * 0.0 + (touched(self.parameters()) if every_parameter else 0.0)
        if self.adaptive:
            return adaptive_nll(self.head, hidden, targets, splits, every_parameter)
        return summed_nll(self.head(hidden), targets)


MAX_CLUSTER_WORDS = 100_000  # the largest tail cluster that "auto" cutoffs leave
AUTO_CUTOFFS = (2_000, 10_000, 50_000, 100_000)  # then every MAX_CLUSTER_WORDS


def fitted_cutoffs(vocab_size: int, dim: int, div_value: float) -> tuple[list[int], float]:
    """The cutoffs of `cutoffs = "auto"` (AUTO_CUTOFFS, then one every
    MAX_CLUSTER_WORDS, below the vocabulary's last id) and a div_value
    lowered where the last cluster would keep less than one dimension."""
    cutoffs = [c for c in AUTO_CUTOFFS if c < vocab_size - 1]
    while cutoffs and vocab_size - cutoffs[-1] > MAX_CLUSTER_WORDS:
        cutoffs.append(cutoffs[-1] + MAX_CLUSTER_WORDS)
    if cutoffs and dim / div_value ** len(cutoffs) < 1:
        div_value = max(1.0, math.floor(100 * dim ** (1 / len(cutoffs))) / 100)
    return cutoffs, div_value


def oversized_clusters(cutoffs: list[int], vocab_size: int) -> list[tuple[int, int]]:
    """The (first, end) word ids of each tail cluster over MAX_CLUSTER_WORDS."""
    bounds = [c for c in cutoffs if 0 < c < vocab_size - 1] + [vocab_size]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b - a > MAX_CLUSTER_WORDS]


def touched(parameters) -> torch.Tensor:
    """Zero, from one element of each parameter: gives each a zero gradient."""
    return sum(p.view(-1)[0] for p in parameters) * 0.0


def adaptive_nll(
    softmax: nn.AdaptiveLogSoftmaxWithLoss,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    splits: list[int],
    every_parameter: bool = False,
) -> torch.Tensor:
    """`softmax(hidden, targets).loss * N` as a float32 scalar, rows
    splits[i + 1]:splits[i + 2] those of tail cluster i (host-side: no
    synchronisation). The head's logits in the ambient precision over
    `padded_rows`; the tail clusters, log-softmax and sums in float32."""
    head_targets = targets.clone()
    nll = hidden.new_zeros((), dtype=torch.float32)
    bounds = [softmax.shortlist_size, *softmax.cutoffs[1:]]
    for i, tail in enumerate(softmax.tail):
        rows = slice(splits[i + 1], splits[i + 2])
        if rows.start == rows.stop:
            if every_parameter:
                nll = nll + touched(tail.parameters())
            continue
        head_targets[rows] = softmax.shortlist_size + i
        with without_autocast(hidden.device.type):
            projected = tail[0](hidden[rows].float())  # (rows, dim / 4^(i + 1))
            nll = nll + cluster_nll(projected, tail[1].weight, targets[rows] - bounds[i])
    n = hidden.shape[0]
    padded = hidden.new_zeros(padded_rows(n), hidden.shape[1])
    padded[:n] = hidden
    return nll + summed_nll(softmax.head(padded)[:n], head_targets)


CLUSTER_CHUNK = 65_536  # words of a tail cluster whose logits are computed at once
WHOLE_CLUSTER_LOGITS = 1 << 24  # logits (rows x words) of a tail cluster kept whole (64 MB)


def cluster_nll(
    projected: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """-sum_n log softmax(projected[n] @ weight.T)[targets[n]]: projected
    (N, d), weight (V, d), targets (N,). A large cluster runs CLUSTER_CHUNK
    words at a time (the logits recomputed backward), not N x V at once."""
    rows, words = projected.shape[0], weight.shape[0]
    whole = words <= CLUSTER_CHUNK or rows * words <= WHOLE_CLUSTER_LOGITS
    chunk = words if whole else CLUSTER_CHUNK
    return _ClusterNll.apply(projected, weight, targets, chunk)


class _ClusterNll(torch.autograd.Function):
    """A tail cluster's NLL, its (N, V) logits made once and reused in place."""

    @staticmethod
    def forward(ctx, projected, weight, targets, chunk):
        if chunk >= weight.shape[0]:
            logprob = projected @ weight.t()  # (N, V) logits, then in place their
            torch.log_softmax(logprob, dim=1, out=logprob)  # log-softmax (row by row)
            nll = -logprob.gather(1, targets[:, None])[:, 0]
            lse = None
        else:
            logprob = None
            for start in range(0, weight.shape[0], chunk):
                part = torch.logsumexp(projected @ weight[start : start + chunk].t(), dim=1)
                lse = part if start == 0 else torch.logaddexp(lse, part)
            nll = lse - (projected * weight[targets]).sum(dim=1)
        ctx.save_for_backward(projected, weight, targets, logprob, lse)
        ctx.chunk = chunk
        return nll.sum()

    @staticmethod
    def backward(ctx, grad):
        projected, weight, targets, logprob, lse = ctx.saved_tensors
        scaled = projected * grad  # (N, d)
        d_projected = torch.zeros_like(projected)
        d_weight = torch.empty_like(weight)
        for start in range(0, weight.shape[0], ctx.chunk):
            part = weight[start : start + ctx.chunk]
            if logprob is not None:
                probs = logprob.exp_()  # (N, V), in place: kept for this alone
            else:
                probs = torch.mm(projected, part.t()).sub_(lse[:, None]).exp_()  # (N, chunk)
            d_projected.addmm_(probs, part)
            torch.mm(probs.t(), scaled, out=d_weight[start : start + len(part)])
        d_projected.mul_(grad).sub_(weight[targets] * grad)
        d_weight.index_add_(0, targets, scaled, alpha=-1.0)
        return d_projected, d_weight, None, None


def summed_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-sum_n log softmax(logits[n])[targets[n]], the log-softmax in float32
    at least; its gradient from the kept log-softmax, without the float32
    copies torch's would make."""
    return _SummedNll.apply(logits, targets)


class _SummedNll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):
        with without_autocast(logits.device.type):
            wide = torch.promote_types(logits.dtype, torch.float32)
            logprob = torch.log_softmax(logits, dim=1, dtype=wide)
        ctx.save_for_backward(logprob, targets)
        ctx.logits_dtype = logits.dtype
        picked = logprob.gather(1, targets[:, None])[:, 0]
        return -picked.sum()

    @staticmethod
    def backward(ctx, grad):
        logprob, targets = ctx.saved_tensors
        grad_logits = torch.exp(logprob)
        grad_logits[torch.arange(len(targets), device=targets.device), targets] -= 1.0
        return grad_logits.mul_(grad).to(ctx.logits_dtype), None
