"""What the tests' checks on a Hopper GPU (NEPTUNE_TEST_DEVICE=cuda) share, importable without the compiler and
without the interpreter conftest.py sets up, so that a GPU machine without egglog runs them from a filled kernel
cache (bench/experiments/2026-11-28-split-tail/hopper_check.py): the check of a one-pass backward against
float64, and the specs it runs on."""
import math

import torch

from neptune_eqsat.spec import Spec, cast, exp, sqrt, sum, tanh, where
from neptune_eqsat.spec import max as smax


def attention_spec(*, heads=2, kv_heads=1, dim=16, causal=True, slope=False, softcap=None, empty_row=None,
                   dtype="f16") -> Spec:
    """A small attention spec with the options the ten operators use (GQA, ALiBi slope, soft-cap, masks)."""
    spec = Spec("attn_small")
    B, S = spec.dims(B=1, S=64)
    b, h, i, j, d, e = spec.axes(b=B, h=heads, i=S, j=S, d=dim, e=dim)
    q = spec.input("q", dtype, B, heads, S, dim)
    k = spec.input("k", dtype, B, kv_heads, S, dim)
    v = spec.input("v", dtype, B, kv_heads, S, dim)
    hk = h // (heads // kv_heads)
    s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(dim)
    if slope:
        s = s + spec.input("slope", "f32", heads)[h] * (j - i)
    if softcap:
        s = softcap * tanh(s / softcap)
    keep = None
    if causal:
        keep = i >= j
    if empty_row is not None:
        keep = (i != empty_row) if keep is None else keep & (i != empty_row)
    if keep is not None:
        s = where(keep, s, -math.inf)
    m = smax(j, s)
    p = exp(s - where(m == -math.inf, 0, m))
    l = sum(j, p)
    o = sum(j, cast(p, dtype) * v[b, hk, j, e]) / where(l == 0, 1, l)
    spec.output("o", dtype, o, b, h, i, e)
    spec.validate()
    return spec


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
