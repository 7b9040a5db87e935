"""Compiles the training kernel's Triton step kernels for NVIDIA GPUs without
one: Triton's own compiler and ptxas, from the kernels' source to a cubin,
each variant (dtype, input gates given apart or not, clip or not) for
sm_90 (H100). Run as a script in a process without
TRITON_INTERPRET (tests/test_lstm_implementations.py does); prints as JSON the
compiled variants and each kernel's arguments left unspecialised."""

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import elmo_spacy.bilm.runtime.triton_cell as kernels

STATE = {"previous", "cell", "cell_from_hidden", "forget", "grad_cell"}  # float32 always
INTEGERS = {"batch", "size"}


def signature(kernel, dtype: str) -> dict[str, str]:
    """Each argument's Triton type: pointers to `dtype` (the products') or
    float32 (the state's), int32 sizes and strides, constexprs."""
    types = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            types[name] = "constexpr"
        elif "stride" in name or name in INTEGERS:
            types[name] = "i32"
        elif name == "cell_clip":
            types[name] = "fp32"
        else:
            types[name] = "*fp32" if name in STATE else f"*{dtype}"
    return types


def main() -> None:
    compiled = []
    for arch in (90,):
        target = GPUTarget("cuda", arch, 32)
        for dtype in ("fp32", "bf16", "fp16"):
            for add_inputs in (True, False):
                for clip in (True, False):
                    constants = {"ADD_INPUTS": add_inputs, "CLIP": clip, "BLOCK": 128}
                    source = ASTSource(
                        kernels.forward_kernel,
                        signature(kernels.forward_kernel, dtype),
                        constexprs=constants,
                    )
                    assert triton.compile(source, target=target).asm["cubin"]
                    compiled.append(["forward", arch, dtype, add_inputs, clip])
            source = ASTSource(
                kernels.backward_kernel,
                signature(kernels.backward_kernel, dtype),
                constexprs={"BLOCK": 128},
            )
            assert triton.compile(source, target=target).asm["cubin"]
            compiled.append(["backward", arch, dtype])
    unspecialised = {
        kernel.fn.__name__: sorted(p.name for p in kernel.params if p.do_not_specialize)
        for kernel in (kernels.forward_kernel, kernels.backward_kernel)
    }
    print(json.dumps({"compiled": compiled, "unspecialised": unspecialised}))


if __name__ == "__main__":
    main()
