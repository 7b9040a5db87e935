"""The training kernel's per-step work in Triton (the GPU's) against the same
steps in torch operators, on the CPU under Triton's interpreter, one step
each way at a width past one block of units; compiled for an H100 without
one. Whole layers on the Triton steps, against the reference step, are a row
of tests/test_lstm_implementations.py."""

import json
import os
import subprocess
import sys

import pytest
import torch

import elmo_spacy.bilm.runtime.cell_steps as cell_steps
from elmo_spacy.bilm.model.dtypes import state_dtype
from elmo_spacy.bilm.runtime.cell_steps import TorchCellSteps, TritonCellSteps

from .conftest import ROOT

triton = pytest.importorskip("triton", reason="Triton is not installed (`pip install triton`)")
# On the CPU under the interpreter (tests/conftest.py), else on the GPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton.knobs.runtime.interpret:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


@pytest.fixture(autouse=True)
def on_device():
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device(None)


def step_arrays(layers, batch, hidden, dtype):
    """A step's inputs, and outputs to write, with `hidden` strided over the
    layers as the training kernel's is (a slice of rows of a (D, R, H) array)."""
    state = state_dtype(dtype)
    gates = (3 * torch.randn(layers, batch, 4 * hidden)).to(dtype)
    previous = torch.randn(layers, batch, hidden, dtype=state)
    cell = torch.empty(layers, batch, hidden, dtype=state)
    hidden_out = strided_rows(torch.empty(layers, batch, hidden, dtype=dtype))
    factors = torch.empty(layers, batch, 4, hidden, dtype=dtype)
    cell_from_hidden, forget = (torch.empty(layers, batch, hidden, dtype=state) for _ in range(2))
    return gates, previous, cell, hidden_out, factors, cell_from_hidden, forget


def strided_rows(array: torch.Tensor) -> torch.Tensor:
    """A copy of array (D, B, K) as rows B..2B of a (D, 3B, K) array (NaN elsewhere)."""
    layers, batch, width = array.shape
    rows = torch.full((layers, 3 * batch, width), float("nan"), dtype=array.dtype)
    rows[:, batch : 2 * batch] = array
    return rows[:, batch : 2 * batch]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cell_clip", [0.0, 0.8])
@pytest.mark.parametrize("hidden", [200])  # one full block of 128 units and a part
def test_triton_steps_compute_what_the_torch_steps_do(dtype, cell_clip, hidden):
    torch.manual_seed(0)
    layers, batch = 2, 3
    want = step_arrays(layers, batch, hidden, dtype)
    got = [a.clone() for a in want]
    got[3] = strided_rows(want[3])
    TorchCellSteps(layers, batch, hidden, want[1]).forward(*want, cell_clip)
    TritonCellSteps(layers, batch, hidden, got[1]).forward(*got, cell_clip)
    if cell_clip:
        assert 0.1 < (want[2].abs() == cell_clip).float().mean() < 0.9
    # bfloat16: the factors rounded to bfloat16 once here, twice in torch's ops
    atol = 1e-6 if dtype == torch.float32 else 1e-2
    tolerance = {"rtol": 0 if dtype == torch.float32 else 1e-2, "atol": atol}
    # a cell within rounding of the clip may be cut by one and not the other
    inside = (want[2].abs() - cell_clip).abs() > 1e-5
    for w, g in zip(want[1:], got[1:]):
        where = inside[:, :, None] if w.dim() == 4 else inside
        torch.testing.assert_close(g * where, w * where, **tolerance)

    factors, cell_from_hidden, forget = want[4:]
    grad_hidden = torch.randn(layers, batch, hidden).to(dtype)
    grad_cell = torch.randn(layers, batch, hidden, dtype=state_dtype(dtype))
    grad_gates = strided_rows(torch.zeros(layers, batch, 4 * hidden, dtype=dtype))
    results = []
    for steps in (TorchCellSteps, TritonCellSteps):
        into = (grad_cell.clone(), grad_gates.clone())
        steps(layers, batch, hidden, grad_cell).backward(
            grad_hidden, into[0], factors, cell_from_hidden, forget, into[1]
        )
        results.append(into)
    for w, g in zip(*results):
        torch.testing.assert_close(g, w, **tolerance)


def test_the_triton_steps_run_on_cuda_only_where_triton_is():
    assert cell_steps.cell_steps_for(torch.device("cpu")) is TorchCellSteps
    assert cell_steps.cell_steps_for(torch.device("cuda")) is TritonCellSteps


@pytest.fixture(scope="module")
def compiled_kernels(tmp_path_factory) -> dict:
    """tests/triton_compile.py's report, run in a process without
    TRITON_INTERPRET, so that Triton compiles rather than interprets."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton")), TRITON_DEFAULT_FP_FUSION="1"
    )
    command = [sys.executable, "-m", "tests.triton_compile"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_kernels_compile_for_nvidia_gpus_without_one(compiled_kernels):
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
