"""This machine's matmul rates, the rooflines of the benchmarks: float32
through torch's default GEMM (MKL on x86 builds), float32 and bfloat16 through
oneDNN (weights packed once, as the biLM's inference packs them).

    python benchmarks/matmul_rates.py [--size 2048]

Each precision's share of the roofline is taken against its own oneDNN rate
(the kernels the biLM runs in that precision); MKL's float32 rate is printed
for reference.
"""

import argparse
import json
import time
from collections.abc import Callable

import torch

from elmo_spacy.bilm.lstm import onednn_packing

RATES = ("mkl_float32", "onednn_float32", "onednn_bfloat16")
# The roofline of each precision of the biLM.
ROOFLINE = {"float32": "onednn_float32", "bfloat16": "onednn_bfloat16"}


def best_rate(run: Callable[[], object], flops: float, repeats: int, rounds: int) -> float:
    """FLOP/s of `run`: the best of `rounds` rounds of `repeats` calls (the peak)."""
    run()
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        best = max(best, flops * repeats / (time.perf_counter() - started))
    return best


def matmul_rates(size: int = 2048, repeats: int = 10, rounds: int = 3) -> dict[str, float]:
    """FLOP/s of a size^3 matmul per kernel (see RATES). Without oneDNN's
    packed linear, the oneDNN float32 rate is torch's default float32 rate
    and bfloat16 is torch's bfloat16 matmul."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    flops = 2.0 * size**3
    rates = {"mkl_float32": best_rate(lambda: a @ b, flops, repeats, rounds)}
    if onednn_packing():
        linear = torch.ops.mkldnn._linear_pointwise
        weight = b.t().contiguous()
        for name, dtype in (("onednn_float32", torch.float32), ("onednn_bfloat16", torch.bfloat16)):
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


def roofline(rates: dict[str, float], precision: str) -> float:
    """The FLOP/s that `precision` is measured against."""
    return rates[ROOFLINE[precision]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rates = matmul_rates(args.size)
    print(json.dumps({"threads": args.threads, **{k: round(v / 1e9, 1) for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
