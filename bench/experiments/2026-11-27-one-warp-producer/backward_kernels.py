"""The GPU time of each kernel of one generated backward call (torch profiler), to see what the fixed costs
around the gradient kernel weigh: the stage computing D = sum dO * O, the zeroed fp32 buffer that dQ is added
into, and dQ's cast to the inputs' type.

    PYTHONPATH=. python bench/experiments/2026-11-27-one-warp-producer/backward_kernels.py MODULE [S] [--dtype bf16]
"""
import argparse

import torch

from bench.suite.backward import load_module

ap = argparse.ArgumentParser()
ap.add_argument("module")
ap.add_argument("S", type=int, nargs="?", default=4096)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--heads", type=int, default=32)
args = ap.parse_args()
dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
module = load_module(args.module)
q, k, v = (torch.randn(1, args.heads, args.S, 128, device="cuda", dtype=dt) for _ in range(3))
out, saved = module.forward_saved(q, k, v)
grad = torch.randn_like(out)
for _ in range(5):
    module.backward(q, k, v, out=out, grad_out=grad, saved=saved)
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        module.backward(q, k, v, out=out, grad_out=grad, saved=saved)
    torch.cuda.synchronize()
print(torch.cuda.get_device_name(), args.module, f"S={args.S}", args.dtype)
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
