"""Does spreading the last wave of the one-pass gradient kernel over every multiprocessor (codegen/
gluon_split_tail.py) shorten a backward call? Times generated backward modules (`optimize --backward --atomic`)
side by side in turns under do_bench, each module also with the split off (its gradient kernel's CONFIG
WS_SPLIT 0), beside FlexAttention's backward, and prints each variant's gradient-kernel time (profiler).
Before timing, every variant's dQ, dK and dV are compared with float64 autograd on the first and the last head
(the last heads' tiles are the ones the split shares) and with the first module's.

    PYTHONPATH=. python bench/experiments/2026-11-28-split-tail/split_tail.py MODULE [MODULE ...]
                        [--seqs 4096,16384] [--dtype fp16] [--rounds 3] [--heads 32] [--no-flex]

Imports only torch and triton (and the bench helpers).
"""
import argparse

import torch
import triton.testing

from bench.common import load_module
from bench.suite.attention import OPS, attention_math

ap = argparse.ArgumentParser()
ap.add_argument("modules", nargs="+")
ap.add_argument("--seqs", default="4096,16384")
ap.add_argument("--dtype", default="fp16")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--no-flex", action="store_true")
args = ap.parse_args()
dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
D = 128


def reference(q, k, v, grad, h):
    """float64 gradients of global attention's plain math for head h."""
    ref = [t[:, h:h + 1].detach().double().requires_grad_() for t in (q, k, v)]
    attention_math(OPS["global_pf"], *ref, torch.ones(1, dtype=torch.float64)).backward(grad[:, h:h + 1].double())
    return [r.grad for r in ref]


def gradient_kernel_ms(call, calls=10):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    times = [e.device_time_total for e in prof.key_averages() if "gluon_kernel" in e.key]
    return sum(times) / calls / 1e3


print(torch.cuda.get_device_name(), args.dtype, "B=1 D=128 heads", args.heads)
for S in map(int, args.seqs.split(",")):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, args.heads, S, D, device="cuda", dtype=dt) for _ in range(3))
    grad = torch.randn_like(q)
    calls = {}
    for n, path in enumerate(args.modules):
        module = load_module(path, prefix=f"split_tail_{n}_")
        out, saved = module.forward_saved(q, k, v)
        for split in (1, 0):
            stage = None
            if split == 0:   # the same module with its gradient kernel's split off
                module = load_module(path, prefix=f"split_tail_{n}_off_")
                stage = next(iter(module.GRADIENT_KERNELS))
                if "WS_SPLIT" not in module._module(stage).CONFIG:
                    continue
                module._module(stage).CONFIG["WS_SPLIT"] = 0
            calls[f"{n}:{path.split('/')[-1]}{'' if split else ' split off'}"] = (
                lambda m=module, o=out, s=saved: m.backward(q, k, v, out=o, grad_out=grad, saved=s))
    checks = {h: reference(q, k, v, grad, h) for h in (0, args.heads - 1)} if S <= 4096 else {}
    first = None
    for name, call in calls.items():
        got = call()
        torch.cuda.synchronize()
        errs = []
        for h, want in checks.items():
            for g, w in zip(got, want):
                scale = max(1.0, w.abs().max().item())
                errs.append((g[:, h:h + 1].double() - w).abs().max().item() / scale)
        if first is None:
            first = got
        same = max((a.double() - b.double()).abs().max().item() / max(1.0, b.abs().max().item())
                   for a, b in zip(got, first))
        worst = max(errs) if errs else float("nan")
        assert not errs or worst < 3e-2, f"{name}: gradients off by {worst}"
        assert same < 3e-2, f"{name}: differs from the first module by {same}"
        print(f"S={S} {name}: max rel. error vs float64 (heads 0, {args.heads - 1}) {worst:.2e}, vs the first "
              f"module {same:.2e}")
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention
        compiled = torch.compile(flex_attention, dynamic=False)
        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        o = compiled(qr, kr, vr)
        calls["flex"] = lambda: torch.autograd.grad(o, (qr, kr, vr), grad, retain_graph=True)
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            times[name].append(triton.testing.do_bench(call, warmup=10, rep=100, return_mode="median"))
    flops = 2.5 * 4 * S * S * D * args.heads
    base = sorted(times["flex"])[args.rounds // 2] if "flex" in times else None
    for name, t in times.items():
        med = sorted(t)[len(t) // 2]
        kernel = gradient_kernel_ms(calls[name]) if name != "flex" else float("nan")
        ratio = f", {base / med:.3f}x flex" if base else ""
        print(f"S={S} {name}: {med:.4f} ms ({flops / med / 1e9:.0f} TFLOP/s{ratio}); gradient kernel "
              f"{kernel:.4f} ms; rounds {', '.join(f'{x:.4f}' for x in t)}")
