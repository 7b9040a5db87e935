"""Every implementation of ELMo's LSTM layer against the reference step
(`elmo_spacy.bilm.model.lstm.lstm_step`): outputs, final states and every
gradient (of the inputs, the weights and the initial state), clipped and
unclipped, projected and not, in float32, bfloat16 and float16, with a
carried state wherever the implementation takes one (and left as given).

A new fast path is one more row of IMPLEMENTATIONS. Below the table: what
one row cannot show (layers run together, which kernel runs when, the
network alone against the biLM on its kernels, Triton's kernels compiled
for a GPU without one).
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import pytest
import torch

import elmo_spacy.bilm.runtime.kernels as kernels
import elmo_spacy.bilm.runtime.recurrence as recurrence
from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.bilm.formats.exported import ServingBiLM
from elmo_spacy.bilm.model.dtypes import ROW_BLOCK, padded_rows
from elmo_spacy.bilm.model.lstm import lstm_step, plain_product, run_fused_layer, run_lstm_layer
from elmo_spacy.bilm.runtime.cell_steps import (
    TorchCellSteps,
    TritonCellSteps,
    cell_steps_for,
    triton_available,
)
from elmo_spacy.bilm.runtime.kernels import choose_kernel, packed_products, run_training_layers
from elmo_spacy.bilm.runtime.products import onednn_packing
from elmo_spacy.bilm.runtime.recurrence import lstm_layer_for_training

from .conftest import ROOT, TINY_BILM
from .kernels import forced_kernel

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
    starts = None if initial is None else tuple(s[None] for s in initial)
    y, ends = run_training_layers([layer], x[None], cell_clip, proj_clip, starts, lengths)
    return y[0], (ends[0][0], ends[1][0])


class SmallBlockTritonSteps(TritonCellSteps):
    BLOCK = 4  # so that the table's cells (8 and 6 units) span blocks, the last one part


def training_on_triton_steps(layer, x, lengths, initial, cell_clip, proj_clip, block=False):
    original = recurrence.cell_steps_for
    steps = SmallBlockTritonSteps if block else TritonCellSteps
    recurrence.cell_steps_for = lambda device: steps
    try:
        return training(layer, x, lengths, initial, cell_clip, proj_clip)
    finally:
        recurrence.cell_steps_for = original


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
    state_gradients: bool = True  # and gives the initial state a gradient
    clips: bool = True
    precisions: tuple[str, ...] = ("float32", "bfloat16", "float16")
    available: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    device: Callable[[], str] = lambda: "cpu"  # where it runs in this test


def cuda_if_there() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


IMPLEMENTATIONS = {
    "loop": Implementation(
        loop, "rows leave the recurrence as they end: padding costs nothing (CPU inference, states)"
    ),
    "loop without gradients": Implementation(
        loop,
        "the cell step in place, no autograd graph kept (inference on any device)",
        gradients=False,
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
        state_gradients=False,  # carried and primed states are constants
    ),
    "training on Triton steps": Implementation(
        training_on_triton_steps,
        "one kernel launch a step each way on a CUDA GPU (interpreted on the CPU without one)",
        state_gradients=False,
        available=lambda: None if triton_available() else "Triton is not installed",
        device=cuda_if_there,
    ),
    "training on Triton steps, several blocks of units": Implementation(
        partial(training_on_triton_steps, block=True),
        "the same kernels where a cell spans several of a program's blocks of units",
        state_gradients=False,
        available=lambda: None if triton_available() else "Triton is not installed",
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
@pytest.mark.parametrize("clips", [(0.0, 0.0), (0.4, 0.05)], ids=["unclipped", "clipped"])
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
    if clips[1] and precision != "float32":
        # an output within rounding of the clip is cut by one side and not the
        # other, and its gradient differs wholly: here the clip sits above them
        clips = (clips[0], 0.2)
    torch.manual_seed(0)
    device = impl.device()
    dim = 6
    layer = torch.nn.LSTM(
        IN_DIM, cell_dim, proj_size=dim if cell_dim != dim else 0, batch_first=True
    )
    layer = layer.to(device)
    lengths = torch.tensor(LENGTHS, device=device)
    # drawn on the CPU: the same numbers on every device
    x = torch.randn(len(LENGTHS), max(LENGTHS), IN_DIM).to(device)
    real = (torch.arange(x.shape[1], device=device)[None, :] < lengths[:, None])[..., None]
    if impl.states:
        initial = (
            0.5 * torch.randn(len(LENGTHS), dim).to(device),
            torch.randn(len(LENGTHS), cell_dim).to(device),
        )
    else:
        initial = (
            torch.zeros(len(LENGTHS), dim, device=device),
            torch.zeros(len(LENGTHS), cell_dim, device=device),
        )
    cotangent = torch.randn(*x.shape[:2], dim).to(device) * real  # weighs every real output

    reference = layer.double()
    ref_inputs = [x.double().requires_grad_(), *(s.double().requires_grad_() for s in initial)]
    ref_y, ref_state = reference_layer(reference, ref_inputs[0], lengths, ref_inputs[1:], *clips)
    ref_tensors = [*ref_inputs, *reference.parameters()]
    ref_grads = torch.autograd.grad((ref_y * cotangent.double()).sum(), ref_tensors)
    if clips[1] and cell_dim != dim and precision == "float32":  # the clip cuts a good share
        assert 0.1 < float((ref_y.abs().masked_select(real) == clips[1]).double().mean()) < 0.9
    layer = layer.float()

    # as in the biLM: the layer's input in the precision computed in (the
    # encoder's output under autocast), states handed in as float32
    x_in = x.to(getattr(torch, precision)).requires_grad_(impl.gradients)
    inputs = [x_in, *(s.clone() for s in initial)]
    state_gradients = impl.states and impl.state_gradients
    if state_gradients and impl.gradients:
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
        assert all(torch.equal(s, i) for s, i in zip(inputs[1:], initial))  # left as given
    if impl.gradients:
        tensors = [inputs[0], *(inputs[1:] if state_gradients else []), *layer.parameters()]
        wanted = [ref_grads[0], *(ref_grads[1:3] if state_gradients else []), *ref_grads[3:]]
        names = [
            "x",
            *(["h0", "c0"] if state_gradients else []),
            *(n for n, _ in layer.named_parameters()),
        ]
        got = torch.autograd.grad((y.float() * cotangent).sum(), tensors, allow_unused=True)
        for n, g, w in zip(names, got, wanted):
            close(torch.zeros_like(w) if g is None else g, w, precision, f"gradient of {n}")
        weights = got[len(got) - len(list(layer.parameters())) :]
        assert all(g.dtype == torch.float32 for g in weights if g is not None)  # as the weights


def test_every_implementation_says_why_it_is_not_the_reference():
    assert all(len(impl.why) > 20 for impl in IMPLEMENTATIONS.values())


def gradients(output: torch.Tensor, weight: torch.Tensor, tensors: list[torch.Tensor]):
    return torch.autograd.grad((output * weight).sum(), tensors)


def one_layer(x: torch.Tensor, lstm: torch.nn.LSTM, dtype: torch.dtype) -> torch.Tensor:
    """`lstm` over x (B, T, I) on the training kernel, as a batch of one layer."""
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0
    weights = [lstm.weight_ih_l0, lstm.weight_hh_l0, bias]
    weights.append(lstm.weight_hr_l0 if lstm.proj_size else None)
    return lstm_layer_for_training(x[None], *(w if w is None else w[None] for w in weights), dtype)[
        0
    ][0]


@pytest.mark.parametrize("projected", [True, False])
def test_layers_run_together_are_each_layer_alone(projected):
    """Two layers (the biLM's directions) in one call of the training kernel,
    50 x 7 rows (padded past a ROW_BLOCK): each one's outputs and gradients
    are what it gives alone."""
    torch.manual_seed(0)
    dim, cell = (6, 10) if projected else (8, 8)
    lstms = [
        torch.nn.LSTM(dim, cell, proj_size=dim if projected else 0, batch_first=True).double()
        for _ in range(2)
    ]
    xs = [torch.randn(50, 7, dim, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    tensors = [*xs, *(p for lstm in lstms for p in lstm.parameters())]
    alone = torch.stack([one_layer(x, lstm, torch.float64) for x, lstm in zip(xs, lstms)])
    weight = torch.randn_like(alone)
    stacked = [
        torch.stack([lstm.weight_ih_l0 for lstm in lstms]),
        torch.stack([lstm.weight_hh_l0 for lstm in lstms]),
        torch.stack([lstm.bias_ih_l0 + lstm.bias_hh_l0 for lstm in lstms]),
        torch.stack([lstm.weight_hr_l0 for lstm in lstms]) if projected else None,
    ]
    together = lstm_layer_for_training(torch.stack(xs), *stacked, torch.float64)[0]
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-12)
    expected_grads = gradients(alone, weight, tensors)
    for got, want in zip(gradients(together, weight, tensors), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_padded_rows_rounds_up_to_whole_blocks():
    assert padded_rows(1) == ROW_BLOCK
    assert padded_rows(ROW_BLOCK) == ROW_BLOCK
    assert padded_rows(ROW_BLOCK + 1) == 2 * ROW_BLOCK


def test_training_on_the_cpu_runs_the_training_kernel_and_inference_does_not(monkeypatch):
    calls = []
    kernel = kernels.lstm_layer_for_training
    monkeypatch.setattr(
        kernels, "lstm_layer_for_training", lambda *a: calls.append(1) or kernel(*a)
    )
    bilm = BiLM(TINY_BILM, WordVocab.build([["a", "b", "c"]], max_size=50, min_count=1))
    batch = bilm.batch([["a", "b", "c"], ["b"]])
    trained = bilm.train()(batch)
    assert len(calls) == TINY_BILM.n_layers  # both directions' layers together
    with forced_kernel("fused"):  # torch's, as pretraining ran before
        torch.testing.assert_close(trained, bilm(batch), rtol=0, atol=1e-6)
    with torch.no_grad():
        bilm.eval()(batch)
    assert len(calls) == TINY_BILM.n_layers


@pytest.mark.parametrize(
    "clipped, states, grad, packed, expected",
    [
        (False, False, True, False, {"cpu": "training", "cuda": "fused"}),
        (False, False, False, True, {"cpu": "loop"}),  # inference, packed weights
        (False, False, False, False, {"cpu": "fused", "cuda": "fused"}),
        (True, False, True, False, {"cpu": "training", "cuda": "training"}),
        (True, False, False, False, {"cpu": "loop", "cuda": "loop"}),
        (False, True, False, False, {"cpu": "loop", "cuda": "loop"}),
        (True, True, True, False, {"cpu": "training", "cuda": "training"}),  # fine-tuning
        (False, True, True, False, {"cpu": "training", "cuda": "loop"}),
    ],
)
def test_the_kernel_is_chosen_in_one_place_as_its_table_says(
    clipped, states, grad, packed, expected, monkeypatch
):
    run = dict(clipped=clipped, states=states, packed=packed)
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    for device, kernel in expected.items():
        with torch.set_grad_enabled(grad):
            assert choose_kernel(torch.device(device), **run) == kernel, device
    if clipped and grad:  # a GPU without Triton trains a clipped biLM on the loop
        monkeypatch.setattr(kernels, "triton_available", lambda: False)
        with torch.enable_grad():
            assert choose_kernel(torch.device("cuda"), **run) == "loop"


def test_the_training_kernel_steps_on_triton_on_cuda_only(monkeypatch):
    from elmo_spacy.bilm.runtime import cell_steps

    for available, on_cuda in ((True, TritonCellSteps), (False, TorchCellSteps)):
        monkeypatch.setattr(cell_steps, "triton_available", lambda available=available: available)
        assert cell_steps_for(torch.device("cpu")) is TorchCellSteps
        assert cell_steps_for(torch.device("cuda")) is on_cuda


def test_the_network_alone_computes_what_the_biLM_computes_on_its_kernels():
    """`BiLMNetwork.forward` and `lm_loss`, plain torch, against the biLM on
    the runtime's kernels (the training kernel, packed weights, the type
    cache), clipped and not."""
    from elmo_spacy.bilm.model import BiLMNetwork

    docs = [["the", "bank", "rose", "."], ["a"], ["rivers", "bank", "on", "the", "left"]]
    for clip in (None, 0.5):
        config = BiLMConfig(**{**TINY_BILM.to_dict(), "cell_clip": clip, "proj_clip": clip})
        torch.manual_seed(0)
        bilm = BiLM(config, WordVocab.build(docs, max_size=50, min_count=1)).eval()
        batch = bilm.batch(docs)
        with torch.no_grad():
            fast = bilm(batch)
            plain = BiLMNetwork.forward(bilm, batch)
        torch.testing.assert_close(plain, fast, rtol=1e-5, atol=1e-5)
        bilm.train()
        fast_loss, plain_loss = bilm.lm_loss(batch), BiLMNetwork.lm_loss(bilm, batch)
        torch.testing.assert_close(plain_loss.forward_nll, fast_loss.forward_nll, rtol=1e-5, atol=0)


@pytest.mark.slow
def test_a_bilm_trains_to_the_same_loss_on_either_kernel():
    """Ten Adam steps on the training kernel and on torch's: the same losses
    to float32 rounding (no dropout). Slow (about 30 s on two cores): the
    table above checks each step's gradients."""
    from .conftest import DATA, tokenize

    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:16])
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "dropout": 0.0})
    losses = {}
    for kernel in ("training", "fused"):
        torch.manual_seed(0)
        bilm = BiLM(config, WordVocab.build(docs, max_size=500, min_count=1)).train()
        optimizer = torch.optim.Adam(bilm.parameters(), lr=1e-2)
        losses[kernel] = []
        with forced_kernel(kernel):
            for _ in range(10):
                loss = bilm.lm_loss(bilm.batch(docs)).mean
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses[kernel].append(loss.item())
    assert losses["training"][-1] < losses["training"][0] - 0.5
    assert losses["training"] == pytest.approx(losses["fused"], rel=1e-4)


@pytest.fixture(scope="module")
def compiled_kernels(tmp_path_factory) -> dict:
    """tests/triton_compile.py's report, run in a process without
    TRITON_INTERPRET, so that Triton compiles rather than interprets."""
    pytest.importorskip("triton", reason="Triton is not installed (`pip install triton`)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton")), TRITON_DEFAULT_FP_FUSION="1"
    )
    command = [sys.executable, "-m", "tests.triton_compile"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_triton_kernels_compile_for_nvidia_gpus_without_one(compiled_kernels):
    """Triton's compiler and ptxas, as a GPU run would call them, turn every
    variant of both kernels into a cubin for an H100: what the interpreter
    cannot check (types, the compiler's own limits)."""
    compiled = compiled_kernels["compiled"]
    assert len(compiled) == 3 * (4 + 1)  # 3 dtypes: 4 forward variants, 1 backward
    assert ["forward", 90, "bf16", True, True] in compiled


def test_the_compiled_kernels_compile_once_for_every_batch_shape(compiled_kernels):
    """Compiled, the kernels leave the arguments that follow a batch's shape
    unspecialised: a new row count compiles no new variant mid-run."""
    assert compiled_kernels["unspecialised"] == {
        "forward_kernel": ["batch", "hidden_stride_d", "inputs_stride_d"],
        "backward_kernel": ["batch", "gates_stride_d"],
    }
