"""The training kernel of LSTM layers (torch's projected LSTM has no oneDNN
path on the CPU and cannot clip): both passes written out, the products over
all steps as single GEMMs (T * B rows, `padded_rows`), each step one GEMM each
way and the cell's elementwise work (`cell_steps`). D layers of one shape (the
two directions) run batched over D, as operator calls set a step's pace.
Under bfloat16 the activations, cell and cell gradient stay float32."""

import torch

from ..model.dtypes import padded_rows, state_dtype, without_autocast
from .cell_steps import cell_steps_for
from .products import linear_product


def lstm_layer_for_training(
    x: torch.Tensor,
    weight_ih: torch.Tensor,
    weight_hh: torch.Tensor,
    bias: torch.Tensor,
    weight_hr: torch.Tensor | None,
    dtype: torch.dtype,
    cell_clip: float = 0.0,
    proj_clip: float = 0.0,
    initial: tuple[torch.Tensor, torch.Tensor] | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """D LSTM layers, each over its own x[d]: x (D, B, T, I), weight_ih (D,
    4H, I), weight_hh (D, 4H, P), bias (D, 4H) (both summed), weight_hr (D,
    P, H) or None (P = H); clips as `lstm_step`'s. Returns (D, B, T, P) in
    `dtype`, the products' dtype.

    initial: (h (D, B, P), c (D, B, H)) to start from, as constants; None: zeros.
    lengths: (B,) steps of each row, to return the final states (as `initial`,
        without gradients); None returns none."""
    if weight_hr is None:
        proj_clip = 0.0
    h0, c0 = (None, None) if initial is None else (s.detach() for s in initial)
    with without_autocast(x.device.type):
        y, h, c = _LstmLayers.apply(
            x.transpose(1, 2), weight_ih, weight_hh, bias, weight_hr, dtype, cell_clip, proj_clip,
            h0, c0, lengths,
        )  # fmt: skip
    return y.permute(1, 2, 0, 3), (None if lengths is None else (h, c))


class _LstmLayers(torch.autograd.Function):
    """x (D, T, B, I) -> y (T, D, B, P); see `lstm_layer_for_training`. The
    forward pass keeps per step what the backward multiplies by (see
    runtime/cell_steps.py). Arrays written a step at a time are time-major;
    those that only go into the products over all steps direction-major,
    row t * B + b.
    """

    @staticmethod
    def forward(
        ctx, x, weight_ih, weight_hh, bias, weight_hr, dtype, cell_clip, proj_clip, h0, c0, lengths
    ):
        layers, steps, batch, in_dim = x.shape
        hidden = weight_hh.shape[1] // 4
        out_dim = weight_hh.shape[2]
        n, rows = steps * batch, padded_rows(steps * batch)
        state = state_dtype(dtype)  # of the gates, the cell and what derives from them
        w_ih, w_hh = weight_ih.to(dtype), weight_hh.to(dtype)
        w_hr = None if weight_hr is None else weight_hr.to(dtype)
        inputs = x.new_zeros(layers, rows, in_dim, dtype=dtype)
        inputs[:, :n] = x.reshape(layers, n, in_dim)
        gates_x = torch.baddbmm(bias.to(dtype)[:, None], inputs, w_ih.transpose(1, 2))
        gates_x = gates_x[:, :n].view(layers, steps, batch, 4 * hidden)
        recurrent = batched_product(w_hh, dtype)
        project = None if w_hr is None else batched_product(w_hr, dtype)

        factors = x.new_empty(steps, layers, batch, 4, hidden, dtype=dtype)
        cell_from_hidden = x.new_empty(steps, layers, batch, hidden, dtype=state)
        forget = x.new_empty(steps, layers, batch, hidden, dtype=state)
        hidden_out = None  # o tanh(c), zero past n: what the projection's gradient needs
        if project is not None:
            hidden_out = x.new_zeros(layers, rows, hidden, dtype=dtype)
        outputs = x.new_zeros(steps + 1, layers, batch, out_dim, dtype=dtype)  # y_0 = h0, y_1 ..
        if h0 is not None:
            outputs[0] = h0
        # where the projected output was inside the clip (its gradient's mask)
        kept = x.new_empty(steps, layers, batch, out_dim, dtype=torch.bool) if proj_clip else None
        cell_steps = cell_steps_for(x.device)(layers, batch, hidden, x.new_empty(0, dtype=state))
        adds = cell_steps.adds_inputs  # else the recurrent product adds the input gates
        cell, previous = (x.new_zeros(layers, batch, hidden, dtype=state) for _ in range(2))
        if c0 is not None:
            cell.copy_(c0)  # the step's swap makes it the first step's previous cell
        final_c, ending = None, {}
        if lengths is not None:  # the rows whose last step is t, by t
            final_c = cell.clone()  # a row of no steps ends as it began
            for row, n in enumerate(lengths.tolist()):
                ending.setdefault(n - 1, []).append(row)
        gates = x.new_empty(layers, batch, 4 * hidden, dtype=dtype)  # each step's, in turn
        for t in range(steps):
            recurrent(outputs[t], None if adds else gates_x[:, t], out=gates)
            cell, previous = previous, cell
            if project is None:
                h = outputs[t + 1]
            else:
                h = hidden_out[:, t * batch : (t + 1) * batch]
            cell_steps.forward(
                gates, previous, cell, h, factors[t], cell_from_hidden[t], forget[t], cell_clip,
                gates_x[:, t] if adds else None,
            )  # fmt: skip
            if project is not None:
                y = project(h, None, out=outputs[t + 1])
                if proj_clip:
                    torch.le(y.abs(), proj_clip, out=kept[t])
                    y.clamp_(-proj_clip, proj_clip)
            if t in ending:
                final_c[:, ending[t]] = cell[:, ending[t]]
        final_h = None
        if lengths is not None:
            rows = torch.arange(batch, device=x.device)
            final_h = outputs[lengths.to(x.device), :, rows].transpose(0, 1).contiguous()
            ctx.mark_non_differentiable(final_h, final_c)
        ctx.save_for_backward(
            inputs, w_ih, w_hh, w_hr, factors, cell_from_hidden, forget, hidden_out, outputs, kept
        )
        ctx.x_dtype, ctx.weight_dtype = x.dtype, weight_hh.dtype
        return outputs[1:], final_h, final_c

    @staticmethod
    def backward(ctx, grad_y, *_):
        inputs, w_ih, w_hh, w_hr, factors, cell_from_hidden, forget, hidden_out, outputs, kept = (
            ctx.saved_tensors
        )
        steps, layers, batch, _, hidden = factors.shape
        n, rows = steps * batch, inputs.shape[1]
        dtype = w_hh.dtype
        grad_y = grad_y.to(dtype).contiguous()  # (T, D, B, P)
        # dL/dy_t by all paths (the output's and the next step's gates)
        grad_out = torch.empty_like(grad_y)
        grad_out[-1] = grad_y[-1]
        # dL/d(gate preactivations) of every step; zero past n
        grad_gates = grad_y.new_zeros(layers, rows, 4 * hidden)
        grad_cell = cell_from_hidden.new_zeros(layers, batch, hidden)  # dL/dc_{t+1} f_{t+1}
        recurrent = batched_product(w_hh.transpose(1, 2), dtype)
        project = None if w_hr is None else batched_product(w_hr.transpose(1, 2), dtype)
        cell_steps = cell_steps_for(grad_y.device)(layers, batch, hidden, grad_cell)
        for t in reversed(range(steps)):
            grad_hidden = grad_out[t]
            if kept is not None:  # dL/dy_t before the clip: grad_out[t] from here on
                grad_hidden.mul_(kept[t])
            if project is not None:
                grad_hidden = project(grad_hidden, None)
            gates = grad_gates[:, t * batch : (t + 1) * batch]
            cell_steps.backward(
                grad_hidden, grad_cell, factors[t], cell_from_hidden[t], forget[t], gates
            )
            if t:
                recurrent(gates, grad_y[t - 1], out=grad_out[t - 1])
        grad_x = grad_gates.bmm(w_ih)[:, :n].view(layers, steps, batch, -1).to(ctx.x_dtype)
        grad_t = grad_gates.transpose(1, 2)
        grad_w_ih = grad_t.bmm(inputs).to(ctx.weight_dtype)
        # y_{t-1} and dL/dy_t by row t * B + b, zero past n
        previous = grad_y.new_zeros(layers, rows, grad_y.shape[3])
        previous[:, :n] = outputs[:steps].transpose(0, 1).reshape(layers, n, -1)
        grad_w_hh = grad_t.bmm(previous).to(ctx.weight_dtype)
        grad_bias = grad_gates.new_ones(layers, 1, rows).bmm(grad_gates).view(layers, -1)
        grad_bias = grad_bias.to(ctx.weight_dtype)
        grad_w_hr = None
        if w_hr is not None:
            by_row = grad_y.new_zeros(layers, rows, grad_y.shape[3])
            by_row[:, :n] = grad_out.transpose(0, 1).reshape(layers, n, -1)
            grad_w_hr = by_row.transpose(1, 2).bmm(hidden_out).to(ctx.weight_dtype)
        return grad_x, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr, *[None] * 6


def batched_product(weights: torch.Tensor, dtype: torch.dtype):
    """A function (x (D, B, in), add (D, B, out) or None, out=None) ->
    x[d] @ weights[d].T + add[d] for each d, for many products with the
    weights (D, out, in): on the CPU `linear_product`s, elsewhere one
    batched GEMM."""
    if weights.device.type == "cpu":
        products = [linear_product(w, dtype) for w in weights]

        def product(x, add, out=None):
            adds = [None] * len(products) if add is None else add
            return torch.stack([p(x_d, a) for p, x_d, a in zip(products, x, adds)], out=out)

        return product
    transposed = weights.transpose(1, 2)

    def product(x, add, out=None):
        if add is None:
            return torch.bmm(x, transposed, out=out)
        return torch.baddbmm(add, x, transposed, out=out)

    return product
