"""A learned function of the layers: an MLP over their concatenation."""

from collections.abc import Callable

from thinc.api import Dropout, Model, Relu, chain, with_array
from thinc.types import Floats2d, Floats3d

from ..errors import ElmoSpacyError
from .layer_norm import normalize_layers


def build_learned_mix(
    nO: int | None = None, depth: int = 1, dropout: float = 0.0, layer_norm: bool = True
) -> Model[list[Floats3d], list[Floats2d]]:
    """Concatenate each token's L + 1 layer vectors and apply `depth` ReLU
    layers of width `nO` (by default the layers' width): one (L + 1, n, width)
    array per doc -> one (n, nO) array. layer_norm: normalise each token's
    vector in each layer first."""
    if depth < 1:
        raise ElmoSpacyError("learned mix: depth must be >= 1")
    relus = [Relu(nO=nO) for _ in range(depth)]
    blocks = [chain(relu, Dropout(dropout)) if dropout else relu for relu in relus]
    mlp = blocks[0] if depth == 1 else chain(*blocks)
    layers = [normalize_layers()] if layer_norm else []
    model = chain(*layers, concatenate_layers(), with_array(mlp))
    model.init = _init
    model.attrs["relus"] = len(relus)
    for i, relu in enumerate(relus):
        model.set_ref(f"relu{i}", relu)
    return model


def _init(model: Model, X: list[Floats3d] | None = None, Y=None) -> None:
    relus = [model.get_ref(f"relu{i}") for i in range(model.attrs["relus"])]
    if X:
        width = X[0].shape[2]
        for relu in relus:
            if relu.has_dim("nO") is None:
                relu.set_dim("nO", width)
    for layer in model.layers:
        layer.initialize(X=X)
        X = layer.predict(X) if X is not None else None
    model.set_dim("nO", relus[-1].get_dim("nO"), force=True)


def concatenate_layers() -> Model[list[Floats3d], list[Floats2d]]:
    """(L + 1, n, width) -> (n, (L + 1) * width) for each doc."""
    return Model("concatenate_layers", _concatenate_forward)


def _concatenate_forward(
    model: Model, X: list[Floats3d], is_train: bool
) -> tuple[list[Floats2d], Callable]:
    xp = model.ops.xp
    shapes = [x.shape for x in X]
    Y = [
        xp.ascontiguousarray(x.transpose(1, 0, 2)).reshape(x.shape[1], x.shape[0] * x.shape[2])
        for x in X
    ]

    def backprop(dY: list[Floats2d]) -> list[Floats3d]:
        return [
            xp.ascontiguousarray(dy.reshape(s[1], s[0], s[2]).transpose(1, 0, 2))
            for dy, s in zip(dY, shapes)
        ]

    return Y, backprop
