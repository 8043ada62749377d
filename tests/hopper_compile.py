"""A generated module's Gluon kernel compiled for an H100 without a GPU (to PTX and through ptxas): the part the
Hopper compile scripts of test_gluon.py and test_gluon_gradients.py share. Those scripts run in a process of
their own, without TRITON_INTERPRET, and import this file from the tests folder."""
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

GL_DTYPES = {"fp16": gl.float16, "bf16": gl.bfloat16, "fp32": gl.float32}


def compile_for_hopper(kernel, values: dict, descriptor, pointer):
    """The kernel compiled for sm_90 with 4 warps a partition and 168 registers: `values` its constexprs,
    `descriptor(name)` a tensor descriptor parameter's (dtype, block) or None, `pointer(name)` a pointer's
    type ("*fp32"); the other parameters are i32. Returns (compiled, ptx, the setmaxnreg (inc|dec, count)
    pairs)."""
    signature, constants = {}, {}
    for p in kernel.params:
        found = None if p.is_constexpr else descriptor(p.name)
        if p.is_constexpr:
            signature[p.name], constants[p.name] = "constexpr", values[p.name]
        elif found is not None:
            dtype, block = found
            layout = gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype])
            signature[p.name] = f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"
        elif p.name.endswith("_ptr"):
            signature[p.name] = pointer(p.name)
        else:
            signature[p.name] = "i32"
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168})
    ptx = compiled.asm["ptx"]
    regs = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    return compiled, ptx, regs
