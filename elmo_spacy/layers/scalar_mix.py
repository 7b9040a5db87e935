"""ELMo's scalar mix: y = gamma * sum_l softmax(lambda)_l * h_l."""

from collections.abc import Callable, Sequence

import numpy
from thinc.api import Model, chain
from thinc.types import Floats1d, Floats2d, Floats3d

from ..errors import ElmoSpacyError
from .bilm_model import N_OUTPUT_LAYERS
from .layer_norm import normalize_layers


def build_scalar_mix(
    trainable: bool = True,
    weights: Sequence[float] | None = None,
    gamma: float = 1.0,
    seed: int = 0,
    layer_norm: bool = True,
    dropout: float = 0.0,
) -> Model[list[Floats3d], list[Floats2d]]:
    """Mix the L + 1 layers of each doc with softmax-normalised weights λ and
    a scale γ: one (L + 1, n, width) array per doc -> one (n, width) array.

    trainable: learn λ and γ with the downstream task; false: both stay as they start.
    weights: initial layer weights; omitted: uniform if trainable, else seeded-random (`seed`).
    gamma: initial scale γ.
    layer_norm: normalise each token's vector in each layer first.
    dropout: in training, of the mixed vectors' units (not spaCy's [training] dropout).
    """
    if not 0.0 <= dropout < 1.0:
        raise ElmoSpacyError(f"scalar mix: dropout = {dropout}, must be in [0, 1)")
    mix = Model(
        "scalar_mix",
        forward,
        init=init,
        dims={"nO": None, N_OUTPUT_LAYERS: len(weights) if weights else None},
        params={"lambdas": None, "gamma": None},
        attrs={
            "trainable": trainable,
            "weights": list(weights or []),
            "gamma": gamma,
            "seed": seed,
            "dropout": dropout,
        },
    )
    return chain(normalize_layers(), mix) if layer_norm else mix


def init(model: Model, X: list[Floats3d] | None = None, Y=None) -> None:
    if X:
        model.set_dim(N_OUTPUT_LAYERS, X[0].shape[0], force=True)
        model.set_dim("nO", X[0].shape[2], force=True)
    n_layers = model.get_dim(N_OUTPUT_LAYERS)
    weights = model.attrs["weights"]
    if weights:
        if len(weights) != n_layers:
            raise ElmoSpacyError(f"scalar mix: {len(weights)} weights for {n_layers} layers")
        lambdas = numpy.log(numpy.asarray(weights, dtype="f") / sum(weights))
    elif model.attrs["trainable"]:
        lambdas = numpy.zeros(n_layers, dtype="f")
    else:
        lambdas = numpy.random.default_rng(model.attrs["seed"]).normal(size=n_layers).astype("f")
    model.set_param("lambdas", model.ops.asarray1f(lambdas))
    model.set_param("gamma", model.ops.asarray1f([model.attrs["gamma"]]))


def layer_weights(model: Model) -> Floats1d:
    """The normalised weights softmax(λ), one per layer, of a scalar mix."""
    return model.ops.softmax(scalar_mix_node(model).get_param("lambdas"))


def scalar_mix_node(model: Model) -> Model:
    """The layer that holds λ and γ, in a scalar mix with or without layer norm."""
    for node in model.walk():
        if node.name == "scalar_mix":
            return node
    raise ElmoSpacyError(f"{model.name} is not a scalar mix")


def forward(model: Model, X: list[Floats3d], is_train: bool) -> tuple[list[Floats2d], Callable]:
    ops = model.ops
    lengths = [x.shape[1] for x in X]
    if not X:
        return [], lambda dY: []
    stacked = ops.xp.concatenate(X, axis=1)  # (L + 1, N, width)
    weights = layer_weights(model)
    gamma = float(model.get_param("gamma")[0])
    mixed = ops.xp.tensordot(weights, stacked, axes=1)  # (N, width)
    rate = model.attrs["dropout"] if is_train else 0.0
    mask = ops.get_dropout_mask(mixed.shape, rate) if rate else None
    Y = _split(ops, gamma * mixed * (1.0 if mask is None else mask), lengths)

    def backprop(dY: list[Floats2d]) -> list[Floats3d]:
        d_mixed = ops.xp.concatenate(dY, axis=0)
        if mask is not None:
            d_mixed = d_mixed * mask
        if model.attrs["trainable"]:
            d_weights = gamma * ops.xp.einsum("lnd,nd->l", stacked, d_mixed)
            d_lambdas = weights * (d_weights - (weights * d_weights).sum())
            model.inc_grad("lambdas", d_lambdas.astype("f"))
            model.inc_grad("gamma", ops.asarray1f([(mixed * d_mixed).sum()]))
        dX = (gamma * weights)[:, None, None] * d_mixed[None]
        return _split(ops, dX.astype("f"), lengths, axis=1)

    return Y, backprop


def _split(ops, array, lengths: list[int], axis: int = 0) -> list:
    """Cut `array` into contiguous pieces of the given lengths along `axis`."""
    ends = numpy.cumsum(lengths)[:-1].tolist()
    return [ops.xp.ascontiguousarray(a) for a in ops.xp.split(array, ends, axis=axis)]
