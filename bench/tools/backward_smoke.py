"""Each kernel module of a generated backward run once, in order, timed with its compile (progress printed as it
goes): where a new kernel form stalls a compile or a launch, the last line names it.

    python -m bench.tools.backward_smoke --op causal_pf --seq 4096
"""
from __future__ import annotations

import argparse
import time

import torch

from bench.suite.attention import D, OPS, alibi_slopes
from bench.suite.backward import GENERATED, load_module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="causal_pf")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--module", default=None, help="a module other than bench/generated/backward's")
    args = p.parse_args()
    op, dt = OPS[args.op], {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    module = load_module(args.module or GENERATED / f"{args.op}_{args.dtype}.py")
    q, k, v = (torch.randn(1, h, args.seq, D, device="cuda", dtype=dt) for h in (op.hq, op.hkv, op.hkv))
    inputs = (q, k, v, alibi_slopes(op.hq, "cuda")) if op.mod == "alibi" else (q, k, v)
    run = module._run

    def timed(name, t, reads):
        print(f"{name} ...", flush=True)
        start = time.perf_counter()
        out = run(name, t, reads)
        torch.cuda.synchronize()
        print(f"{name} done in {time.perf_counter() - start:.1f} s", flush=True)
        return out
    module._run = timed
    for label, call in (("forward", lambda: module.forward(*inputs)),
                        ("forward_saved", lambda: module.forward_saved(*inputs))):
        print(f"{label} ...", flush=True)
        start = time.perf_counter()
        result = call()
        torch.cuda.synchronize()
        print(f"{label} done in {time.perf_counter() - start:.1f} s", flush=True)
    out, saved = result
    module.backward(*inputs, out=out, grad_out=torch.randn_like(out), saved=saved)
    print("backward done", flush=True)


if __name__ == "__main__":
    main()
