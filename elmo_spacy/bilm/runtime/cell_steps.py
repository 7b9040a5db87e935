"""The training kernel's per-step elementwise work (runtime/recurrence.py):
forward, the gates, the cell update and clip, the output and what the
backward pass multiplies by; backward, the gates' gradients and the cell's
carried a step back. `TorchCellSteps` runs it in torch operators,
`TritonCellSteps` as one Triton kernel a step each way (CUDA GPUs; the tests
interpret it on the CPU, TRITON_INTERPRET=1).

Shapes for D layers, B rows, H units; "dtype" the products' dtype, "state"
float32 where it is bfloat16 (`state_dtype`); contiguous unless said:

- gates (D, B, 4H) dtype: the preactivations (i, f, g, o), bias included;
  or, where `inputs` (D, B, 4H) dtype (rows contiguous) are given, the
  recurrent product's part, which the step adds to them (`adds_inputs`);
- previous, cell (D, B, H) state: the cell before and after;
- hidden (D, B, H) dtype, rows contiguous: o tanh(cell);
- factors (D, B, 4, H) dtype: g i (1 - i), c' f (1 - f), i (1 - g^2), each
  times `keep` (the gates' gradients per unit of the pre-clip cell's), and
  tanh(c) o (1 - o) (the output gate's per unit of the hidden state's);
- cell_from_hidden (D, B, H) state: o (1 - tanh(c)^2);
- forget (D, B, H) state: f times `keep`;

`keep` being 1 where the clip left the cell alone, 0 where it cut it.
"""

import functools

import torch

from ..model.dtypes import widened


class TorchCellSteps:
    """The steps in torch operators, into scratch arrays allocated once."""

    adds_inputs = False  # the recurrent product adds the input gates

    def __init__(self, layers: int, batch: int, hidden: int, like: torch.Tensor) -> None:
        self.act = like.new_empty(layers, batch, 4 * hidden)  # i f g o of this step
        self.tanh_cell = like.new_empty(layers, batch, hidden)
        self.ones = torch.ones_like(self.tanh_cell)

    def forward(
        self, gates, previous, cell, hidden, factors, cell_from_hidden, forget, cell_clip,
        inputs=None,
    ):  # fmt: skip
        act, tanh_cell, ones = self.act, self.tanh_cell, self.ones
        i, f, g, o = act.chunk(4, 2)
        size = g.shape[2]
        gates = widened(gates)  # torch's activations compute in their input's dtype
        if inputs is not None:
            gates = gates + widened(inputs)
        torch.sigmoid(gates, out=act)
        torch.tanh(gates[..., 2 * size : 3 * size], out=g)
        torch.mul(f, previous, out=cell).addcmul_(i, g)
        keep = None
        if cell_clip:
            keep = cell.abs() <= cell_clip
            cell.clamp_(-cell_clip, cell_clip)
        torch.tanh(cell, out=tanh_cell)
        torch.mul(o, tanh_cell, out=hidden)
        torch.addcmul(i, i, i, value=-1, out=factors[..., 0, :]).mul_(g)
        torch.addcmul(f, f, f, value=-1, out=factors[..., 1, :]).mul_(previous)
        torch.addcmul(ones, g, g, value=-1, out=factors[..., 2, :]).mul_(i)
        torch.addcmul(o, o, o, value=-1, out=factors[..., 3, :]).mul_(tanh_cell)
        torch.addcmul(ones, tanh_cell, tanh_cell, value=-1, out=cell_from_hidden).mul_(o)
        if keep is None:
            forget.copy_(f)
        else:
            factors[..., :3, :].mul_(keep[:, :, None])
            torch.mul(f, keep, out=forget)

    @staticmethod
    def backward(grad_hidden, grad_cell, factors, cell_from_hidden, forget, grad_gates):
        """grad_hidden (D, B, H) dtype: dL/d(hidden); grad_cell (D, B, H)
        state: the cell's gradient from the steps after, carried a step back
        in place; grad_gates (D, B, 4H) dtype, rows contiguous: written."""
        gates = grad_gates.view(*grad_gates.shape[:2], 4, -1)
        grad_cell.addcmul_(grad_hidden, cell_from_hidden)
        torch.mul(factors[:, :, :3], grad_cell[:, :, None], out=gates[:, :, :3])
        torch.mul(factors[:, :, 3], grad_hidden, out=gates[:, :, 3])
        grad_cell.mul_(forget)


class TritonCellSteps:
    """The steps as one Triton kernel each way (see the module's docstring)."""

    BLOCK = 128  # cell units a program covers
    adds_inputs = True  # one read of them here, not a copy into the product's output

    def __init__(self, layers: int, batch: int, hidden: int, like: torch.Tensor) -> None:
        self.batch, self.hidden = batch, hidden
        self.grid = (layers * batch, -(-hidden // self.BLOCK))

    def forward(
        self, gates, previous, cell, hidden, factors, cell_from_hidden, forget, cell_clip,
        inputs=None,
    ):  # fmt: skip
        _check_rows(gates, previous, cell, factors, cell_from_hidden, forget)
        if inputs is not None and inputs.stride(2) != 1:
            raise ValueError(
                f"the Triton cell steps need rows of inputs contiguous: {inputs.stride()}"
            )
        strides = (0, 0) if inputs is None else inputs.stride()[:2]
        forward_kernel, _ = triton_kernels()
        forward_kernel[self.grid](
            gates, gates if inputs is None else inputs, previous, cell, hidden, factors,
            cell_from_hidden, forget, *strides, hidden.stride(0), hidden.stride(1), self.batch,
            self.hidden, float(cell_clip or 0.0),
            ADD_INPUTS=inputs is not None, CLIP=bool(cell_clip), BLOCK=self.BLOCK,
        )  # fmt: skip

    def backward(self, grad_hidden, grad_cell, factors, cell_from_hidden, forget, grad_gates):
        _check_rows(grad_hidden, grad_cell, factors, cell_from_hidden, forget)
        _, backward_kernel = triton_kernels()
        backward_kernel[self.grid](
            grad_hidden, grad_cell, factors, cell_from_hidden, forget, grad_gates,
            grad_gates.stride(0), grad_gates.stride(1), self.batch, self.hidden,
            BLOCK=self.BLOCK,
        )  # fmt: skip


CellSteps = TorchCellSteps | TritonCellSteps


def cell_steps_for(device: torch.device) -> type[CellSteps]:
    """Triton's on a CUDA GPU where Triton is installed, else torch's."""
    return TritonCellSteps if device.type == "cuda" and triton_available() else TorchCellSteps


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _check_rows(*arrays: torch.Tensor) -> None:
    for array in arrays:
        if not array.is_contiguous():
            raise ValueError(f"the Triton cell steps need contiguous arrays: {tuple(array.shape)}")


@functools.cache
def triton_kernels():
    """The two Triton kernels (forward, backward), imported on first use."""
    from . import triton_cell

    return triton_cell.forward_kernel, triton_cell.backward_kernel
