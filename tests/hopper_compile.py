"""What the Hopper tests share, importable without the compiler (a GPU machine may run them from a filled kernel
cache): a generated module's Gluon kernel compiled for an H100 without a GPU (to PTX and through ptxas), for the
compile scripts of test_gluon.py and test_gluon_gradients.py, which run in a process of their own without
TRITON_INTERPRET and import this file from the tests folder; and the check of a one-pass backward against
float64 on the GPU, with the listed-mask specs it runs on."""
import re

import torch
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


def check_on_hopper(spec, sizes: dict, seed: int, tol: float) -> None:
    """The one-pass backward of `spec` on the GPU: the Gluon kernel runs, and every floating input's gradient is
    within `tol` (relative to its scale) of float64 autograd of the plain math."""
    from neptune_eqsat.frontend.reference import evaluate, random_inputs
    from neptune_eqsat.training import Differentiable
    inputs = random_inputs(spec, sizes, seed=seed)
    xs = [t.to("cuda").requires_grad_(t.is_floating_point()) for t in inputs.values()]
    out = Differentiable(spec, deterministic=False)(*xs)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out.backward(g.to(out.dtype).to("cuda"))
        torch.cuda.synchronize()
    assert any("_gluon_kernel" in e.key for e in prof.key_averages())   # the Gluon kernel ran, not Triton's
    ref = {n: t.detach().clone().requires_grad_(t.is_floating_point()) for n, t in inputs.items()}
    evaluate(spec, ref, differentiable=True).backward(g)
    for (n, r), x in zip(ref.items(), xs):
        if r.is_floating_point():
            scale = max(1.0, r.grad.abs().max().item())
            assert (x.grad.cpu().double() - r.grad).abs().max().item() / scale < tol, n


def listed_mask_spec(mask: str, S: int = 256):
    """Attention under a mask whose blocks are listed at run time, traced from a FlexAttention mask_mod:
    "prefix" (positions only: the table is built once per sizes) or "documents" (a captured id per position:
    the table is rebuilt from the ids at every call)."""
    from neptune_eqsat import flex
    doc = torch.arange(S, dtype=torch.int32) // 100
    mods = {"prefix": lambda b, h, i, j: (j < 64) | (i >= j),
            "documents": lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j)}
    q = torch.empty(1, 4, S, 128, dtype=torch.bfloat16)
    return flex.trace(None, mods[mask], flex._problem(q, q, q, None, False))[0]
