"""The LSTM kernels that run a biLM's stacks fast, and the one place where the
kernel for a run is chosen (`choose_kernel`).

Four kernels run the same parameters (`elmo_spacy.bilm.model.lstm.LstmStack`):

- "training": `lstm_layer_for_training` (runtime/recurrence.py: forward and
  backward written out, the products over all time steps in single GEMMs,
  the clips included), both directions' layers in one call
  (`run_training_stacks`); from zero or given states, with gradients: the CPU's, and
  a CUDA GPU's where the LSTM clips (each step's elementwise work one Triton
  kernel);
- "fused": torch's LSTM (`run_fused_layer`): cuDNN on a GPU, and on the CPU
  at inference where oneDNN cannot pack weights;
- "loop": the written-out recurrence that clips (`run_lstm_layer`), which
  takes and gives states; at inference on the CPU on weights that oneDNN
  packed once for small batches (`packed_products`, twice a plain GEMM's
  speed at ELMo's sizes);
- "graph": the same recurrence on a CUDA GPU at inference, replayed from a
  CUDA graph of the whole layer (`run_graphed_lstm_layer`), where cuDNN
  cannot clip.
"""

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from ...errors import ElmoSpacyError
from ..model.dtypes import autocast_dtype, matmul_dtype, state_dtype
from ..model.lstm import (
    LayerKernel,
    LstmStack,
    LstmState,
    Product,
    ProductOf,
    lstm_step,
    plain_product,
    run_fused_layer,
    run_lstm_layer,
    run_stacks,
    transposed_product,
)
from ..model.network import StacksRunner, States
from .cell_steps import triton_available
from .graphs import GraphCache
from .products import onednn_packing, pack, packed_product
from .recurrence import lstm_layer_for_training

KERNELS = ("auto", "training", "fused", "loop", "graph")
PackedWeights = dict[int, dict[str, torch.Tensor]]  # id(layer) -> name -> packed weight
GRAPH_STEPS = 8  # a graph's steps: a batch's, rounded up to a multiple of these
GRAPH_ROWS = 8  # a graph's rows: likewise


def choose_kernel(
    requested: str,
    *,
    clipped: bool,
    device: torch.device,
    states: bool,
    packed: bool,
    graphs: bool,
) -> str:
    """The kernel that runs a biLM's stacks:

    | the run | on the CPU | on a CUDA GPU |
    | --- | --- | --- |
    | states in or out, at inference | loop | graph |
    | with gradients (training), clipped | training | training (loop without Triton) |
    | with gradients (training), unclipped | training | fused (cuDNN; loop with states) |
    | clipped, at inference | loop | graph |
    | unclipped, at inference | loop on packed weights (fused without oneDNN) | fused |

    requested: "auto" (the table), or a kernel to force (benchmarks, tests:
        "fused" ignores the clips, "training" needs
        gradients and "graph" a CUDA graph cache).
    clipped: whether the LSTM clips its cell or projection.
    states: whether states come in (initial) or go out (final).
    packed: whether the inference cache holds oneDNN-packed weights (CPU,
        no gradients, eval mode).
    graphs: whether there is a CUDA graph cache (GPU, no gradients, eval mode).
    """
    if requested not in KERNELS:
        raise ElmoSpacyError(f"LSTM kernel {requested!r}: use one of {', '.join(KERNELS)}")
    kernel = requested
    if kernel == "auto":
        if packed or (clipped and graphs) or (states and graphs):
            kernel = "graph" if graphs else "loop"
        elif torch.is_grad_enabled() and (
            device.type == "cpu" or (clipped and device.type == "cuda" and triton_available())
        ):  # on a GPU cuDNN is faster where there is nothing to clip
            kernel = "training"
        else:
            kernel = "loop" if clipped or states else "fused"
    if kernel == "fused" and states:
        raise ElmoSpacyError(
            "States in or out need the loop, graph or training kernel: kernel = 'fused' cannot "
            "carry them"
        )
    if kernel == "graph" and not graphs:
        raise ElmoSpacyError(
            "kernel = 'graph' runs at inference on a CUDA GPU (no gradients, eval mode), "
            "where the biLM keeps its graphs: use kernel = 'loop' elsewhere"
        )
    return kernel


def stacks_runner(
    kernel: str, packed: PackedWeights | None = None, graphs: GraphCache | None = None
) -> StacksRunner:
    """What runs both stacks on `kernel` (see `run_stacks`): "training" runs
    each layer of the two directions in one call; the others run the stacks
    one after the other, each layer on the kernel. `packed` (loop) and
    `graphs` (graph) are the inference cache's: where packed weights and
    CUDA graphs are kept."""
    if kernel == "training":
        return _training_stacks
    if kernel == "fused":
        layer: LayerKernel = _fused_layer
    elif kernel == "graph":
        layer = partial(run_graphed_lstm_layer, graphs=graphs)
    else:
        layer = partial(_loop_layer, packed=packed)
    return partial(run_stacks, kernel=layer)


def _training_stacks(
    forward_stack: LstmStack,
    backward_stack: LstmStack,
    forward_inputs: torch.Tensor,
    backward_inputs: torch.Tensor,
    lengths: torch.Tensor,
    initial: States,
    final: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor], States]:
    initials = [initial.get("forward"), initial.get("backward")]
    (forward_layers, backward_layers), finals = run_training_stacks(
        [forward_stack, backward_stack],
        [forward_inputs, backward_inputs],
        None if initials[0] is None else initials,
        lengths if final else None,
    )
    return forward_layers, backward_layers, {"forward": finals[0], "backward": finals[1]}


def _fused_layer(layer, x, lengths, initial, cell_clip, proj_clip, final):
    return run_fused_layer(layer, x, lengths), None


def _loop_layer(layer, x, lengths, initial, cell_clip, proj_clip, final, packed=None):
    product = None if packed is None else packed_products(packed.setdefault(id(layer), {}))
    return run_lstm_layer(layer, x, lengths, initial, cell_clip, proj_clip, final, product)


def packed_products(packed: dict[str, torch.Tensor]) -> ProductOf:
    """The recurrence's products on weights that oneDNN packed once, kept in
    `packed` under the weight's name: in float32, or under bfloat16 autocast
    a bfloat16 copy (x and a bias cast to it). Where oneDNN cannot pack the
    dtype (`onednn_packing`), plain GEMMs."""
    if not onednn_packing():
        return plain_product

    def product(weight: torch.Tensor, name: str) -> Product:
        dtype = matmul_dtype(weight)
        if not onednn_packing(dtype):
            return plain_product(weight, name)
        key = name if dtype == weight.dtype else f"{name}.{dtype}"
        if key not in packed:
            packed[key] = pack(weight, dtype)
        return packed_product(packed[key], dtype, fuse_add=dtype != weight.dtype)

    return product


def run_training_stacks(
    stacks: Sequence[LstmStack],
    inputs: Sequence[torch.Tensor],
    initial: Sequence[list[LstmState]] | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[list[list[torch.Tensor]], list[list[LstmState]]]:
    """Stacks of one shape (the biLM's two directions), each over its own
    inputs (B, T, P), on the training kernel: what `stack(x, lengths,
    initial, final, kernel="training")` gives for each, with each layer of
    all the stacks in one call (`run_training_layers`). `initial`: per
    stack, each layer's starting state (None: zeros); `lengths` (B,): give
    each layer's final states. Returns, per stack, one (B, T, P) output per
    layer, and per stack its layers' final states (empty without `lengths`)."""
    xs = list(inputs)
    outputs: list[list[torch.Tensor]] = [[] for _ in stacks]
    finals: list[list[LstmState]] = [[] for _ in stacks]
    for i, layers in enumerate(zip(*(stack.layers for stack in stacks))):
        inputs = torch.stack([s.dropout(x) for s, x in zip(stacks, xs)])
        starts = None
        if initial is not None:
            starts = tuple(torch.stack([states[i][k] for states in initial]) for k in (0, 1))
        y, ends = run_training_layers(
            layers, inputs, stacks[0].cell_clip, stacks[0].proj_clip, starts, lengths
        )
        for d, stack in enumerate(stacks):
            xs[d] = y[d] + xs[d] if i > 0 and stack.skip_connections else y[d]
            outputs[d].append(xs[d])
            if ends is not None:
                finals[d].append((ends[0][d], ends[1][d]))
    return outputs, finals


def run_training_layers(
    layers: Sequence[nn.LSTM],
    x: torch.Tensor,
    cell_clip: float = 0.0,
    proj_clip: float = 0.0,
    initial: LstmState | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LstmState | None]:
    """D layers of one shape, each over its own x[d]: x (D, B, T, I) -> (D,
    B, T, P), on the training kernel (`lstm_layer_for_training`), the
    products in the ambient precision (bfloat16 under autocast), and with
    `lengths` the final states (h (D, B, P), c (D, B, H)). `initial`: the
    starting states (h (D, B, P), c (D, B, H)), None for zeros. cell_clip,
    proj_clip: as `LstmStack`'s."""
    bias = torch.stack([layer.bias_ih_l0 + layer.bias_hh_l0 for layer in layers])
    weight_ih = torch.stack([layer.weight_ih_l0 for layer in layers])
    weight_hh = torch.stack([layer.weight_hh_l0 for layer in layers])
    project = None
    if layers[0].proj_size:
        project = torch.stack([layer.weight_hr_l0 for layer in layers])
    dtype = matmul_dtype(layers[0].weight_hh_l0)
    return lstm_layer_for_training(
        x, weight_ih, weight_hh, bias, project, dtype, cell_clip, proj_clip, initial, lengths
    )


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
    recur = transposed_product(w_hh)
    project = None if w_hr is None else transposed_product(w_hr)
    outputs = []
    for t in range(gates_x.shape[0]):
        new_h, new_c = lstm_step(gates_x[t], h, c, recur, project, cell_clip, proj_clip)
        outputs.append(torch.where(real[t], new_h, 0.0))
        h = torch.where(real[t], new_h, h.to(new_h.dtype))
        c = torch.where(real[t], new_c, c)
    return torch.stack(outputs), h, c
