"""The GPU time of each kernel of one generated backward call (torch profiler), to see what the fixed costs
around the gradient kernel weigh: the stage computing D = sum dO * O, the zeroed fp32 buffer that dQ is added
into, and dQ's cast to the inputs' type.

    PYTHONPATH=. python bench/experiments/2026-11-27-one-warp-producer/backward_kernels.py MODULE [S] [--dtype bf16]
"""
import argparse

from bench.suite.backward import module_call, profiled

ap = argparse.ArgumentParser()
ap.add_argument("module")
ap.add_argument("S", type=int, nargs="?", default=4096)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--heads", type=int, default=32)
args = ap.parse_args()
_, call = module_call(args.module, args.S, args.dtype, args.heads)
profiled(call, f"{args.module} S={args.S} {args.dtype}")
