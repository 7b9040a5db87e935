"""Products with a weight that oneDNN packed once into the layout its kernels
read fastest, skipping most of a plain GEMM's per-call time at the LSTM's
per-step sizes (benchmarks/step_gemm_rates.py)."""

import functools

import torch

from ..model.dtypes import without_autocast
from ..model.lstm import Product


@functools.cache
def onednn_packing(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch packs a weight in `dtype` for oneDNN's linear and
    the product gives the plain GEMM's result (asked once per dtype)."""
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        # Its own generator: drawing from torch's global one would shift the dropout
        # masks of the first run in a process (the answer is cached), not of later ones.
        generator = torch.Generator().manual_seed(0)
        weight, x = torch.randn(8, 4, generator=generator), torch.randn(3, 4, generator=generator)
        weight, x = weight.to(dtype), x.to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 3)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        with without_autocast("cpu"):  # the check may run under autocast
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            expected = x.float() @ weight.float().t()
            return bool(torch.allclose(y.float(), expected, atol=tolerance, rtol=tolerance))
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (out, in) in `dtype`, packed for oneDNN's linear."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous(), 32)


def packed_product(packed: torch.Tensor, dtype: torch.dtype, fuse_add: bool) -> Product:
    """(x (N, in), add) -> x @ weight.T + add in `dtype` on a `pack`ed weight;
    `add`: (out,), (N, out) or None, any dtype. fuse_add: add an (N, out)
    array before the product's result is rounded to `dtype`, not after."""
    linear = torch.ops.mkldnn._linear_pointwise

    def product(x: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
        x = x.to(dtype)
        if add is None or add.dim() == 1:
            bias = None if add is None else add.to(dtype)
            return linear(x, packed, bias, "none", [], "")
        if fuse_add:
            return linear.binary(x, add.to(dtype), packed, None, "add")
        return linear(x, packed, None, "none", [], "").add_(add)

    return product


def linear_product(weight: torch.Tensor, dtype: torch.dtype) -> Product:
    """`packed_product` for many products with one weight (out, in): packed
    once where oneDNN can, else cast once for a plain GEMM."""
    if weight.device.type == "cpu" and onednn_packing(dtype):
        return packed_product(pack(weight, dtype), dtype, fuse_add=dtype != torch.float32)
    transposed = weight.detach().to(dtype).t()

    def product(x: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
        x = x.to(dtype)
        return x.mm(transposed) if add is None else torch.addmm(add.to(dtype), x, transposed)

    return product
