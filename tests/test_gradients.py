"""The hand-written backward passes against central differences.

Each test runs a layer forward, takes the backprop callback's gradients (of
the input and of every parameter) for a loss sum(Y * R) with a random R, and
compares them with (loss(x + eps) - loss(x - eps)) / (2 eps) for each input
element and for sampled parameter elements. Layers that run in float64
(the scalar mix, the torch BiLSTM wrapper) are checked in float64; the ones
that compute in float32 (layer norm's output, thinc's Relu and Linear) with
a larger step and tolerance.
"""

import numpy
import pytest
import torch
from spacy.tokens import Doc
from spacy.vocab import Vocab
from thinc.api import Model

from elmo_spacy.layers.layer_norm import normalize_layers
from elmo_spacy.layers.learned_mix import build_learned_mix
from elmo_spacy.layers.scalar_mix import build_scalar_mix, scalar_mix_node
from elmo_spacy.layers.textcat_bilstm import build_textcat_bilstm
from elmo_spacy.layers.torch_bilstm import TorchBiLSTM

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


def test_torch_bilstm_wrapper():
    X = [RNG.normal(size=(n, 3)) for n in (4, 0, 2)]
    lstm = TorchBiLSTM(nO=6, depth=2)
    lstm.initialize(X=[x.astype("f") for x in X])
    for name in lstm.param_names:
        lstm.set_param(name, lstm.get_param(name).astype("float64"))
    check_gradients(lstm, X, X, eps=1e-6, rtol=1e-4, atol=1e-6)


def _fixed_vectors(X: list) -> Model:
    """docs -> X[i] for the i-th doc; backprop returns the gradient of X."""

    def forward(model, docs, is_train):
        return [X[i] for i in range(len(docs))], lambda dY: dY

    return Model("fixed_vectors", forward, dims={"nO": X[0].shape[1]})


def test_textcat_bilstm():
    """The head as built: BiLSTM, [mean; max] pooling, ReLU, output layer, softmax."""
    words = [["a", "b", "c", "d"], [], ["e", "f", "g"]]
    docs = [Doc(Vocab(), words=w) for w in words]
    X = [RNG.normal(size=(len(w), 4)).astype("float32") for w in words]
    model = build_textcat_bilstm(
        _fixed_vectors(X), hidden_width=3, depth=1, mlp_width=5, dropout=0.0, nO=3
    )
    model.initialize(X=docs, Y=numpy.zeros((3, 3), dtype="f"))
    output = model.get_ref("output_layer")  # zeros at first: no gradient below it
    output.set_param("W", 0.3 * RNG.normal(size=output.get_param("W").shape).astype("f"))
    relu = [node for node in model.walk() if node.name == "relu"][0]
    relu.set_param("W", relu.get_param("W") * 0.1)
    relu.set_param("b", relu.get_param("b") + 1.0)  # every unit well past ReLU's kink
    Y = model.predict(docs)
    assert Y.min() > 0.05  # the softmax is not saturated
    check_gradients(model, docs, X, eps=3e-3, rtol=2e-2, atol=1e-4)


def test_torch_bilstm_computes_torchs_bidirectional_lstm_on_packed_sequences():
    """One-way LSTMs on padded, reversed-within-length input: the numbers of
    torch's own bidirectional LSTM on packed sequences, gradients included."""
    X = [RNG.normal(size=(n, 5)).astype("f") for n in (7, 0, 3, 1, 7, 5)]
    lstm = TorchBiLSTM(nO=8, depth=2)
    lstm.initialize(X=X)
    Y, backprop = lstm.begin_update(X)
    dY = [RNG.normal(size=y.shape).astype("f") for y in Y]
    dX = backprop(dY)

    reference = torch.nn.LSTM(5, 4, 2, bidirectional=True, batch_first=True)
    reference.load_state_dict({n: torch.from_numpy(lstm.get_param(n)) for n in lstm.param_names})
    kept = [x for x in X if len(x)]
    inputs = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(x) for x in kept], True)
    inputs.requires_grad_()
    lengths = torch.tensor([len(x) for x in kept])
    packed = torch.nn.utils.rnn.pack_padded_sequence(inputs, lengths, True, enforce_sorted=False)
    outputs = torch.nn.utils.rnn.pad_packed_sequence(reference(packed)[0], True)[0]
    (
        outputs * torch.nn.utils.rnn.pad_sequence([torch.from_numpy(d) for d in dY if len(d)], True)
    ).sum().backward()
    expected = [o[:n].detach().numpy() for o, n in zip(outputs, lengths)]
    expected_dX = [g[:n].numpy() for g, n in zip(inputs.grad, lengths)]
    assert [y.shape for y in Y] == [(len(x), 8) for x in X]
    for y, e, dx, de in zip(
        [y for y in Y if len(y)], expected, [d for d in dX if len(d)], expected_dX
    ):
        numpy.testing.assert_allclose(y, e, atol=1e-6)
        numpy.testing.assert_allclose(dx, de, atol=1e-6)
    for name, param in reference.named_parameters():
        numpy.testing.assert_allclose(lstm.get_grad(name), param.grad.numpy(), atol=1e-5)
