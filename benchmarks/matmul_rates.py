"""This machine's matmul rates, the rooflines of the benchmarks: on the CPU,
float32 through torch's default GEMM (MKL on x86 builds), float32 and bfloat16
through oneDNN (weights packed once, as the biLM's inference packs them); on a
CUDA GPU (--device cuda), float32 (TF32 off) and bfloat16 through cuBLAS.

    python benchmarks/matmul_rates.py [--size 2048] [--device cpu]

Each precision's share of the roofline is taken against its own rate on the
device (on the CPU, oneDNN's: the kernels the biLM runs in that precision);
MKL's float32 rate is printed for reference.
"""

import argparse
import json
import time
from collections.abc import Callable

import torch

from elmo_spacy.bilm.runtime.products import onednn_packing

RATES = ("mkl_float32", "onednn_float32", "onednn_bfloat16")
# The roofline of each precision of the biLM, on the CPU and on a CUDA GPU.
ROOFLINE = {"float32": "onednn_float32", "bfloat16": "onednn_bfloat16"}
CUDA_ROOFLINE = {"float32": "cuda_float32", "bfloat16": "cuda_bfloat16"}
# The size of the matmul that measures a device's peak: large enough to fill it.
SIZES = {"cpu": 2048, "cuda": 8192}


def float32_without_tf32() -> None:
    """Run float32 products on a GPU in float32, as the conformant path does
    (TF32 keeps 10 bits of their inputs' mantissas): for the whole run, the
    rates and the benchmarks measured against them alike."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def synchronize(device: torch.device | str = "cpu") -> None:
    """Wait for the work queued on `device` (a no-op on the CPU): what a
    timer must do before it reads the clock on a GPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def best_rate(
    run: Callable[[], object], flops: float, repeats: int, rounds: int, device="cpu"
) -> float:
    """FLOP/s of `run`: the best of `rounds` rounds of `repeats` calls (the peak)."""
    run()
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        synchronize(device)
        best = max(best, flops * repeats / (time.perf_counter() - started))
    return best


def matmul_rates(
    size: int | None = None, repeats: int = 10, rounds: int = 3, device: str = "cpu"
) -> dict[str, float]:
    """FLOP/s of a size^3 matmul per kernel (see RATES; on a GPU, CUDA_ROOFLINE's,
    float32 as the ambient TF32 setting says: see `float32_without_tf32`).
    Where oneDNN packs no bfloat16 (`onednn_packing`), there is no bfloat16
    rate: bfloat16 runs fall back to float32 there (and torch's unpacked
    bfloat16 matmul takes minutes to time)."""
    if torch.device(device).type == "cuda":
        return _cuda_rates(size or SIZES["cuda"], repeats, rounds, device)
    size = size or SIZES["cpu"]
    a, b = torch.randn(size, size), torch.randn(size, size)
    flops = 2.0 * size**3
    rates = {"mkl_float32": best_rate(lambda: a @ b, flops, repeats, rounds)}
    if onednn_packing():
        linear = torch.ops.mkldnn._linear_pointwise
        weight = b.t().contiguous()
        for name, dtype in (("onednn_float32", torch.float32), ("onednn_bfloat16", torch.bfloat16)):
            if not onednn_packing(dtype):
                continue  # no bfloat16 products here: the biLM multiplies in float32
            x = a.to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), size)
            rates[name] = best_rate(
                lambda x=x, packed=packed: linear(x, packed, None, "none", [], ""),
                flops,
                repeats,
                rounds,
            )
    else:
        rates["onednn_float32"] = rates["mkl_float32"]
        a16, b16 = a.bfloat16(), b.bfloat16()
        rates["onednn_bfloat16"] = best_rate(lambda: a16 @ b16, flops, repeats, rounds)
    return rates


def _cuda_rates(size: int, repeats: int, rounds: int, device: str) -> dict[str, float]:
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    flops = 2.0 * size**3
    rates = {"cuda_float32": best_rate(lambda: a @ b, flops, repeats, rounds, device)}
    a16, b16 = a.bfloat16(), b.bfloat16()
    rates["cuda_bfloat16"] = best_rate(lambda: a16 @ b16, flops, repeats, rounds, device)
    return rates


def roofline(rates: dict[str, float], precision: str) -> float:
    """The FLOP/s that `precision` is measured against (on the device whose
    rates `rates` are)."""
    names = CUDA_ROOFLINE if CUDA_ROOFLINE["float32"] in rates else ROOFLINE
    name = names["bfloat16" if precision == "float16" else precision]  # the same tensor cores
    return rates.get(name) or rates[names["float32"]]  # no bfloat16 rate: it runs in float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, help="default: 2048 on the CPU, 8192 on a GPU")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    float32_without_tf32()
    rates = matmul_rates(args.size, device=args.device)
    print(json.dumps({"threads": args.threads, **{k: round(v / 1e9, 1) for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
