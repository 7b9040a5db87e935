"""The Triton kernels of `TritonCellSteps` (runtime/cell_steps.py gives the
arrays), each program BLOCK cell units of one row (d, b). Imported on first use: compiled
for a CUDA GPU, or interpreted on the CPU with TRITON_INTERPRET=1 set before (the tests)."""

import triton
import triton.language as tl


# Arguments that follow the batch's shape are left unspecialised: Triton would compile
# a new variant mid-run each time one became a multiple of 16, or 1. One per dtype and clip.
@triton.jit
def _preactivation(gates, inputs, gate_at, input_at, real, ADD_INPUTS: tl.constexpr):
    """A gate's preactivations in float32: the recurrent product's, plus
    the step's input gates where they come apart."""
    value = tl.load(gates + gate_at, mask=real).to(tl.float32)
    if ADD_INPUTS:
        value += tl.load(inputs + input_at, mask=real).to(tl.float32)
    return value


@triton.jit(do_not_specialize=["hidden_stride_d", "inputs_stride_d", "batch"])
def forward_kernel(
    gates, inputs, previous, cell, hidden, factors, cell_from_hidden, forget,
    inputs_stride_d, inputs_stride_b, hidden_stride_d, hidden_stride_b, batch, size, cell_clip,
    ADD_INPUTS: tl.constexpr, CLIP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    units = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    real = units < size
    at = row * size + units  # in the (D, B, H) arrays
    gate_at = row * 4 * size + units
    input_at = (row // batch) * inputs_stride_d + (row % batch) * inputs_stride_b + units
    i = tl.sigmoid(_preactivation(gates, inputs, gate_at, input_at, real, ADD_INPUTS))
    f = tl.sigmoid(_preactivation(gates, inputs, gate_at + size, input_at + size, real, ADD_INPUTS))
    # tanh as 2 sigmoid(2x) - 1, in float32 (no libdevice in the interpreter)
    g = _preactivation(gates, inputs, gate_at + 2 * size, input_at + 2 * size, real, ADD_INPUTS)
    g = 2.0 * tl.sigmoid(2.0 * g) - 1.0
    o = tl.sigmoid(
        _preactivation(gates, inputs, gate_at + 3 * size, input_at + 3 * size, real, ADD_INPUTS)
    )
    before = tl.load(previous + at, mask=real).to(tl.float32)
    new = f * before + i * g
    keep = 1.0
    if CLIP:
        keep = ((new >= -cell_clip) & (new <= cell_clip)).to(tl.float32)
        new = tl.minimum(tl.maximum(new, -cell_clip), cell_clip)
    tanh_new = 2.0 * tl.sigmoid(2.0 * new) - 1.0
    tl.store(cell + at, new.to(cell.dtype.element_ty), mask=real)
    out_at = (row // batch) * hidden_stride_d + (row % batch) * hidden_stride_b + units
    tl.store(hidden + out_at, (o * tanh_new).to(hidden.dtype.element_ty), mask=real)
    factor_at = row * 4 * size + units
    kind = factors.dtype.element_ty
    tl.store(factors + factor_at, ((i - i * i) * g * keep).to(kind), mask=real)
    tl.store(factors + factor_at + size, ((f - f * f) * before * keep).to(kind), mask=real)
    tl.store(factors + factor_at + 2 * size, ((1 - g * g) * i * keep).to(kind), mask=real)
    tl.store(factors + factor_at + 3 * size, ((o - o * o) * tanh_new).to(kind), mask=real)
    state = cell_from_hidden.dtype.element_ty
    tl.store(cell_from_hidden + at, ((1 - tanh_new * tanh_new) * o).to(state), mask=real)
    tl.store(forget + at, (f * keep).to(state), mask=real)


@triton.jit(do_not_specialize=["gates_stride_d", "batch"])
def backward_kernel(
    grad_hidden, grad_cell, factors, cell_from_hidden, forget, grad_gates,
    gates_stride_d, gates_stride_b, batch, size, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    units = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    real = units < size
    at = row * size + units
    from_hidden = tl.load(grad_hidden + at, mask=real).to(tl.float32)
    carried = tl.load(grad_cell + at, mask=real).to(tl.float32)
    carried += from_hidden * tl.load(cell_from_hidden + at, mask=real).to(tl.float32)
    factor_at = row * 4 * size + units
    out_at = (row // batch) * gates_stride_d + (row % batch) * gates_stride_b + units
    kind = grad_gates.dtype.element_ty
    for k in tl.static_range(3):
        factor = tl.load(factors + factor_at + k * size, mask=real).to(tl.float32)
        tl.store(grad_gates + out_at + k * size, (factor * carried).to(kind), mask=real)
    factor = tl.load(factors + factor_at + 3 * size, mask=real).to(tl.float32)
    tl.store(grad_gates + out_at + 3 * size, (factor * from_hidden).to(kind), mask=real)
    carried *= tl.load(forget + at, mask=real).to(tl.float32)
    tl.store(grad_cell + at, carried.to(grad_cell.dtype.element_ty), mask=real)
