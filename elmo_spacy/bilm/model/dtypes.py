"""The dtypes the model computes in under torch's autocast, and what stays
float32 (reductions, gate nonlinearities, the cell state)."""

import contextlib

import torch

REDUCED = (torch.bfloat16, torch.float16)  # the dtypes autocast may compute products in


def widened(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 if it is bfloat16 or float16 (a copy), else `x`."""
    return x.float() if x.dtype in REDUCED else x


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """An LSTM cell state's dtype beside activations of `dtype` (a running
    sum: float32 where they are reduced)."""
    return torch.float32 if dtype in REDUCED else dtype


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype on `device_type`, or None where it is off."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return None
    except (TypeError, AttributeError):  # torch < 2.4
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def without_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """A scope with autocast off on `device_type` (nothing where it is off)."""
    if autocast_dtype(device_type) is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def matmul_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a product with `weight` runs in here."""
    return autocast_dtype(weight.device.type) or weight.dtype


ROW_BLOCK = 128


def padded_rows(n: int) -> int:
    """`n` rounded up to a multiple of ROW_BLOCK: oneDNN builds a bfloat16
    kernel for each new shape, so a few sizes serve all batches."""
    return -(-n // ROW_BLOCK) * ROW_BLOCK
