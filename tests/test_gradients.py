"""The hand-written backward passes against central differences.

Each test runs a layer forward, takes the backprop callback's gradients (of
the input and of every parameter) for a loss sum(Y * R) with a random R, and
compares them with (loss(x + eps) - loss(x - eps)) / (2 eps) for each input
element and for sampled parameter elements. Layers that run in float64
(the scalar mix) are checked in float64; the ones
that compute in float32 (layer norm's output, thinc's Relu and Linear) with
a larger step and tolerance.
"""

import numpy
import pytest
import torch
from thinc.api import Model

from elmo_spacy.layers.layer_norm import normalize_layers
from elmo_spacy.layers.learned_mix import build_learned_mix
from elmo_spacy.layers.scalar_mix import build_scalar_mix, scalar_mix_node

RNG = numpy.random.default_rng(0)


@pytest.fixture(autouse=True)
def same_numbers_for_each_test():
    """Each test draws the same numbers, whichever tests run before it: torch's
    too, which starts the BiLSTM's weights (on some draws a max-pooled unit
    sits within the finite difference's step of a tie, and the check fails)."""
    global RNG
    RNG = numpy.random.default_rng(0)
    torch.manual_seed(0)


def _loss(Y, R) -> float:
    if isinstance(Y, list):
        return float(sum((numpy.asarray(y, "float64") * r).sum() for y, r in zip(Y, R)))
    return float((numpy.asarray(Y, "float64") * R).sum())


def _like(Y):
    if isinstance(Y, list):
        return [RNG.normal(size=y.shape).astype(y.dtype) for y in Y]
    return RNG.normal(size=Y.shape).astype(Y.dtype)


def _params(model: Model) -> list[tuple[Model, str]]:
    return [(node, name) for node in model.walk() for name in node.param_names]


def _sample(size: int, limit: int) -> numpy.ndarray:
    return numpy.arange(size) if size <= limit else RNG.choice(size, limit, replace=False)


def check_gradients(
    model: Model, X, inputs: list, eps: float, rtol: float, atol: float, limit: int = 40
) -> None:
    """`inputs`: the arrays inside X to differentiate (perturbed in place)."""
    for node, name in _params(model):
        if node.has_grad(name):
            node.set_grad(name, node.ops.alloc(node.get_param(name).shape, dtype="f"))
    Y, backprop = model(X, is_train=True)
    R = _like(Y)
    dX = backprop(R)
    if not isinstance(dX, list):
        dX = [dX]

    def loss() -> float:
        return _loss(model.predict(X), R)

    def numeric(array: numpy.ndarray, index: int) -> float:
        flat = array.reshape(-1)
        kept = flat[index]
        flat[index] = kept + eps
        up = loss()
        flat[index] = kept - eps
        down = loss()
        flat[index] = kept
        return (up - down) / (2 * eps)

    checked = 0
    for x, dx in zip(inputs, dX):
        assert dx.shape == x.shape
        for index in _sample(x.size, limit):
            expected = numeric(x, index)
            got = float(dx.reshape(-1)[index])
            assert got == pytest.approx(expected, rel=rtol, abs=atol), ("input", index)
            checked += 1
    for node, name in _params(model):
        param = node.get_param(name)  # forward read it; perturbing it in place changes it
        grad = node.get_grad(name)
        for index in _sample(param.size, limit):
            expected = numeric(param, index)
            got = float(grad.reshape(-1)[index])
            assert got == pytest.approx(expected, rel=rtol, abs=atol), (node.name, name, index)
            checked += 1
    assert checked > 0


def layers(*lengths: int, n_layers: int = 3, width: int = 4, dtype: str = "float64") -> list:
    """One (n_layers, n, width) array per doc of n tokens."""
    return [RNG.normal(size=(n_layers, n, width)).astype(dtype) for n in lengths]


def test_scalar_mix():
    X = layers(2, 0, 3)
    mix = build_scalar_mix(trainable=True, layer_norm=False, gamma=1.3)
    mix.initialize(X=X)
    node = scalar_mix_node(mix)
    node.set_param("lambdas", RNG.normal(size=3))
    node.set_param("gamma", numpy.asarray([1.3]))
    check_gradients(mix, X, X, eps=1e-6, rtol=1e-4, atol=1e-6)


def test_layer_norm():
    X = layers(2, 3, width=5)
    check_gradients(normalize_layers(), X, X, eps=1e-3, rtol=1e-2, atol=2e-3)


def test_learned_mix():
    X = layers(2, 3, dtype="float32")
    mix = build_learned_mix(nO=5, layer_norm=True)
    mix.initialize(X=X)
    relu = mix.get_ref("relu0")
    relu.set_param("b", relu.get_param("b") + 10.0)  # no unit at ReLU's kink
    check_gradients(mix, X, X, eps=1e-2, rtol=1e-2, atol=2e-3)
