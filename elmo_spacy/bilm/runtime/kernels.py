"""The kernels that run a biLM's LSTM stacks, and which runs when
(`choose_kernel`, which `BiLM._run` follows): "training"
(`lstm_layer_for_training`), "fused" (torch's LSTM) and "loop"
(`run_lstm_layer`, on oneDNN-packed weights at inference on the CPU).
"""

from collections.abc import Sequence

import torch
from torch import nn

from ..model.dtypes import matmul_dtype
from ..model.lstm import LstmStack, LstmState, Product, ProductOf, plain_product
from .cell_steps import triton_available
from .products import onednn_packing, pack, packed_product
from .recurrence import lstm_layer_for_training

PackedWeights = dict[int, dict[str, torch.Tensor]]  # id(layer) -> name -> packed weight


def choose_kernel(device: torch.device, *, clipped: bool, states: bool, packed: bool) -> str:
    """The kernel that runs a biLM's stacks, with or without gradients as
    torch is now (`packed`: the inference cache keeps packed weights):

    | the run | on the CPU | on a CUDA GPU |
    | --- | --- | --- |
    | with gradients, clipped | training | training (loop without Triton) |
    | with gradients, unclipped | training | fused (cuDNN; loop with states) |
    | at inference, clipped or with states | loop | loop |
    | at inference, unclipped | loop on packed weights (fused without oneDNN) | fused |
    """
    if packed:
        return "loop"
    if torch.is_grad_enabled() and (
        device.type == "cpu" or (clipped and device.type == "cuda" and triton_available())
    ):  # on a GPU cuDNN is faster where there is nothing to clip
        return "training"
    return "loop" if clipped or states else "fused"


def run_training_stacks(
    stacks: Sequence[LstmStack],
    inputs: Sequence[torch.Tensor],
    lengths: torch.Tensor,
    initial: Sequence[list[LstmState] | None],
    final: bool,
) -> tuple[list[list[torch.Tensor]], list[list[LstmState]]]:
    """What each `stack(x, lengths, initial, final)` gives, on the training
    kernel, layer i of every stack (of one shape) in one call."""
    xs = list(inputs)
    outputs: list[list[torch.Tensor]] = [[] for _ in stacks]
    finals: list[list[LstmState]] = [[] for _ in stacks]
    for i, layers in enumerate(zip(*(stack.layers for stack in stacks))):
        x = torch.stack([stack.dropout(xs[d]) for d, stack in enumerate(stacks)])
        starts = None
        if initial[0] is not None:
            starts = tuple(torch.stack([states[i][k] for states in initial]) for k in (0, 1))
        ys, ends = run_training_layers(
            layers, x, stacks[0].cell_clip, stacks[0].proj_clip, starts, lengths if final else None
        )
        for d, stack in enumerate(stacks):
            xs[d] = ys[d] + xs[d] if i > 0 and stack.skip_connections else ys[d]
            outputs[d].append(xs[d])
            if final:
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
    """`lstm_layer_for_training` on D `nn.LSTM` layers of one shape."""
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


def packed_products(packed: dict[str, torch.Tensor]) -> ProductOf:
    """The recurrence's products on weights oneDNN packed once, kept in
    `packed`; plain GEMMs where it cannot pack."""
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
