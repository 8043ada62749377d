"""ALiBi's backward with the slopes' gradient (a second output added across programs, a sum over the keys per
query row): the one pass (`optimize --backward --atomic`, now on the Gluon kernel) against the two passes
(`--backward`) and FlexAttention's backward with the slopes requiring grad, same run; every gradient of ours,
the slopes' included, checked against float64 autograd of the plain math at S = 4096.

    python -m bench.suite.backward --generate ...   (not these: the modules below, with the compiler)
    neptune-eqsat optimize specs/alibi_pf.py --backward --atomic [--dtype bf16] -o bench/generated/backward/alibi_pf_<dt>_atomic_slopes.py
    neptune-eqsat optimize specs/alibi_pf.py --backward [--dtype bf16] -o bench/generated/backward/alibi_pf_<dt>_slopes.py
    PYTHONPATH=. python bench/experiments/2026-11-27-slope-gradient-one-pass/run.py
"""
import json
import sys

import torch
import triton.testing

from bench.suite.attention import OPS, alibi_slopes, attention_math, flex_args, Case, load_module, work
from bench.suite.backward import GENERATED

op = OPS["alibi_pf"]
rows = []
for dtype in ("fp16", "bf16"):
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    mods = {name: load_module(GENERATED / f"alibi_pf_{dtype}{suffix}.py")
            for name, suffix in (("one_pass", "_atomic_slopes"), ("two_passes", "_slopes"))}
    for S in (4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, h, S, 128, device="cuda", dtype=dt, generator=g) for h in (op.hq, op.hkv, op.hkv))
        slopes = alibi_slopes(op.hq, "cuda")
        grad = torch.randn(1, op.hq, S, 128, device="cuda", dtype=dt, generator=g)
        flops = 2.5 * work(op, 1, S, S)[0]
        ref = None
        if S <= 4096:   # float64 autograd of the plain math on two heads
            r = [t[:, :2].double().requires_grad_() for t in (q, k, v)] + [slopes[:2].double().requires_grad_()]
            attention_math(op, *r).backward(grad[:, :2].double())
            ref = [t.grad for t in r]
        for name, mod in mods.items():
            out, saved = mod.forward_saved(q, k, v, slopes)
            call = lambda: mod.backward(q, k, v, slopes, out=out, grad_out=grad, saved=saved)
            got = call()
            row = {"dtype": dtype, "S": S, "system": name}
            if ref is not None:
                errs = []
                for x, want in zip(got, ref):
                    x = x[:2] if x.dim() == 1 else x[:, :2]
                    errs.append((x.double() - want).abs().max().item() / max(1.0, want.abs().max().item()))
                row["max_rel_error"] = dict(zip(("q", "k", "v", "slope"), errs))
            ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
            row.update(ms=ms, tflops=flops / ms / 1e9)
            rows.append(row)
            print(json.dumps(row), flush=True)
        try:   # FlexAttention with the slopes requiring grad
            from torch.nn.attention.flex_attention import flex_attention
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            ss = slopes.clone().requires_grad_()
            mod_, block_mask, _ = flex_args(Case(op, qq, kk, vv, ss, "cuda"))
            torch._dynamo.reset()
            compiled = torch.compile(flex_attention, dynamic=False)
            o = compiled(qq, kk, vv, score_mod=mod_, block_mask=block_mask)
            step = lambda: torch.autograd.grad(o, (qq, kk, vv, ss), grad, retain_graph=True)
            step()
            ms = triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median")
            row = {"dtype": dtype, "S": S, "system": "flex_with_slope_grad", "ms": ms, "tflops": flops / ms / 1e9}
        except Exception as e:
            row = {"dtype": dtype, "S": S, "system": "flex_with_slope_grad", "error": f"{type(e).__name__}: {str(e)[:200]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", "w"), indent=1)
