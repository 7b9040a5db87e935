"""The numeric precision a biLM computes in: float32, bfloat16 or float16.

- "float32" (the default): every tensor in float32, the conformant path
  (a converted bilm-tf model reproduces the reference to 1e-5); on a GPU,
  cuDNN's convolutions too, which torch would run in TF32.
- "bfloat16": the matrix products (char CNN, highway, projections, the LSTM
  GEMMs, the softmax's logits) run in bfloat16 under torch's autocast, with
  float32 accumulation inside each product. The weights stay float32 (the
  master copy that training updates and that is saved); what needs the range
  or the resolution stays float32 too: the log-softmax and the loss, and in
  this package's LSTM kernels (all of them on the CPU: bilm/model/lstm.py,
  bilm/runtime/recurrence.py) the gate nonlinearities and the cell state. On other
  devices unclipped training runs torch's fused LSTM, which under autocast
  keeps its cell state in bfloat16. The adaptive softmax's tail clusters,
  narrow products, run in float32 (see `adaptive_nll`). At inference the
  LSTM weights are packed for oneDNN in bfloat16 once per version of the
  weights. Outputs handed to users are float32.
  benchmarks/precision_perplexity.py measures what training in bfloat16
  costs in dev perplexity.

- "float16": the same products in float16, for GPUs that multiply float16
  but not bfloat16 (T4, V100: Turing and Volta). float16 keeps 5 bits of
  exponent, so gradients can underflow: training scales the loss (the
  pretraining loop with torch's GradScaler, `spacy train` with thinc's
  `PyTorchGradScaler` in the biLM's shim) and skips a step whose gradients
  overflowed. On the CPU, float16 runs as float32, with a warning.

bfloat16 runs where the hardware multiplies in it (x86 CPUs with
AVX512-BF16 or AMX-BF16, GPUs from Ampere on); elsewhere it would be
emulated, slower than float32, so the biLM runs float32 instead, with a
warning that says why and names float16 on a GPU that has it. A precision
asked for is honoured: on a CPU with AVX512-BF16 but no AMX, where bfloat16
may multiply slower than float32, "bfloat16" still runs bfloat16, with a
warning that names "auto".

- "auto": the package chooses: bfloat16 on a GPU that has it natively, and
  on a CPU that has the instructions and multiplies a product of a biLM's
  size faster in bfloat16 than in float32, timed once a process
  (`cpu_product_rates`, about 0.1 s); float32 elsewhere. The same command
  may so choose differently on a loaded machine: name the precision where a
  run must be repeatable.
"""

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
    """`precision` if it is one of PRECISIONS; a ValueError naming `where`
    and the choices if not."""
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
    """Whether this CPU's bfloat16 instructions may multiply slower than its
    float32 ones: x86 with AVX512-BF16 but no AMX (an Intel Xeon of that
    kind at about half its float32 rate; AMD's at twice)."""
    has_amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return _cpu_vendor() == "GenuineIntel" and not has_amx


def _cpu_vendor() -> str | None:
    """The CPU's vendor as Linux names it (GenuineIntel, AuthenticAMD); None
    where unknown."""
    return _cpuinfo_value(("vendor_id",))


def _cpuinfo_value(keys: tuple[str, ...]) -> str | None:
    """The value of the first line of Linux's /proc/cpuinfo that starts with
    one of `keys`; None elsewhere or where there is none."""
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
def _cpu_bfloat16_slower() -> str | None:
    float32, bfloat16 = cpu_product_rates()
    if bfloat16 < float32:
        return (
            f"this CPU multiplies bfloat16 at {bfloat16:.0f} GFLOP/s, slower than float32 "
            f"at {float32:.0f} (measured on a product of a biLM's size)"
        )
    return None


def cpu_product_rates(rows: int = 256, width: int = 512, rounds: int = 3) -> tuple[float, float]:
    """GFLOP/s of this CPU's product of a biLM's size ((rows, width) by
    (width, 4 width), an LSTM's gates) in float32 and in bfloat16, on
    torch's threads: the best of `rounds` rounds each, taken in turn so that
    other work on the cores slows both alike (about 0.1 s in all). Having
    bfloat16 instructions is not enough: a CPU with AVX512-BF16 but no AMX
    may multiply bfloat16 at about half its float32 rate, so the rates are
    measured rather than read from the CPU's flags."""
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
    """Whether this CPU has instructions that multiply bfloat16: on x86
    AVX512-BF16 or AMX (torch's own CPU checks, on every OS; oneDNN's
    bfloat16 check asks only for AVX-512, on which it emulates bfloat16), on
    ARM the BF16 extension where Linux lists it (elsewhere assumed)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        flags = _linux_cpu_flags()
        return flags is None or "bf16" in flags
    checks = [getattr(torch.cpu, f"_is_{name}_supported", None) for name in X86_BF16_CHECKS]
    return any(check() for check in checks if check is not None)


def _linux_cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them; None where unknown."""
    flags = _cpuinfo_value(("flags", "Features"))
    return None if flags is None else set(flags.split())


def resolve_precision(
    precision: str,
    device: torch.device | str = "cpu",
    where: str = "precision",
) -> str:
    """The precision a biLM will run in: `precision` (checked), or float32
    with a warning where a reduced precision cannot run natively on
    `device`; "auto" resolved as the module's docstring says. The warning
    names `where` and points at the first line outside this package (and
    torch) that led to it: the user's."""
    check_precision(precision, where)
    if precision == "auto":
        return _auto_precision(torch.device(device))
    reason = None
    if precision == "bfloat16":
        reason = bfloat16_unsupported(device)
        if reason is not None and torch.device(device).type == "cuda":
            reason += "; precision = 'float16' is the fast path on this GPU"
    elif precision == "float16":
        reason = float16_unsupported(device)
    if reason is not None:
        warnings.warn(
            f"{where} = {precision!r} runs as 'float32': {reason}.",
            RuntimeWarning,
            stacklevel=_callers_stacklevel(),
        )
        return "float32"
    if precision == "bfloat16" and torch.device(device).type == "cpu":
        if cpu_bfloat16_may_be_slower():
            warnings.warn(
                f"{where} = 'bfloat16' on a CPU with AVX512-BF16 and no AMX, which may multiply "
                "bfloat16 slower than float32: precision = 'auto' times both and takes the faster.",
                RuntimeWarning,
                stacklevel=_callers_stacklevel(),
            )
    return precision


def _auto_precision(device: torch.device) -> str:
    """What precision = "auto" runs on `device`."""
    if bfloat16_unsupported(device) is not None:
        return "float32"
    if device.type == "cpu" and _cpu_bfloat16_slower() is not None:
        return "float32"
    return "bfloat16"


def _callers_stacklevel() -> int:
    """The stacklevel, for a warning raised by the caller, of the first frame
    outside this package and torch."""
    inside = (str(Path(__file__).parents[2]), str(Path(torch.__file__).parent))
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def autocast(precision: str, device: torch.device | str) -> torch.autocast:
    """torch's autocast for `precision` on `device` (disabled for float32)."""
    device_type = torch.device(device).type
    dtype = DTYPES.get(precision, torch.bfloat16)
    return torch.autocast(device_type, dtype=dtype, enabled=precision in DTYPES)


def in_precision(method: Method) -> Method:
    """Decorate a BiLM method to run under the biLM's `precision`: float32
    calls it as it is; bfloat16 and float16 call it under autocast and hand
    back the reduced-precision tensors of its result (in tuples, lists, dicts
    and dataclasses) as float32.

    Under `torch.inference_mode`, autocast keeps no bfloat16 copy of a
    weight: it casts the weight again at every product (the char CNN's
    highway layers then cost twice their float32 time). So a reduced-precision call
    made in inference mode runs under `torch.no_grad` instead, which computes
    the same numbers; its outputs are then ordinary tensors.

    float32 on a GPU runs cuDNN's convolutions (the char CNN) in float32
    (`float32_convolutions`)."""

    @functools.wraps(method)
    def run(bilm, *args, **kwargs):
        if bilm.precision == "float32":
            with float32_convolutions(next(bilm.parameters()).device):
                return method(bilm, *args, **kwargs)
        with contextlib.ExitStack() as scope:
            if torch.is_inference_mode_enabled():
                scope.enter_context(torch.inference_mode(False))
                scope.enter_context(torch.no_grad())
            scope.enter_context(autocast(bilm.precision, next(bilm.parameters()).device))
            result = method(bilm, *args, **kwargs)
        return to_float32(result)

    return run  # type: ignore[return-value]


@contextlib.contextmanager
def float32_convolutions(device: torch.device):
    """A scope in which cuDNN's convolutions on `device` multiply in float32.
    torch lets them round their inputs to TF32 by default (10 bits of
    mantissa: enough for `embed` on a GPU to differ from the CPU by up to
    about 1e-3 of the value);
    its matrix products, whose TF32 is off by default, are left as the user
    set them. The setting is torch's, for the whole process: it is restored
    on leaving."""
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
