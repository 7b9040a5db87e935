"""The per-step products of the LSTM recurrence, in float32, bfloat16 and
int8: what packing the weights for oneDNN buys over torch's plain GEMM, and
what an "int8" precision (dynamic quantization) would buy over bfloat16 on
this CPU.

    python benchmarks/step_gemm_rates.py [--rows 8 36 128] [--threads 2]
        [--shape original|pretraining]

Each step of a layer multiplies the rows still running (36 on average in the
`embedder` forward at the original shape; 16-80 in pretraining's batches) by
the recurrent weights (P x 4H) and the cell by the projection (H x P). Timed
at the original ELMo shape (H = 4096, P = 512) or at configs/bilm.cfg's
(H = 512, P = 128), GOP/s (2 per multiply-add), best of three rounds:

- float32 and bfloat16: oneDNN on weights packed once (the biLM's kernels,
  at inference and in training), and torch's plain GEMM (`torch.mm`: MKL in
  float32 on x86 builds) for reference;
- int8: torch's dynamic quantized linear (weights int8 per output channel,
  each call's input quantized per tensor), on each quantized engine torch
  has here ("x86", "fbgemm", "onednn").

Each with its largest error against the float32 product of torch's default
GEMM, over that product's largest |value|.
"""

import argparse
import contextlib
import json
import warnings

import torch
from matmul_rates import best_rate
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

import elmo_spacy.bilm.runtime.kernels as kernels
from elmo_spacy.bilm.runtime.products import pack

SHAPES = {
    "original": {"recurrent 512x16384": (512, 16384), "projection 4096x512": (4096, 512)},
    "pretraining": {"recurrent 128x2048": (128, 2048), "projection 512x128": (512, 128)},
}
ENGINES = ("x86", "fbgemm", "onednn")


def int8_linear(weight: torch.Tensor, engine: str) -> DynamicInt8Linear:
    """`weight` (out, in) as torch's dynamic int8 linear on `engine`."""
    torch.backends.quantized.engine = engine
    out_dim, in_dim = weight.shape
    with warnings.catch_warnings():  # torch marks its quantized tensors deprecated
        warnings.simplefilter("ignore", UserWarning)
        linear = DynamicInt8Linear(in_dim, out_dim)
        if engine == "onednn":  # per-tensor weights only
            scale = float(weight.abs().max() / 127)
            quantized = torch.quantize_per_tensor(weight, scale, 0, torch.qint8)
        else:
            scales = weight.abs().amax(1).clamp(min=1e-8) / 127
            zeros = torch.zeros(out_dim, dtype=torch.long)
            quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
        linear.set_weight_bias(quantized, torch.zeros(out_dim))
    return linear


@contextlib.contextmanager
def int8_lstm_products():
    """The LSTM's inference products (`kernels.packed_products`, on weights
    kept in the biLM's inference cache) as this benchmark times them: torch's
    dynamic int8 linear (x86 engine), weights quantized per output channel,
    the inputs at each call."""
    float32_products = kernels.packed_products

    def int8_products(packed):
        def product(weight, name):
            key = f"{name}.int8"
            if key not in packed:
                packed[key] = int8_linear(weight.detach().float(), "x86")
            layer = packed[key]
            return lambda x, add: layer(x.float()) if add is None else layer(x.float()).add_(add)

        return product

    kernels.packed_products = int8_products
    try:
        yield
    finally:
        kernels.packed_products = float32_products


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[8, 36, 128])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", choices=list(SHAPES), default="original")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    linear = torch.ops.mkldnn._linear_pointwise
    generator = torch.Generator().manual_seed(0)
    engines = [e for e in ENGINES if e in torch.backends.quantized.supported_engines]
    with torch.no_grad():
        for name, (in_dim, out_dim) in SHAPES[args.shape].items():
            weight = torch.randn(out_dim, in_dim, generator=generator) / in_dim**0.5
            dtypes = (torch.float32, torch.bfloat16)
            packed = {dtype: pack(weight, dtype) for dtype in dtypes}
            transposed = {dtype: weight.to(dtype).t() for dtype in dtypes}  # for torch.mm
            quantized = {engine: int8_linear(weight, engine) for engine in engines}
            for rows in args.rows:
                x = torch.randn(rows, in_dim, generator=generator)
                ops = 2.0 * rows * in_dim * out_dim
                exact = x @ weight.t()
                line = {"product": name, "rows": rows}
                for dtype, label in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
                    xd, w = x.to(dtype), packed[dtype]
                    run = lambda xd=xd, w=w: linear(xd, w, None, "none", [], "")  # noqa: E731
                    line[f"{label}_gops"] = round(best_rate(run, ops, 50, 3) / 1e9)
                    error = (run().float() - exact).abs().max() / exact.abs().max()
                    line[f"{label}_max_error"] = round(float(error), 4)
                    plain = lambda xd=xd, w=transposed[dtype]: xd.mm(w)  # noqa: E731
                    line[f"{label}_plain_gops"] = round(best_rate(plain, ops, 50, 3) / 1e9)
                for engine, layer in quantized.items():
                    torch.backends.quantized.engine = engine
                    run = lambda layer=layer, x=x: layer(x)  # noqa: E731
                    line[f"int8_{engine}_gops"] = round(best_rate(run, ops, 50, 3) / 1e9)
                    error = (layer(x) - exact).abs().max() / exact.abs().max()
                    line[f"int8_{engine}_max_error"] = round(float(error), 4)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
