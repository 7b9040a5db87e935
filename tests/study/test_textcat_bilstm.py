"""The study's classifier head (`scripts.TextCatBiLSTM.v1`) and its BiLSTM:
their backward passes against central differences (as tests/test_gradients.py
checks the plugin's layers), and the BiLSTM against torch's own."""

import numpy
import pytest
import torch
from spacy.tokens import Doc
from spacy.vocab import Vocab
from thinc.api import Model

from elmo_spacy.errors import ElmoSpacyError
from scripts.components import TorchBiLSTM, build_textcat_bilstm, concat_pool

from .. import test_gradients
from ..test_gradients import check_gradients, same_numbers_for_each_test  # noqa: F401  (autouse)


def test_torch_bilstm_wrapper():
    X = [test_gradients.RNG.normal(size=(n, 3)) for n in (4, 0, 2)]
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
    """The head as built: BiLSTM, [mean; max] pooling (the default), ReLU,
    output layer, softmax."""
    words = [["a", "b", "c", "d"], [], ["e", "f", "g"]]
    docs = [Doc(Vocab(), words=w) for w in words]
    X = [test_gradients.RNG.normal(size=(len(w), 4)).astype("float32") for w in words]
    model = build_textcat_bilstm(
        _fixed_vectors(X), hidden_width=3, depth=1, mlp_width=5, dropout=0.0, nO=3
    )
    model.initialize(X=docs, Y=numpy.zeros((3, 3), dtype="f"))
    output = model.get_ref("output_layer")  # zeros at first: no gradient below it
    output.set_param(
        "W", 0.3 * test_gradients.RNG.normal(size=output.get_param("W").shape).astype("f")
    )
    relu = [node for node in model.walk() if node.name == "relu"][0]
    relu.set_param("W", relu.get_param("W") * 0.1)
    relu.set_param("b", relu.get_param("b") + 1.0)  # every unit well past ReLU's kink
    Y = model.predict(docs)
    assert Y.min() > 0.05  # the softmax is not saturated
    check_gradients(model, docs, X, eps=3e-3, rtol=2e-2, atol=1e-4)


def test_ulmfits_concat_pooling_and_its_gradient():
    """["last", "max", "mean"]: the forward half at the last token and the
    backward half at the first, then max and mean; an empty doc pools to
    zeros. Then the head without a BiLSTM, pooling its tok2vec's vectors so."""
    X = [test_gradients.RNG.normal(size=(n, 4)).astype("float32") for n in (3, 0, 1)]
    pool = concat_pool(["last", "max", "mean"])
    Y = pool.predict(X)
    x = X[0]
    numpy.testing.assert_array_equal(Y[0, :2], x[-1, :2])
    numpy.testing.assert_array_equal(Y[0, 2:4], x[0, 2:])
    numpy.testing.assert_array_equal(Y[0, 4:8], x.max(axis=0))
    numpy.testing.assert_allclose(Y[0, 8:], x.mean(axis=0), rtol=1e-6)
    assert not Y[1].any()
    check_gradients(pool, X, X, eps=1e-3, rtol=1e-2, atol=1e-4)

    words = [["a", "b", "c"], [], ["e"]]
    docs = [Doc(Vocab(), words=w) for w in words]
    head = build_textcat_bilstm(
        _fixed_vectors(X), depth=0, mlp_width=5, dropout=0.0, nO=3, pooling=["last", "max", "mean"]
    )
    head.initialize(X=docs, Y=numpy.zeros((3, 3), dtype="f"))
    assert not any(node.name == "torch_bilstm" for node in head.walk())
    assert [n for n in head.walk() if n.name == "relu"][0].get_dim("nI") == 12
    with pytest.raises(ElmoSpacyError, match="pooling"):
        concat_pool(["first"])


def test_torch_bilstm_computes_torchs_bidirectional_lstm_on_packed_sequences():
    """One-way LSTMs on padded, reversed-within-length input: the numbers of
    torch's own bidirectional LSTM on packed sequences, gradients included."""
    X = [test_gradients.RNG.normal(size=(n, 5)).astype("f") for n in (7, 0, 3, 1, 7, 5)]
    lstm = TorchBiLSTM(nO=8, depth=2)
    lstm.initialize(X=X)
    Y, backprop = lstm.begin_update(X)
    dY = [test_gradients.RNG.normal(size=y.shape).astype("f") for y in Y]
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
