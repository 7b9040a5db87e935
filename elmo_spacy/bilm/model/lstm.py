"""One direction of the biLM: a stack of projected LSTM layers, ELMo's LSTM
step written once (`lstm_step`, the reference), and a layer on torch's LSTM
(`run_fused_layer`) or on `lstm_step`'s recurrence (`run_lstm_layer`)."""

import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .config import BiLMConfig
from .dtypes import matmul_dtype, state_dtype, widened

LstmState = tuple[torch.Tensor, torch.Tensor]  # h (B, P), c (B, H) of one layer
Product = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
# A function (weight (out, in), name) -> Product, the products of the recurrence.
ProductOf = Callable[[torch.Tensor, str], Product]


class LstmStack(nn.Module):
    """L `torch.nn.LSTM` layers (gates i, f, g, o), each cell (H units)
    projected to P, dropout on each layer's input, skip connections and
    clips as `config` says. A `forget_bias` makes `bias_hh` a constant
    buffer: that value on the forget gate, 0 elsewhere.
    """

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        dim, cell_dim = config.projection_dim, config.lstm_dim
        # no projection where the cell is as wide as the output: torch's faster kernel
        proj_size = dim if cell_dim != dim else 0
        self.layers = nn.ModuleList(
            nn.LSTM(dim, cell_dim, proj_size=proj_size, batch_first=True)
            for _ in range(config.n_layers)
        )
        self.dropout = nn.Dropout(config.dropout)
        self.cell_clip = config.cell_clip or 0.0
        self.proj_clip = config.proj_clip or 0.0
        self.skip_connections = config.skip_connections
        if config.forget_bias is not None:
            constant = torch.zeros(4 * cell_dim)
            constant[cell_dim : 2 * cell_dim] = config.forget_bias
            for layer in self.layers:
                del layer.bias_hh_l0
                layer.register_buffer("bias_hh_l0", constant.clone())
                layer._init_flat_weights()  # torch's LSTM reads its weights from this list

    @property
    def clipped(self) -> bool:
        return bool(self.cell_clip or self.proj_clip)

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        initial: list[LstmState] | None = None,
        final: bool = False,
        *,
        fused: bool | None = None,
        product_of: Callable[[nn.LSTM], ProductOf] | None = None,
    ) -> tuple[list[torch.Tensor], list[LstmState]]:
        """x (B, T, P) right-padded, lengths (B,) -> one (B, T, P) output per
        layer, and with `final` each layer's state after each row's last
        step. `initial`: each layer's starting state (None: zeros).

        fused: run torch's LSTM (`run_fused_layer`: no clips, no states), else
            `run_lstm_layer` with `product_of(layer)`'s products; None: fused
            where nothing is clipped and no state comes in or goes out."""
        if fused is None:
            fused = not (self.clipped or initial is not None or final)
        outputs, states = [], []
        for i, layer in enumerate(self.layers):
            if fused:
                y = run_fused_layer(layer, self.dropout(x), lengths)
            else:
                state = None if initial is None else initial[i]
                product = None if product_of is None else product_of(layer)
                y, state = run_lstm_layer(
                    layer, self.dropout(x), lengths, state, self.cell_clip, self.proj_clip, final,
                    product,
                )  # fmt: skip
                states.append(state)
            x = y + x if i > 0 and self.skip_connections else y
            outputs.append(x)
        return outputs, (states if final else [])


def run_fused_layer(layer: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One layer on torch's LSTM: x (B, T, I) -> (B, T, P). Without gradients
    over a PackedSequence; with them over the padded batch, whose backward is
    over twice as fast on the CPU."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "LSTM with projections is not supported")
        if torch.is_grad_enabled():
            return layer(x)[0]
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, _ = layer(packed)
    return pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0]


def run_lstm_layer(
    layer: nn.LSTM,
    x: torch.Tensor,
    lengths: torch.Tensor,
    initial: LstmState | None,
    cell_clip: float,
    proj_clip: float,
    final: bool = True,
    product: ProductOf | None = None,
) -> tuple[torch.Tensor, LstmState | None]:
    """One LSTM layer over x (B, T, I) -> outputs (B, T, P), zero past each
    row's length, and with `final` each row's state (h, c) after its last
    step. `product`: the products on "ih", "hh" and "hr" (None:
    `plain_product`). Rows drop out when they end: padding costs nothing.
    """
    batch, steps, _ = x.shape
    hidden, out_dim = layer.hidden_size, layer.proj_size or layer.hidden_size
    order = torch.argsort(lengths, descending=True, stable=True)
    lengths_sorted = lengths[order].tolist()
    if initial is None:
        h, c = x.new_zeros(batch, out_dim), x.new_zeros(batch, hidden, dtype=state_dtype(x.dtype))
    else:
        h, c = initial[0][order], initial[1][order]
    # active[t]: rows still running at step t (a prefix, as rows are sorted)
    active = [sum(n > t for n in lengths_sorted) for t in range(steps)]
    real = torch.arange(steps, device=x.device)[:, None] < lengths[order][None, :]  # (T, B)
    inputs = x[order].transpose(0, 1)[real]  # (N, I), time-major
    product = product or plain_product
    bias = layer.bias_ih_l0 + layer.bias_hh_l0
    gates_x = product(layer.weight_ih_l0, "ih")(inputs, bias)  # (N, 4H)
    recur = product(layer.weight_hh_l0, "hh")
    project = product(layer.weight_hr_l0, "hr") if layer.proj_size else None
    outputs, offset = [], 0
    ended: list[LstmState] = []  # the states of rows that have ended, last rows first
    for n in active:
        if n < len(h):  # rows n: ended at the previous step; the rest run on
            if final:
                ended.append((h[n:], c[n:]))
            h, c = h[:n], c[:n]
        if n == 0:
            break
        h, c = lstm_step(gates_x[offset : offset + n], h, c, recur, project, cell_clip, proj_clip)
        offset += n
        outputs.append(h)
    padded = x.new_zeros(steps, batch, out_dim)
    if outputs:
        padded[real] = torch.cat(outputs).to(padded.dtype)  # unprojected: the cell's float32
    restore = torch.argsort(order)
    y = padded.transpose(0, 1)[restore]
    if not final:
        return y, None
    ended.append((h, c))
    h, c = (torch.cat([state[k] for state in reversed(ended)]) for k in (0, 1))
    return y, (h[restore], c[restore])


def lstm_step(
    gates_x: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    recur: Product,
    project: Product | None,
    cell_clip: float,
    proj_clip: float,
) -> LstmState:
    """One step of ELMo's LSTM, the reference of tests/test_lstm_implementations.py:

        gates = gates_x + h W_hh^T          (i, f, g, o, each (n, H))
        cell  = clip(sigmoid(f) c + sigmoid(i) tanh(g), cell_clip)
        h'    = clip(W_hr (sigmoid(o) tanh(cell)), proj_clip)

    gates_x (n, 4H): the input projection, bias included; h (n, P), c (n, H);
    `recur` (h, gates_x) -> gates_x + h W_hh^T; `project` (None where P = H)
    (x, None) -> x W_hr^T. A clip of 0 does not clip; the output is clipped
    only where projected (TensorFlow's LSTMCell). Returns (h', cell)."""
    h, c = lstm_cell(recur(h, gates_x), c, cell_clip)
    if project is not None:
        h = project(h, None)
        if proj_clip:
            h = h.clamp(-proj_clip, proj_clip)
    return h, c


def lstm_cell(
    gates: torch.Tensor, c: torch.Tensor, cell_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """gates (n, 4H) and c (n, H) -> (o tanh(cell), cell), float32 for
    reduced gates. Without autograd in place, overwriting `gates`."""
    gates = widened(gates)
    if gates.requires_grad or c.requires_grad or torch.compiler.is_exporting():
        i, f, g, o = gates.chunk(4, 1)
        cell = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if cell_clip:
            cell = cell.clamp(-cell_clip, cell_clip)
        return torch.sigmoid(o) * torch.tanh(cell), cell
    hidden = c.shape[1]
    gates[:, : 2 * hidden].sigmoid_()
    i, f, g, o = gates.chunk(4, 1)
    g.tanh_()
    o.sigmoid_()
    cell = f.mul(c).addcmul_(i, g)
    if cell_clip:
        cell.clamp_(-cell_clip, cell_clip)
    return torch.tanh(cell).mul_(o), cell


def plain_product(weight: torch.Tensor, name: str = "") -> Product:
    """A `ProductOf`: x @ weight.T + add, the weight cast once to `matmul_dtype`."""
    transposed = weight.to(matmul_dtype(weight)).t()
    return lambda x, add: x.mm(transposed) if add is None else torch.addmm(add, x, transposed)
