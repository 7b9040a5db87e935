"""A bidirectional LSTM run by torch's fused kernels, with its weights held as thinc params.

Keeping the weights as thinc params (not in a PyTorch shim) lets the input
width be inferred at initialisation and serialises them with msgpack like any
other thinc layer. The params are those of a bidirectional `torch.nn.LSTM`;
each call runs `torch.func.functional_call` on weightless (meta-device)
one-layer, one-way LSTMs, a layer and a direction at a time.
"""

from collections.abc import Callable

import torch
from thinc.api import Model, torch2xp, xp2torch
from thinc.types import Floats2d
from torch.func import functional_call

from ..bilm.inputs.batch import gather_time, reverse_index
from ..errors import ElmoSpacyError


def TorchBiLSTM(
    nO: int | None = None, nI: int | None = None, depth: int = 1, dropout: float = 0.0
) -> Model[list[Floats2d], list[Floats2d]]:
    """Sequences (n, nI) -> (n, nO); nO = 2 * units per direction."""
    if nO is not None and nO % 2:
        raise ElmoSpacyError(f"TorchBiLSTM: nO={nO} must be even (two directions)")
    if depth < 1:
        raise ElmoSpacyError("TorchBiLSTM: depth must be >= 1")
    return Model(
        "torch_bilstm",
        forward,
        init=init,
        dims={"nO": nO, "nI": nI},
        params={name: None for name in _param_names(depth)},
        attrs={"depth": depth, "dropout": dropout},
    )


def _param_names(depth: int) -> list[str]:
    return [
        f"{kind}_l{layer}{suffix}"
        for layer in range(depth)
        for suffix in ("", "_reverse")
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    ]


def _lstm(nI: int, units: int, device: str) -> torch.nn.LSTM:
    """One layer, one direction: the unit that torch's oneDNN kernel runs."""
    return torch.nn.LSTM(nI, units, batch_first=True, device=device)


def init(model: Model, X: list[Floats2d] | None = None, Y=None) -> None:
    if X:
        model.set_dim("nI", X[0].shape[1], force=True)
    lstm = torch.nn.LSTM(
        model.get_dim("nI"), model.get_dim("nO") // 2, model.attrs["depth"], bidirectional=True
    )
    for name, value in lstm.named_parameters():
        model.set_param(name, model.ops.asarray(value.detach().numpy()))


def forward(model: Model, X: list[Floats2d], is_train: bool) -> tuple[list[Floats2d], Callable]:
    ops = model.ops
    nO = model.get_dim("nO")
    lengths = [len(x) for x in X]
    rows = [i for i, n in enumerate(lengths) if n]
    if not rows:
        return [ops.alloc2f(0, nO) for _ in X], lambda dY: [ops.alloc2f(*x.shape) for x in X]
    with torch.set_grad_enabled(is_train):
        params = {
            name: xp2torch(model.get_param(name), requires_grad=is_train)
            for name in model.param_names
        }
        inputs = xp2torch(ops.pad([X[i] for i in rows]), requires_grad=is_train)
        row_lengths = torch.tensor([lengths[i] for i in rows], device=inputs.device)
        outputs = _bidirectional(model, params, inputs, row_lengths, is_train)
    padded = torch2xp(outputs.detach())
    Y = [ops.alloc2f(0, nO) for _ in X]
    for j, i in enumerate(rows):
        Y[i] = padded[j, : lengths[i]].copy()

    def backprop(dY: list[Floats2d]) -> list[Floats2d]:
        d_outputs = torch.zeros_like(outputs)
        for j, i in enumerate(rows):
            d_outputs[j, : lengths[i]] = xp2torch(dY[i])
        names = list(params)
        grads = torch.autograd.grad(outputs, [params[n] for n in names] + [inputs], d_outputs)
        for name, grad in zip(names, grads):
            model.inc_grad(name, torch2xp(grad))
        d_inputs = torch2xp(grads[-1])
        dX = [ops.alloc2f(*x.shape) for x in X]
        for j, i in enumerate(rows):
            dX[i] = d_inputs[j, : lengths[i]].copy()
        return dX

    return Y, backprop


def _bidirectional(
    model: Model,
    params: dict[str, torch.Tensor],
    inputs: torch.Tensor,
    lengths: torch.Tensor,
    is_train: bool,
) -> torch.Tensor:
    """(batch, time, nI) inputs, padded after each sequence's `lengths` ->
    (batch, time, nO) outputs, zeros at the padding.

    Each layer runs each direction as a one-way LSTM on padded input: the
    backward one on the sequences reversed within their lengths, so that its
    padding comes last too, where it changes no output. A bidirectional LSTM
    on packed sequences computes the same, but on the CPU only padded float32
    input reaches torch's oneDNN kernel, the faster one to train
    (`benchmarks/head_bilstm.py` compares them)."""
    units = model.get_dim("nO") // 2
    steps = torch.arange(inputs.shape[1], device=inputs.device)
    inside = (steps < lengths[:, None])[:, :, None]  # (batch, time, 1)
    reverse = reverse_index(lengths, inputs.shape[1])
    hidden = inputs
    for layer in range(model.attrs["depth"]):
        if layer:
            hidden = torch.nn.functional.dropout(hidden, model.attrs["dropout"], is_train)
        lstm = _lstm(hidden.shape[2], units, "meta")  # both directions' shape
        directions = []
        for suffix, flip in (("", False), ("_reverse", True)):
            weights = {
                f"{kind}_l0": params[f"{kind}_l{layer}{suffix}"]
                for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            }
            seen = gather_time(hidden, reverse) if flip else hidden
            out = functional_call(lstm, weights, (seen,))[0]
            directions.append(gather_time(out, reverse) if flip else out)
        hidden = torch.cat(directions, dim=2) * inside
    return hidden
