"""Every implementation of ELMo's LSTM layer against the reference step
(`elmo_spacy.bilm.model.lstm.lstm_step`): outputs, final states and every
gradient (of the inputs, the weights and the initial state), clipped and
unclipped, projected and not, in float32, bfloat16 and float16, with a
carried state wherever the implementation takes one.

A new fast path is one more row of IMPLEMENTATIONS.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import pytest
import torch

import elmo_spacy.bilm.runtime.recurrence as recurrence
from elmo_spacy.bilm.formats.exported import ServingBiLM
from elmo_spacy.bilm.model.lstm import lstm_step, plain_product, run_fused_layer, run_lstm_layer
from elmo_spacy.bilm.runtime.cell_steps import TritonCellSteps, triton_available
from elmo_spacy.bilm.runtime.graphs import GraphCache
from elmo_spacy.bilm.runtime.kernels import (
    masked_recurrence,
    packed_products,
    run_graphed_lstm_layer,
    run_training_layers,
)
from elmo_spacy.bilm.runtime.products import onednn_packing

LENGTHS = [7, 3, 0, 5]  # rows of every length: full, short, empty, middle
IN_DIM = 6


def reference_layer(layer, x, lengths, initial, cell_clip, proj_clip):
    """The definition, one row and one step at a time: `lstm_step` in plain
    float64 products. Returns y (B, T, P), zero past each row's length, and
    the state after each row's last step."""
    recur = plain_product(layer.weight_hh_l0)
    project = plain_product(layer.weight_hr_l0) if layer.proj_size else None
    gates_x = plain_product(layer.weight_ih_l0)(
        x.flatten(0, 1), layer.bias_ih_l0 + layer.bias_hh_l0
    )
    gates_x = gates_x.view(*x.shape[:2], -1)
    outputs, hs, cs = [], [], []
    for b, n in enumerate(lengths.tolist()):
        h, c = initial[0][b : b + 1], initial[1][b : b + 1]
        row = []
        for t in range(n):
            h, c = lstm_step(gates_x[b, t : t + 1], h, c, recur, project, cell_clip, proj_clip)
            row.append(h)
        row += [torch.zeros_like(h)] * (x.shape[1] - n)
        outputs.append(torch.cat(row))
        hs.append(h)
        cs.append(c)
    return torch.stack(outputs), (torch.cat(hs), torch.cat(cs))


def loop(layer, x, lengths, initial, cell_clip, proj_clip):
    return run_lstm_layer(layer, x, lengths, initial, cell_clip, proj_clip, final=True)


def loop_on_packed_weights(layer, x, lengths, initial, cell_clip, proj_clip):
    product = packed_products({})
    return run_lstm_layer(layer, x, lengths, initial, cell_clip, proj_clip, True, product)


def fused(layer, x, lengths, initial, cell_clip, proj_clip):
    return run_fused_layer(layer, x, lengths), None


def training(layer, x, lengths, initial, cell_clip, proj_clip):
    y = run_training_layers([layer], x[None], cell_clip, proj_clip)[0]
    return y, None


def training_on_triton_steps(layer, x, lengths, initial, cell_clip, proj_clip):
    original = recurrence.cell_steps_for
    recurrence.cell_steps_for = lambda device: TritonCellSteps
    try:
        return training(layer, x, lengths, initial, cell_clip, proj_clip)
    finally:
        recurrence.cell_steps_for = original


def masked(layer, x, lengths, initial, cell_clip, proj_clip):
    real = (torch.arange(x.shape[1])[:, None] < lengths[None, :])[..., None]
    gates_x = torch.addmm(
        layer.bias_ih_l0 + layer.bias_hh_l0, x.flatten(0, 1), layer.weight_ih_l0.t()
    )
    gates_x = gates_x.view(*x.shape[:2], -1).transpose(0, 1)
    w_hr = layer.weight_hr_l0.t() if layer.proj_size else None
    y, h, c = masked_recurrence(
        gates_x, real, *initial, layer.weight_hh_l0.t(), w_hr, cell_clip, proj_clip
    )
    return y.transpose(0, 1), (h, c)


def graphed(layer, x, lengths, initial, cell_clip, proj_clip):
    return run_graphed_lstm_layer(
        layer, x, lengths, initial, cell_clip, proj_clip, True, GraphCache()
    )


def exported(layer, x, lengths, initial, cell_clip, proj_clip, batched=False):
    """Layer 0 of the exported graph (`ServingBiLM._lstm_layer`), `layer` in
    both of its directions, with state inputs (each row's state stops at its
    last position); the forward direction's results."""

    def both(weight: torch.Tensor) -> torch.Tensor:  # (2, in, out), as x @ w takes it
        return torch.stack([weight.detach().T] * 2).contiguous()

    graph = SimpleNamespace(
        weight_ih0=both(layer.weight_ih_l0),
        bias0=both((layer.bias_ih_l0 + layer.bias_hh_l0)[None, :]).mT,
        # each direction's own copy: the scan refuses two inputs that alias
        forward_hh0=layer.weight_hh_l0.detach().T.clone(),
        backward_hh0=layer.weight_hh_l0.detach().T.clone(),
        forward_hr0=layer.weight_hr_l0.detach().T.clone() if layer.proj_size else None,
        backward_hr0=layer.weight_hr_l0.detach().T.clone() if layer.proj_size else None,
        projects=bool(layer.proj_size),
        cell_clip=cell_clip,
        proj_clip=proj_clip,
        with_states=True,
        batched_input_products=batched,
    )
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    h0, c0 = (torch.stack([state] * 2) for state in initial)
    y, h, c = ServingBiLM._lstm_layer(graph, 0, torch.stack([x, x]), mask, h0, c0)
    return y[0], (h[0], c[0])


@dataclass
class Implementation:
    run: Callable
    why: str  # the one-line reason it exists beside the reference
    gradients: bool = True  # runs under autograd (training)
    states: bool = True  # takes an initial state and gives the final one
    clips: bool = True
    precisions: tuple[str, ...] = ("float32", "bfloat16", "float16")
    available: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    device: Callable[[], str] = lambda: "cpu"  # where it runs in this test


def needs_cuda() -> str | None:
    return None if torch.cuda.is_available() else "runs on a CUDA GPU only"


def cuda_if_there() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


IMPLEMENTATIONS = {
    "loop": Implementation(
        loop, "rows leave the recurrence as they end: padding costs nothing (CPU inference, states)"
    ),
    "loop on packed weights": Implementation(
        loop_on_packed_weights,
        "weights packed once for oneDNN: about twice a plain GEMM at ELMo's small batches",
        gradients=False,
        precisions=("float32", "bfloat16"),
        available=lambda: None if onednn_packing() else "oneDNN cannot pack weights here",
    ),
    "fused": Implementation(
        fused,
        "torch's own LSTM: cuDNN on a GPU where nothing is clipped",
        states=False,
        clips=False,
    ),
    "training": Implementation(
        training,
        "products over all steps as single GEMMs, backward written out (CPU training)",
        states=False,
    ),
    "training on Triton steps": Implementation(
        training_on_triton_steps,
        "one kernel launch a step each way on a CUDA GPU (interpreted on the CPU without one)",
        states=False,
        available=lambda: None if triton_available() else "Triton is not installed",
        device=cuda_if_there,
    ),
    "masked loop": Implementation(
        masked, "fixed shapes (ended rows held still), as a CUDA graph captures them"
    ),
    "CUDA graph": Implementation(
        graphed,
        "one graph replay instead of ~10 launches a step (GPU inference)",
        gradients=False,
        available=needs_cuda,
        device=cuda_if_there,
    ),
    "exported": Implementation(
        exported,
        "a scan over time: an ONNX Loop, for serving without Python",
        gradients=False,
        precisions=("float32",),
    ),
    "exported, batched input products": Implementation(
        partial(exported, batched=True),
        "the input products of both directions at once (the int8 export's form)",
        gradients=False,
        precisions=("float32",),
    ),
}
TOLERANCE = {"float32": 2e-6, "bfloat16": 0.05, "float16": 0.01}  # of the largest value


def close(got: torch.Tensor, want: torch.Tensor, precision: str, what: str) -> None:
    got, want = got.detach().double(), want.detach().double()
    scale = max(float(want.abs().max()), 1.0)
    error = float((got - want).abs().max()) if want.numel() else 0.0
    assert error <= TOLERANCE[precision] * scale, f"{what}: off by {error:.3g}"


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("clips", [(0.0, 0.0), (0.4, 0.2)], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("cell_dim", [8, 6], ids=["projected", "unprojected"])
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.gpu] if impl.device is cuda_if_there else [])
        for name, impl in IMPLEMENTATIONS.items()
    ],
)
def test_each_implementation_computes_the_reference_step(name, cell_dim, clips, precision):
    impl = IMPLEMENTATIONS[name]
    assert impl.why
    if (reason := impl.available()) is not None:
        pytest.skip(reason)
    if precision not in impl.precisions or (clips[0] and not impl.clips):
        pytest.skip(f"{name} does not run {precision}{' clipped' if clips[0] else ''}")
    torch.manual_seed(0)
    device = impl.device()
    dim = 6
    layer = torch.nn.LSTM(
        IN_DIM, cell_dim, proj_size=dim if cell_dim != dim else 0, batch_first=True
    )
    layer = layer.to(device)
    lengths = torch.tensor(LENGTHS, device=device)
    x = torch.randn(len(LENGTHS), max(LENGTHS), IN_DIM, device=device)
    real = (torch.arange(x.shape[1], device=device)[None, :] < lengths[:, None])[..., None]
    if impl.states:
        initial = (
            0.5 * torch.randn(len(LENGTHS), dim, device=device),
            torch.randn(len(LENGTHS), cell_dim, device=device),
        )
    else:
        initial = (
            torch.zeros(len(LENGTHS), dim, device=device),
            torch.zeros(len(LENGTHS), cell_dim, device=device),
        )
    cotangent = torch.randn(*x.shape[:2], dim, device=device) * real  # weighs every real output

    reference = layer.double()
    ref_inputs = [x.double().requires_grad_(), *(s.double().requires_grad_() for s in initial)]
    ref_y, ref_state = reference_layer(reference, ref_inputs[0], lengths, ref_inputs[1:], *clips)
    ref_tensors = [*ref_inputs, *reference.parameters()]
    ref_grads = torch.autograd.grad((ref_y * cotangent.double()).sum(), ref_tensors)
    layer = layer.float()

    # as in the biLM: the layer's input in the precision computed in (the
    # encoder's output under autocast), states handed in as float32
    x_in = x.to(getattr(torch, precision)).requires_grad_(impl.gradients)
    inputs = [x_in, *(s.clone() for s in initial)]
    if impl.states and impl.gradients:
        inputs[1:] = [s.requires_grad_() for s in inputs[1:]]
    given = tuple(inputs[1:]) if impl.states else None
    grad_mode = torch.enable_grad() if impl.gradients else torch.no_grad()
    autocast = torch.autocast(
        device, dtype=getattr(torch, precision), enabled=precision != "float32"
    )
    with grad_mode, autocast:
        y, state = impl.run(layer, inputs[0], lengths, given, *clips)
    close(y * real, ref_y, precision, "outputs")
    if impl.states:
        close(state[0], ref_state[0], precision, "final h")
        close(state[1], ref_state[1], precision, "final c")
    if impl.gradients:
        tensors = [inputs[0], *(inputs[1:] if impl.states else []), *layer.parameters()]
        wanted = [ref_grads[0], *(ref_grads[1:3] if impl.states else []), *ref_grads[3:]]
        names = [
            "x",
            *(["h0", "c0"] if impl.states else []),
            *(n for n, _ in layer.named_parameters()),
        ]
        got = torch.autograd.grad((y.float() * cotangent).sum(), tensors, allow_unused=True)
        for n, g, w in zip(names, got, wanted):
            close(torch.zeros_like(w) if g is None else g, w, precision, f"gradient of {n}")


def test_every_implementation_says_why_it_is_not_the_reference():
    assert all(len(impl.why) > 20 for impl in IMPLEMENTATIONS.values())
