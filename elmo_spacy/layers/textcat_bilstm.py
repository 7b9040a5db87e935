"""A text classifier over token vectors: mixed ELMo vectors -> BiLSTM -> pooling -> MLP -> softmax."""

from collections.abc import Callable

from spacy.tokens import Doc
from thinc.api import Linear, Model, Relu, chain, softmax_activation, zero_init
from thinc.types import Floats2d

from .torch_bilstm import TorchBiLSTM


def build_textcat_bilstm(
    tok2vec: Model[list[Doc], list[Floats2d]],
    hidden_width: int = 128,
    depth: int = 2,
    mlp_width: int = 128,
    dropout: float = 0.2,
    linear_model: Model[list[Doc], Floats2d] | None = None,
    linear_model_dropout: float = 0.0,
    nO: int | None = None,
) -> Model[list[Doc], Floats2d]:
    """A text classifier over exclusive classes.

    tok2vec: one (n, width) array per doc, e.g. an `elmo_spacy.ElmoListener.v1`.
    hidden_width: LSTM units per direction; `depth` stacked bidirectional layers.
    Each doc is pooled to [mean; max] of the BiLSTM outputs (zeros for an
    empty doc), then a ReLU layer of `mlp_width` with dropout, and a linear
    layer to one score per class.
    linear_model: optional lexical model whose class scores are added before
    the softmax, e.g. `spacy.TextCatBOW.v3` with `no_output_layer = true`
    (bag-of-n-grams logits). In training, each doc's linear scores are left out
    with probability `linear_model_dropout`, so that the BiLSTM must classify
    those docs alone: a bag of n-grams fits the training docs within an epoch,
    after which the BiLSTM gets little gradient.
    Output: (n_docs, nO) class probabilities.
    """
    output_layer = Linear(nO=nO, init_W=zero_init)
    scores = chain(
        tok2vec,
        TorchBiLSTM(nO=2 * hidden_width, depth=depth, dropout=dropout),
        mean_max_pool(),
        Relu(nO=mlp_width, dropout=dropout),
        output_layer,
    )
    if linear_model is not None:
        scores = sum_scores(skip_empty_docs(linear_model), scores, dropout=linear_model_dropout)
    model = chain(scores, softmax_activation())
    model.set_ref("tok2vec", tok2vec)
    model.set_ref("output_layer", output_layer)
    model.attrs["multi_label"] = False
    if nO is not None:
        model.set_dim("nO", nO)
    return model


def sum_scores(
    first: Model[list[Doc], Floats2d], second: Model[list[Doc], Floats2d], dropout: float = 0.0
) -> Model[list[Doc], Floats2d]:
    """Two models from docs to (n_docs, nO) scores -> the sum of their scores.
    In training, the first model's row for a doc is left out with probability
    `dropout` (and gets no gradient for that doc)."""
    return Model(
        "sum_scores",
        _sum_forward,
        init=_init_parts,
        layers=[first, second],
        dims={"nO": None},
        attrs={"dropout": dropout},
    )


def _init_parts(model: Model, X: list[Doc] | None = None, Y: Floats2d | None = None) -> None:
    """Initialise each part, with the number of classes from Y; nO is theirs."""
    for layer in model.layers:
        if Y is not None and layer.has_dim("nO") is None:
            layer.set_dim("nO", Y.shape[1])
        layer.initialize(X=X, Y=Y)
    model.set_dim("nO", model.layers[0].get_dim("nO"))


def _sum_forward(model: Model, docs: list[Doc], is_train: bool) -> tuple[Floats2d, Callable]:
    first, second = model.layers
    Y1, backprop_first = first(docs, is_train)
    Y2, backprop_second = second(docs, is_train)
    keep = model.ops.alloc2f(len(docs), 1) + 1.0
    if is_train and model.attrs["dropout"] > 0:
        keep = model.ops.get_dropout_mask((len(docs), 1), model.attrs["dropout"])
        keep = keep * (1.0 - model.attrs["dropout"])  # 0 or 1: no rescaling

    def backprop(dY: Floats2d) -> list[Doc]:
        backprop_first(dY * keep)
        backprop_second(dY)
        return []

    return Y1 * keep + Y2, backprop


def skip_empty_docs(layer: Model[list[Doc], Floats2d]) -> Model[list[Doc], Floats2d]:
    """Run `layer` on the non-empty docs only; empty docs score zeros.
    spaCy's bag-of-n-grams (ngram_size > 1) fails on a batch that mixes empty
    and non-empty docs (thinc 8.3 `ops.ngrams`: "Out of bounds on buffer access")."""
    return Model(
        "skip_empty_docs", _skip_empty_forward, init=_init_parts, layers=[layer], dims={"nO": None}
    )


def _skip_empty_forward(model: Model, docs: list[Doc], is_train: bool) -> tuple[Floats2d, Callable]:
    layer = model.layers[0]
    rows = [i for i, doc in enumerate(docs) if len(doc)]
    Y = model.ops.alloc2f(len(docs), layer.get_dim("nO"))
    if not rows:
        return Y, lambda dY: []
    scores, backprop_layer = layer([docs[i] for i in rows], is_train)
    Y[rows] = scores

    def backprop(dY: Floats2d) -> list[Doc]:
        backprop_layer(dY[rows])
        return []

    return Y, backprop


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
