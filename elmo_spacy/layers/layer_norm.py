"""Per-token normalisation of each biLM layer, before the layers are mixed."""

from collections.abc import Callable

from thinc.api import Model
from thinc.types import Floats3d

EPSILON = 1e-5


def normalize_layers() -> Model[list[Floats3d], list[Floats3d]]:
    """Scale each token's vector in each layer to zero mean and unit variance
    over its width (no learned parameters, no batch statistics): (L + 1, n, width)
    -> the same shape. ELMo's layers differ in scale by an order of magnitude;
    this keeps one layer from swamping the mix and downstream units from saturating."""
    return Model("normalize_layers", forward)


def forward(model: Model, X: list[Floats3d], is_train: bool) -> tuple[list[Floats3d], Callable]:
    xp = model.ops.xp
    normalized, inverse_stds = [], []
    for x in X:
        centred = x - x.mean(axis=-1, keepdims=True)
        inverse_std = 1.0 / xp.sqrt((centred**2).mean(axis=-1, keepdims=True) + EPSILON)
        normalized.append((centred * inverse_std).astype("float32"))
        inverse_stds.append(inverse_std)

    def backprop(dY: list[Floats3d]) -> list[Floats3d]:
        dX = []
        for dy, y, inverse_std in zip(dY, normalized, inverse_stds):
            dx = dy - dy.mean(axis=-1, keepdims=True) - y * (dy * y).mean(axis=-1, keepdims=True)
            dX.append((dx * inverse_std).astype("float32"))
        return dX

    return normalized, backprop
