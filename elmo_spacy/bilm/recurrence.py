"""The training kernel of an unclipped LSTM layer: forward and backward
passes written out, so that the products over all time steps run as single
large GEMMs and each step does only what the recurrence needs.

torch's own kernel for an LSTM with a projection (ELMo's layer) has no oneDNN
path on the CPU: it runs a step at a time in both passes, computing the
weight gradients step by step in GEMMs as small as the batch, and under
bfloat16 autocast it casts the weights again at every step. Here:

- forward: the input gates of all steps in one GEMM (T * B rows); per step
  one GEMM for the recurrent gates, the cell update, and one GEMM for the
  projection;
- backward: per step one GEMM back through the projection, the cell's
  gradient, and one GEMM back through the recurrent weights; then the
  gradients of the inputs, of all four weights and of the bias in one GEMM
  (or sum) each over all T * B rows.

The products run in the layer's matmul dtype (bfloat16 under autocast,
float32 otherwise), with float32 accumulation, over rows padded to a few
sizes (`padded_rows`). The gate activations, the cell state and the cell's
gradient stay float32 under bfloat16; the per-gate factors of the backward
pass are rounded to bfloat16, as are the gate gradients they make, which go
into the products. The weights are cast once per call, not per step.
Sequence padding is not skipped: a row's outputs past its length are
computed and carry no gradient when the loss ignores them (pretraining
batches are bucketed by length).
"""

import torch

from .precision import padded_rows, state_dtype


def lstm_layer_for_training(
    x: torch.Tensor,
    weight_ih: torch.Tensor,
    weight_hh: torch.Tensor,
    bias: torch.Tensor,
    weight_hr: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One LSTM layer from zero states over x (B, T, I), batch first:
    weight_ih (4H, I), weight_hh (4H, P), bias (4H,) (torch's two biases
    summed), weight_hr (P, H) or None where the layer does not project
    (P = H); gates in torch's order (input, forget, cell, output). Returns
    (B, T, P) in `dtype`, the dtype of the products."""
    with torch.autocast(x.device.type, enabled=False):
        y = _LstmLayer.apply(x.transpose(0, 1), weight_ih, weight_hh, bias, weight_hr, dtype)
    return y.transpose(0, 1)


class _LstmLayer(torch.autograd.Function):
    """x (T, B, I) time-major -> y (T, B, P); see `lstm_layer_for_training`.

    The forward pass keeps, per step, what the backward pass multiplies by
    (derived while the step's gates are in cache), so that each backward
    step is two GEMMs and three elementwise products:

    - `factors` (T, B, 4, H): per unit of the cell state's gradient, the
      gradients of the input, forget and cell gates' preactivations
      (g i (1 - i), c' f (1 - f), i (1 - g^2), c' the previous cell); per unit
      of the hidden state's gradient, the output gate's (tanh(c) o (1 - o));
    - `cell_from_hidden` (T, B, H): the cell state's gradient per unit of the
      hidden state's, o (1 - tanh(c)^2);
    - `forget` (T, B, H): f, which carries the cell's gradient a step back.
    """

    @staticmethod
    def forward(ctx, x, weight_ih, weight_hh, bias, weight_hr, dtype):
        steps, batch, in_dim = x.shape
        hidden = weight_hh.shape[0] // 4
        out_dim = weight_hh.shape[1]
        n, rows = steps * batch, padded_rows(steps * batch)
        state = state_dtype(dtype)  # of the gates, the cell and what derives from them
        w_ih, w_hh = weight_ih.to(dtype), weight_hh.to(dtype)
        w_hr = None if weight_hr is None else weight_hr.to(dtype)
        inputs = x.new_zeros(rows, in_dim, dtype=dtype)
        inputs[:n] = x.reshape(n, in_dim)
        gates_x = torch.addmm(bias.to(dtype), inputs, w_ih.t().contiguous())
        gates_x = gates_x[:n].view(steps, batch, 4 * hidden)
        recurrent = w_hh.t().contiguous()
        project = None if w_hr is None else w_hr.t().contiguous()

        factors = x.new_empty(steps, batch, 4, hidden, dtype=dtype)
        cell_from_hidden = x.new_empty(steps, batch, hidden, dtype=state)
        forget = x.new_empty(steps, batch, hidden, dtype=state)
        hidden_out = None  # o tanh(c), zero past n: what the projection's gradient needs
        if project is not None:
            hidden_out = x.new_zeros(rows, hidden, dtype=dtype)
        # y_0 = 0, y_1 .. y_T, and zeros: rows [0, rows) are every step's y_{t-1}
        outputs = x.new_zeros(rows + batch, out_dim, dtype=dtype)
        by_step = outputs[: n + batch].view(steps + 1, batch, out_dim)
        act = x.new_empty(batch, 4 * hidden, dtype=state)  # i f g o of this step
        i, f, g, o = act.chunk(4, 1)
        cell, previous = (x.new_zeros(batch, hidden, dtype=state) for _ in range(2))
        tanh_cell = torch.empty_like(cell)
        ones = torch.ones_like(cell)
        for t in range(steps):
            gates = torch.addmm(gates_x[t], by_step[t], recurrent)
            torch.sigmoid(gates, out=act)
            torch.tanh(gates[:, 2 * hidden : 3 * hidden], out=g)
            cell, previous = previous, cell
            torch.mul(f, previous, out=cell).addcmul_(i, g)
            torch.tanh(cell, out=tanh_cell)
            h = by_step[t + 1] if project is None else hidden_out[t * batch : (t + 1) * batch]
            torch.mul(o, tanh_cell, out=h)
            if project is not None:
                torch.mm(h, project, out=by_step[t + 1])
            factor = factors[t]
            torch.addcmul(i, i, i, value=-1, out=factor[:, 0]).mul_(g)
            torch.addcmul(f, f, f, value=-1, out=factor[:, 1]).mul_(previous)
            torch.addcmul(ones, g, g, value=-1, out=factor[:, 2]).mul_(i)
            torch.addcmul(o, o, o, value=-1, out=factor[:, 3]).mul_(tanh_cell)
            torch.addcmul(ones, tanh_cell, tanh_cell, value=-1, out=cell_from_hidden[t]).mul_(o)
            forget[t] = f
        ctx.save_for_backward(
            inputs, w_ih, w_hh, w_hr, factors, cell_from_hidden, forget, hidden_out, outputs
        )
        ctx.x_dtype, ctx.weight_dtype = x.dtype, weight_hh.dtype
        return by_step[1:]

    @staticmethod
    def backward(ctx, grad_y):
        inputs, w_ih, w_hh, w_hr, factors, cell_from_hidden, forget, hidden_out, outputs = (
            ctx.saved_tensors
        )
        steps, batch, _, hidden = factors.shape
        n, rows = steps * batch, inputs.shape[0]
        dtype = w_hh.dtype
        grad_y = grad_y.to(dtype).contiguous()
        # dL/dy_t by all paths (the output's and the next step's gates), and
        # dL/d(gate preactivations), of every step; zero past n
        grad_out = grad_y.new_zeros(rows, grad_y.shape[2])
        by_step = grad_out[:n].view_as(grad_y)
        by_step[-1] = grad_y[-1]
        grad_gates = grad_y.new_zeros(rows, 4 * hidden)
        gates_by_step = grad_gates[:n].view(steps, batch, 4, hidden)
        grad_cell = cell_from_hidden.new_zeros(batch, hidden)  # dL/dc_{t+1} f_{t+1}
        for t in reversed(range(steps)):
            grad_hidden = by_step[t] if w_hr is None else by_step[t].mm(w_hr)
            grad_cell.addcmul_(grad_hidden, cell_from_hidden[t])
            torch.mul(factors[t, :, :3], grad_cell[:, None], out=gates_by_step[t, :, :3])
            torch.mul(factors[t, :, 3], grad_hidden, out=gates_by_step[t, :, 3])
            grad_cell.mul_(forget[t])
            if t:
                grad = gates_by_step[t].view(batch, -1)
                torch.addmm(grad_y[t - 1], grad, w_hh, out=by_step[t - 1])
        grad_x = grad_gates.mm(w_ih)[:n].view(steps, batch, -1).to(ctx.x_dtype)
        grad_w_ih = grad_gates.t().mm(inputs).to(ctx.weight_dtype)
        grad_w_hh = grad_gates.t().mm(outputs[:rows]).to(ctx.weight_dtype)
        grad_bias = grad_gates.new_ones(1, rows).mm(grad_gates).view(-1).to(ctx.weight_dtype)
        grad_w_hr = None if w_hr is None else grad_out.t().mm(hidden_out).to(ctx.weight_dtype)
        return grad_x, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr, None
