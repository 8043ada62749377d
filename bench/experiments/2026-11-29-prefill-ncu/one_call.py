"""One prefill call of a system, bracketed for a profiler (`ncu --profile-from-start off`): warm-up calls first
(compiles, autotuning), then the profiled call between cudaProfilerStart and cudaProfilerStop.

    PYTHONPATH=. python bench/experiments/2026-11-29-prefill-ncu/one_call.py --system neptune --op global_pf
        --seq 4096 --modules DIR
"""
import argparse
import dataclasses
import types

import torch

from bench.suite import attention
from bench.suite.attention_systems import Case, neptune


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="neptune")
    ap.add_argument("--op", default="global_pf")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--modules", default="bench/generated/now")
    args = ap.parse_args()
    op = attention.OPS[args.op]
    q, k, v = (torch.randn(1, h, args.seq, attention.D, device="cuda", dtype=torch.float16)
               for h in (op.hq, op.hkv, op.hkv))
    case = Case(op, q, k, v, attention.alibi_slopes(op.hq, "cuda"), "cuda")
    if args.system == "neptune":
        module = attention.load_module(f"{args.modules}/{args.op}.py")
        call = neptune(dataclasses.replace(case, module=types.SimpleNamespace(forward=module.forward)))
    else:
        call = attention.BUILDERS[args.system](case)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(torch.cuda.get_device_name(), args.system, args.op, args.seq, "profiled")


if __name__ == "__main__":
    main()
