"""One direction of the biLM: a stack of projected LSTM layers, clipped or fused."""

import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..errors import ElmoSpacyError
from .graphs import GraphCache
from .precision import autocast_dtype, matmul_dtype, state_dtype, widened
from .products import Product, onednn_packing, pack, packed_product
from .recurrence import lstm_layer_for_training

LstmState = tuple[torch.Tensor, torch.Tensor]  # h (B, P), c (B, H) of one layer
PackedWeights = dict[int, dict[str, torch.Tensor]]  # id(layer) -> name -> packed weight
GRAPH_STEPS = 8  # a graph's steps: a batch's, rounded up to a multiple of these
GRAPH_ROWS = 8  # a graph's rows: likewise


class LstmStack(nn.Module):
    """L LSTM layers, each with its cell (H units) projected to `dim` (P) by a
    bias-free projection, dropout on each layer's input, and optionally a skip
    connection from each layer's input to its output after the first.

    The parameters are `torch.nn.LSTM`'s (per layer `weight_ih` (4H, P),
    `weight_hh` (4H, P), `bias_ih` and `bias_hh` (4H,), `weight_hr` (P, H);
    gates in the order input, forget, cell, output), so one set of weights
    runs on any of three kernels:

    - `lstm_layer_for_training` (bilm/recurrence.py: forward and backward
      written out, the products over all steps in single GEMMs), in training
      on the CPU when it gives all that is needed (no clipping, no state
      coming in or going out); the biLM runs each layer of its two stacks
      in one call of it (`run_training_stacks`);
    - torch's fused kernel (`run_fused_layer`), for the same on other devices
      (cuDNN), and at inference where oneDNN is missing;
    - `run_lstm_layer` ("loop"): the input projections of all time steps in
      one GEMM, then a tight recurrence that clips the cell to [-cell_clip,
      cell_clip] and the projected output to [-proj_clip, proj_clip]
      (TensorFlow's LSTMCell, as bilm-tf trains it), and that takes initial
      states and returns each row's state after its last real step. At
      inference, given a `packed` cache, its GEMMs run on weights that oneDNN
      has packed once for small batches (twice the speed of a plain GEMM at
      ELMo's sizes); without oneDNN, on plain GEMMs;
    - `run_graphed_lstm_layer` ("graph"): the same on a CUDA GPU at
      inference, given a `graphs` cache, replayed from a CUDA graph of the
      whole recurrence, where cuDNN cannot clip.

    forget_bias: None trains both biases, as torch's LSTM does. A number
        fixes `bias_hh` at that value on the forget gate and 0 elsewhere and
        never trains it: one trained bias plus the constant forget bias that
        TensorFlow's LSTMCell adds (1.0 in bilm-tf).
    kernel: "auto" (as above), or "training", "fused", "loop" or "graph" to
        force one (for benchmarks and tests; "training" and "fused" ignore the
        clips, "training" needs gradients and "graph" a `graphs` cache).

    Sequences are right-padded: positions after a row's length never affect
    the positions before it, so no packing is needed.
    """

    def __init__(
        self,
        n_layers: int,
        dim: int,
        cell_dim: int,
        dropout: float,
        *,
        cell_clip: float | None = None,
        proj_clip: float | None = None,
        skip_connections: bool = True,
        forget_bias: float | None = None,
    ) -> None:
        super().__init__()
        # proj_size=0 when the cell is as wide as the output: no projection,
        # and torch can use its faster oneDNN kernel.
        proj_size = dim if cell_dim != dim else 0
        self.layers = nn.ModuleList(
            nn.LSTM(dim, cell_dim, proj_size=proj_size, batch_first=True) for _ in range(n_layers)
        )
        self.dropout = nn.Dropout(dropout)
        self.cell_clip = cell_clip or 0.0
        self.proj_clip = proj_clip or 0.0
        self.skip_connections = skip_connections
        self.forget_bias = forget_bias
        self.kernel = "auto"
        if forget_bias is not None:
            for layer in self.layers:
                with torch.no_grad():
                    layer.bias_hh_l0.zero_()
                    layer.bias_hh_l0[cell_dim : 2 * cell_dim] = forget_bias
                layer.bias_hh_l0.requires_grad_(False)

    @property
    def clipped(self) -> bool:
        return bool(self.cell_clip or self.proj_clip)

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        initial: list[LstmState] | None = None,
        final: bool = False,
        kernel: str | None = None,
        packed: PackedWeights | None = None,
        graphs: GraphCache | None = None,
    ) -> tuple[list[torch.Tensor], list[LstmState] | None]:
        """x (B, T, P) and lengths (B,) -> one (B, T, P) output per layer, and
        with `final` each layer's state after each row's last real step.
        `initial` gives each layer's starting state (zeros without it).
        `kernel` forces one (None: as `self.kernel` says). `packed`: where
        to keep packed weights for inference on the CPU (see
        `run_lstm_layer`), `graphs`: where to keep CUDA graphs for inference
        on a GPU (see `run_graphed_lstm_layer`); the caller empties them when
        the weights change."""
        kernel = self.kernel_for(x, initial, final, packed, kernel, graphs)
        outputs, states = [], []
        for i, layer in enumerate(self.layers):
            inputs = self.dropout(x)
            if kernel == "training":
                y = run_training_layers([layer], inputs[None])[0]
            elif kernel == "fused":
                y = run_fused_layer(layer, inputs, lengths)
            else:
                clips = self.cell_clip, self.proj_clip
                state = None if initial is None else initial[i]
                if kernel == "graph":
                    y, state = run_graphed_lstm_layer(
                        layer, inputs, lengths, state, *clips, final, graphs
                    )
                else:
                    layer_packed = None if packed is None else packed.setdefault(id(layer), {})
                    y, state = run_lstm_layer(
                        layer, inputs, lengths, state, *clips, final, layer_packed
                    )
                states.append(state)
            x = y + x if i > 0 and self.skip_connections else y
            outputs.append(x)
        return outputs, (states if final else None)

    def kernel_for(
        self,
        x: torch.Tensor,
        initial: list[LstmState] | None = None,
        final: bool = False,
        packed: PackedWeights | None = None,
        kernel: str | None = None,
        graphs: GraphCache | None = None,
    ) -> str:
        """The kernel `forward` runs for these arguments (see the class
        docstring): `kernel`, else `self.kernel`, with "auto" resolved."""
        kernel = kernel or self.kernel
        if kernel == "auto":
            plain = not (self.clipped or initial is not None or final or packed is not None)
            training = torch.is_grad_enabled() and x.device.type == "cpu"  # cuDNN is faster
            if not plain:
                kernel = "loop" if graphs is None else "graph"
            else:
                kernel = "training" if training else "fused"
        if kernel not in ("loop", "graph") and (initial is not None or final):
            raise ElmoSpacyError(
                f"States in or out need the loop or graph kernel: kernel = {kernel!r} cannot carry them"
            )
        if kernel == "graph" and graphs is None:
            raise ElmoSpacyError(
                "kernel = 'graph' runs at inference on a CUDA GPU (no gradients, eval mode), "
                "where the biLM keeps its graphs: use kernel = 'loop' elsewhere"
            )
        return kernel


def run_training_stacks(
    stacks: Sequence[LstmStack], inputs: Sequence[torch.Tensor]
) -> list[list[torch.Tensor]]:
    """Stacks of one shape (the biLM's two directions), each over its own
    inputs (B, T, P), from zero states on the training kernel: what
    `stack(x, lengths, kernel="training")[0]` gives for each, with each
    layer of all the stacks in one call (`run_training_layers`). Returns,
    per stack, one (B, T, P) output per layer."""
    xs = list(inputs)
    outputs: list[list[torch.Tensor]] = [[] for _ in stacks]
    for i, layers in enumerate(zip(*(stack.layers for stack in stacks))):
        y = run_training_layers(layers, torch.stack([s.dropout(x) for s, x in zip(stacks, xs)]))
        for d, stack in enumerate(stacks):
            xs[d] = y[d] + xs[d] if i > 0 and stack.skip_connections else y[d]
            outputs[d].append(xs[d])
    return outputs


def run_training_layers(layers: Sequence[nn.LSTM], x: torch.Tensor) -> torch.Tensor:
    """D unclipped layers of one shape from zero states, each over its own
    x[d]: x (D, B, T, I) -> (D, B, T, P), on the training kernel
    (`lstm_layer_for_training`), the products in the ambient precision
    (bfloat16 under autocast)."""
    bias = torch.stack([layer.bias_ih_l0 + layer.bias_hh_l0 for layer in layers])
    weight_ih = torch.stack([layer.weight_ih_l0 for layer in layers])
    weight_hh = torch.stack([layer.weight_hh_l0 for layer in layers])
    project = None
    if layers[0].proj_size:
        project = torch.stack([layer.weight_hr_l0 for layer in layers])
    dtype = matmul_dtype(layers[0].weight_hh_l0)
    return lstm_layer_for_training(x, weight_ih, weight_hh, bias, project, dtype)


def run_fused_layer(layer: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One layer on torch's fused kernel: x (B, T, I) -> (B, T, P). Without
    gradients, over the real positions only (a PackedSequence; zero past each
    row's length); with them, over the padded batch, whose backward pass is
    over twice as fast as a PackedSequence's on the CPU (pretraining batches
    are of like lengths)."""
    with warnings.catch_warnings():
        # Noise: torch runs its own kernel instead, as it should.
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
    packed: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, LstmState | None]:
    """One LSTM layer over x (B, T, I) with clipping (0: none; the output is
    clipped only where the layer projects it, as in TensorFlow); returns the
    outputs (B, T, P), zero past each row's length, and, with `final`, the
    state (h, c) after step lengths[b] - 1 of each row (the initial state for
    a row of length 0). `packed` (inference only): a dict in which to keep
    this layer's weights packed for oneDNN, reused from call to call.

    Rows run longest first and drop out of the recurrence when they end, and
    the input projections are computed for real positions only, in the
    time-major order of a PackedSequence: padding costs nothing.
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
    bias = layer.bias_ih_l0 + layer.bias_hh_l0
    gates_x = _linear(layer.weight_ih_l0, packed, "ih")(inputs, bias)  # (N, 4H)
    recur = _linear(layer.weight_hh_l0, packed, "hh")
    project = _linear(layer.weight_hr_l0, packed, "hr") if layer.proj_size else None
    outputs, offset = [], 0
    ended: list[LstmState] = []  # the states of rows that have ended, last rows first
    for n in active:
        if n < len(h):  # rows n: ended at the previous step; the rest run on
            if final:
                ended.append((h[n:], c[n:]))
            h, c = h[:n], c[:n]
        if n == 0:
            break
        gates = recur(h, gates_x[offset : offset + n])
        offset += n
        h, c = lstm_cell(gates, c, cell_clip)
        if project is not None:
            h = project(h, None)
            if proj_clip:
                h = h.clamp(-proj_clip, proj_clip)
        outputs.append(h)
    padded = x.new_zeros(steps, batch, out_dim)
    if outputs:
        padded[real] = torch.cat(outputs)
    restore = torch.argsort(order)
    y = padded.transpose(0, 1)[restore]
    if not final:
        return y, None
    ended.append((h, c))
    h, c = (torch.cat([state[k] for state in reversed(ended)]) for k in (0, 1))
    return y, (h[restore], c[restore])


def run_graphed_lstm_layer(
    layer: nn.LSTM,
    x: torch.Tensor,
    lengths: torch.Tensor,
    initial: LstmState | None,
    cell_clip: float,
    proj_clip: float,
    final: bool,
    graphs: GraphCache,
) -> tuple[torch.Tensor, LstmState | None]:
    """`run_lstm_layer` on a CUDA GPU without gradients: the same outputs
    and states, replayed from a CUDA graph of the whole layer (the input
    projections and `masked_recurrence`), one launch instead of about ten a
    step. The graph's shape is the batch's, its steps rounded up to a
    multiple of GRAPH_STEPS and its rows to one of GRAPH_ROWS (the extra rows
    of length 0), so that batches of like shapes share it; `graphs` keeps it.
    """
    batch, steps, in_dim = x.shape
    rows, padded_steps = (
        -(-batch // GRAPH_ROWS) * GRAPH_ROWS,
        -(-steps // GRAPH_STEPS) * GRAPH_STEPS,
    )
    hidden, out_dim = layer.hidden_size, layer.proj_size or layer.hidden_size
    dtype = matmul_dtype(layer.weight_hh_l0)
    cell_dtype = state_dtype(x.dtype)

    def make_inputs() -> tuple[torch.Tensor, ...]:
        # the weights transposed and cast once (in float32, the parameters
        # themselves), kept with the graph, which reads them
        weights = [w.to(dtype).t() for w in (layer.weight_ih_l0, layer.weight_hh_l0)]
        if layer.proj_size:
            weights.append(layer.weight_hr_l0.to(dtype).t())
        return (
            x.new_zeros(padded_steps, rows, in_dim),
            lengths.new_zeros(rows),
            x.new_zeros(rows, out_dim),
            x.new_zeros(rows, hidden, dtype=cell_dtype),
            layer.bias_ih_l0 + layer.bias_hh_l0,
            *weights,
        )

    def run(inputs, row_lengths, h, c, bias, w_ih, w_hh, w_hr=None) -> tuple[torch.Tensor, ...]:
        time = torch.arange(padded_steps, device=x.device)
        real = (time[:, None] < row_lengths[None, :])[..., None]  # (T, R, 1)
        gates_x = torch.addmm(bias, inputs.view(-1, in_dim), w_ih)
        gates_x = gates_x.view(padded_steps, rows, -1)
        return masked_recurrence(gates_x, real, h, c, w_hh, w_hr, cell_clip, proj_clip)

    key = (id(layer), rows, padded_steps, x.dtype, autocast_dtype(x.device.type))
    key += (cell_clip, proj_clip)
    captured = graphs.get(key, make_inputs, run)
    inputs, row_lengths, h, c = captured.inputs[:4]
    inputs[:steps, :batch] = x.transpose(0, 1)
    row_lengths.zero_()
    row_lengths[:batch] = lengths
    if initial is None:
        h.zero_()
        c.zero_()
    else:
        h[:batch], c[:batch] = initial
    outputs, h, c = captured.replay()
    y = outputs[:steps, :batch].transpose(0, 1).to(x.dtype, copy=True)
    return y, ((h[:batch].clone(), c[:batch].clone()) if final else None)


def masked_recurrence(
    gates_x: torch.Tensor,
    real: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    w_hh: torch.Tensor,
    w_hr: torch.Tensor | None,
    cell_clip: float,
    proj_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clipped recurrence of one layer over all R rows for all T steps,
    each row's state held still past its last real step: a fixed shape, as a
    CUDA graph needs. gates_x (T, R, 4H), the input projections with the
    bias; real (T, R, 1), True at each row's real steps; h (R, P) and c (R,
    H), the initial states; w_hh (P, 4H) and w_hr (H, P) or None, transposed.
    Returns the outputs (T, R, P), zero where not real, and the state (h, c)
    after each row's last real step."""
    outputs = []
    for t in range(gates_x.shape[0]):
        new_h, new_c = lstm_cell(torch.addmm(gates_x[t], h, w_hh), c, cell_clip)
        if w_hr is not None:
            new_h = new_h.mm(w_hr)
            if proj_clip:
                new_h = new_h.clamp(-proj_clip, proj_clip)
        outputs.append(torch.where(real[t], new_h, 0.0))
        h = torch.where(real[t], new_h, h.to(new_h.dtype))
        c = torch.where(real[t], new_c, c)
    return torch.stack(outputs), h, c


def lstm_cell(
    gates: torch.Tensor, c: torch.Tensor, cell_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's cell: gates (n, 4H), the pre-activations of i, f, g, o (a
    fresh array: where autograd records neither it nor c, it is overwritten),
    and the cell state c (n, H) -> (o tanh(cell), cell), each (n, H) in
    float32 where the gates are bfloat16; the cell clipped to [-cell_clip,
    cell_clip] (0: not clipped). Where autograd records nothing, the
    activations run in place: two new arrays instead of ten (the step's cost
    besides its products)."""
    gates = widened(gates)
    if gates.requires_grad or c.requires_grad:
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


def _linear(weight: torch.Tensor, packed: dict[str, torch.Tensor] | None, name: str) -> Product:
    """A function (x (N, in), add) -> x @ weight.T + add, where `add` is a bias
    (out,), an (N, out) array or None. With a `packed` cache and oneDNN, it
    runs on the weight packed once and kept under `name`: in float32, or under
    bfloat16 autocast a bfloat16 copy (x and a bias cast to it)."""
    if packed is None or not onednn_packing():
        transposed = weight.to(matmul_dtype(weight)).t()  # cast once, not at every step
        return lambda x, add: x.mm(transposed) if add is None else torch.addmm(add, x, transposed)
    dtype = matmul_dtype(weight)
    key = name if dtype == weight.dtype else f"{name}.{dtype}"
    if key not in packed:
        packed[key] = pack(weight, dtype)
    return packed_product(packed[key], dtype, fuse_add=dtype != weight.dtype)
