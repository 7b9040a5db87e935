"""The seeds' downstream classifier: mixed ELMo vectors -> BiLSTM -> pooling -> MLP -> softmax."""

from collections.abc import Callable

from spacy.tokens import Doc
from thinc.api import Model, Relu, Softmax, chain
from thinc.types import Floats2d

from .torch_bilstm import TorchBiLSTM


def build_textcat_bilstm(
    tok2vec: Model[list[Doc], list[Floats2d]],
    hidden_width: int = 128,
    depth: int = 2,
    mlp_width: int = 128,
    dropout: float = 0.2,
    nO: int | None = None,
) -> Model[list[Doc], Floats2d]:
    """A text classifier over exclusive classes.

    tok2vec: one (n, width) array per doc, e.g. an `elmo_spacy.ElmoListener.v1`.
    hidden_width: LSTM units per direction; `depth` stacked bidirectional layers.
    Each doc is pooled to [mean; max] of the BiLSTM outputs (zeros for an
    empty doc), then a ReLU layer of `mlp_width` with dropout, and a softmax.
    Output: (n_docs, nO) class probabilities.
    """
    output_layer = Softmax(nO=nO)
    model = chain(
        tok2vec,
        TorchBiLSTM(nO=2 * hidden_width, depth=depth, dropout=dropout),
        mean_max_pool(),
        Relu(nO=mlp_width, dropout=dropout),
        output_layer,
    )
    model.set_ref("tok2vec", tok2vec)
    model.set_ref("output_layer", output_layer)
    model.attrs["multi_label"] = False
    if nO is not None:
        model.set_dim("nO", nO)
    return model


def mean_max_pool() -> Model[list[Floats2d], Floats2d]:
    """One (n, width) array per doc -> (n_docs, 2 * width) rows [mean; max].
    An empty doc pools to zeros."""
    return Model("mean_max_pool", _pool_forward)


def _pool_forward(model: Model, X: list[Floats2d], is_train: bool) -> tuple[Floats2d, Callable]:
    ops = model.ops
    width = X[0].shape[1] if X else 0
    Y = ops.alloc2f(len(X), 2 * width)
    argmax = []
    for i, x in enumerate(X):
        if len(x):
            Y[i, :width] = x.mean(axis=0)
            best = x.argmax(axis=0)
            Y[i, width:] = x[best, ops.xp.arange(width)]
            argmax.append(best)
        else:
            argmax.append(None)

    def backprop(dY: Floats2d) -> list[Floats2d]:
        dX = []
        for i, x in enumerate(X):
            dx = ops.alloc2f(*x.shape)
            if len(x):
                dx += dY[i, :width] / len(x)
                dx[argmax[i], ops.xp.arange(width)] += dY[i, width:]
            dX.append(dx)
        return dX

    return Y, backprop
