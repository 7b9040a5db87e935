"""The precision a biLM computes in: float32, bfloat16, float16 or auto
(docs/precision-and-gpus.md). Reduced precisions run the products under
torch's autocast; where the hardware would emulate them, float32 runs, with
a warning that says why."""

import contextlib
import functools
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from ...errors import ElmoSpacyError

PRECISIONS = ("float32", "bfloat16", "float16", "auto")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# torch.cpu's checks (`_is_<name>_supported`) for x86 instructions that multiply bfloat16.
X86_BF16_CHECKS = ("avx512_bf16", "amx_tile")

Method = TypeVar("Method", bound=Callable[..., Any])


def check_precision(precision: str, where: str = "precision") -> str:
    """`precision`, refused (naming `where`) if not one of PRECISIONS."""
    if precision not in PRECISIONS:
        raise ElmoSpacyError(
            f"{where} = {precision!r} is not a precision this biLM runs in: use one of "
            f"{', '.join(repr(p) for p in PRECISIONS)}"
        )
    return precision


def bfloat16_unsupported(device: torch.device | str = "cpu") -> str | None:
    """Why bfloat16 would not pay on `device`, or None where it does."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.5
            native = torch.cuda.is_bf16_supported()
        if not native:
            return f"{torch.cuda.get_device_name(device)} has no native bfloat16"
        return None
    if device.type != "cpu":
        return f"bfloat16 is not supported here on {device.type} devices"
    return _cpu_bfloat16_unsupported()


def float16_unsupported(device: torch.device | str = "cpu") -> str | None:
    """Why float16 would not pay on `device`, or None where it does (CUDA GPUs)."""
    if torch.device(device).type == "cuda":
        return None
    return "float16 is for GPUs without bfloat16; on the CPU the biLM computes in float32"


@functools.cache
def _cpu_bfloat16_unsupported() -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch was built without oneDNN, which runs bfloat16 on the CPU"
    try:
        usable = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        usable = False
    if not usable:
        return "oneDNN cannot run bfloat16 on this CPU"
    if not cpu_multiplies_bfloat16():
        return (
            "this CPU has no bfloat16 instructions: bfloat16 would be emulated, slower than float32"
        )
    return None


def cpu_bfloat16_may_be_slower() -> bool:
    """Whether this CPU may multiply bfloat16 slower than float32: an Intel
    x86 without AMX (AVX512-BF16 at about half its float32 rate)."""
    has_amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return _cpuinfo_value(("vendor_id",)) == "GenuineIntel" and not has_amx


def _cpuinfo_value(keys: tuple[str, ...]) -> str | None:
    """The first /proc/cpuinfo value under one of `keys`; None where none."""
    if platform.system() != "Linux":
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(keys):
            return line.split(":", 1)[1].strip()
    return None


@functools.cache
def _cpu_bfloat16_slower() -> bool:
    """Whether this CPU multiplied bfloat16 slower than float32, timed once."""
    float32, bfloat16 = cpu_product_rates()
    return bfloat16 < float32


def cpu_product_rates(rows: int = 256, width: int = 512, rounds: int = 3) -> tuple[float, float]:
    """GFLOP/s (float32, bfloat16) of this CPU's (rows, width) x (width,
    4 width) product, an LSTM's gates: the best of `rounds`, in turn."""
    generator = torch.Generator().manual_seed(0)  # not torch's global one (dropout masks)
    x = torch.randn(rows, width, generator=generator)
    weight = torch.randn(4 * width, width, generator=generator)
    flops = 2.0 * rows * width * 4 * width
    best = {torch.float32: 0.0, torch.bfloat16: 0.0}
    with torch.autocast("cpu", enabled=False), torch.inference_mode():
        operands = {dtype: (x.to(dtype), weight.to(dtype)) for dtype in best}
        for a, b in operands.values():
            torch.nn.functional.linear(a, b)  # the kernels' first-call setup
        for _ in range(rounds):
            for dtype, (a, b) in operands.items():
                started = time.perf_counter()
                for _ in range(4):
                    torch.nn.functional.linear(a, b)
                best[dtype] = max(best[dtype], 4 * flops / (time.perf_counter() - started))
    return best[torch.float32] / 1e9, best[torch.bfloat16] / 1e9


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU has bfloat16 multiply instructions: on x86 AVX512-BF16
    or AMX (oneDNN's own check asks only for AVX-512, on which it emulates),
    on ARM the BF16 extension where Linux lists it (elsewhere assumed)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        flags = _cpuinfo_value(("flags", "Features"))
        return flags is None or "bf16" in flags.split()
    checks = [getattr(torch.cpu, f"_is_{name}_supported", None) for name in X86_BF16_CHECKS]
    return any(check() for check in checks if check is not None)


def resolve_precision(
    precision: str, device: torch.device | str = "cpu", where: str = "precision"
) -> str:
    """The precision a biLM will run in on `device`; warnings name `where`
    and point at the user's line."""
    check_precision(precision, where)
    device = torch.device(device)
    if precision == "auto":
        if bfloat16_unsupported(device) is not None:
            return "float32"
        return "float32" if device.type == "cpu" and _cpu_bfloat16_slower() else "bfloat16"
    reason = None
    if precision == "bfloat16":
        reason = bfloat16_unsupported(device)
        if reason is not None and device.type == "cuda":
            reason += "; precision = 'float16' is the fast path on this GPU"
    elif precision == "float16":
        reason = float16_unsupported(device)
    if reason is not None:
        _warn(f"{where} = {precision!r} runs as 'float32': {reason}.")
        return "float32"
    if precision == "bfloat16" and device.type == "cpu" and cpu_bfloat16_may_be_slower():
        _warn(
            f"{where} = 'bfloat16' on a CPU with AVX512-BF16 and no AMX, which may multiply "
            "bfloat16 slower than float32: precision = 'auto' times both and takes the faster."
        )
    return precision


def _warn(message: str) -> None:
    """A RuntimeWarning that points at the first frame outside this package and torch."""
    inside = (str(Path(__file__).parents[2]), str(Path(torch.__file__).parent))
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def in_precision(method: Method) -> Method:
    """Decorate a BiLM method to run in the biLM's `precision`, its result's
    tensors handed back as float32. Under `torch.inference_mode` autocast
    would cast each weight again at every product: such a call runs under
    `torch.no_grad` instead (the same numbers)."""

    @functools.wraps(method)
    def run(bilm, *args, **kwargs):
        device = next(bilm.parameters()).device
        if bilm.precision == "float32":
            with float32_convolutions(device):
                return method(bilm, *args, **kwargs)
        with contextlib.ExitStack() as scope:
            if torch.is_inference_mode_enabled():
                scope.enter_context(torch.inference_mode(False))
                scope.enter_context(torch.no_grad())
            scope.enter_context(torch.autocast(device.type, dtype=DTYPES[bilm.precision]))
            result = method(bilm, *args, **kwargs)
        return to_float32(result)

    return run  # type: ignore[return-value]


@contextlib.contextmanager
def float32_convolutions(device: torch.device):
    """A scope in which cuDNN's convolutions on `device` multiply in float32,
    not TF32 (torch's default, which moves outputs by up to about 1e-3)."""
    if device.type != "cuda" or not torch.backends.cudnn.allow_tf32:
        yield
        return
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = True


def to_float32(value: Any) -> Any:
    """`value` with every bfloat16 or float16 tensor in it converted to float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, (tuple, list)):
        return type(value)(to_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: to_float32(v) for k, v in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: to_float32(getattr(value, f.name)) for f in fields(value)})
    return value
