"""When does the kernel rounding dQ's fp32 sums run, against the gradient kernel adding into them? One
generated backward call's kernels on a timeline (torch profiler): each kernel's start and end relative to the
gradient kernel's start, so that a rounding kernel launched as the gradient kernel's programmatic dependent
shows starting before the gradient kernel ends; each kernel's time over 10 calls; and the median span of a
call on the GPU, from its first kernel's start to its last kernel's end (what the overlap shortens).

    PYTHONPATH=. python bench/experiments/2026-11-27-rounding-beside-last-wave/overlap.py MODULE [S] [--dtype bf16]
                        [--heads 32] [--kv-heads 32]
"""
import argparse

import torch

from bench.suite.backward import module_call, profiled

ap = argparse.ArgumentParser()
ap.add_argument("module")
ap.add_argument("S", type=int, nargs="?", default=4096)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=None)
args = ap.parse_args()
_, call = module_call(args.module, args.S, args.dtype, args.heads, args.kv_heads)
prof = profiled(call, f"{args.module} S={args.S} {args.dtype}")
kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
last = [n for n, e in enumerate(kernels) if "gluon_kernel" in e.name or "dv_dk" in e.name][-1]
t0 = kernels[last].time_range.start
print("the last call's kernels, us from the gradient kernel's start (start .. end):")
for e in kernels[max(0, last - 4):last + 3]:
    print(f"  {e.time_range.start - t0:9.1f} .. {e.time_range.end - t0:9.1f}  {e.name[:90]}")
starts = [n for n, e in enumerate(kernels) if "stat" in e.name]   # each call begins with its row statistic
spans = sorted(max(e.time_range.end for e in kernels[a:b]) - kernels[a].time_range.start
               for a, b in zip(starts, starts[1:] + [len(kernels)]))
print(f"call span on the GPU: median {spans[len(spans) // 2]:.1f} us over {len(spans)} calls (min {spans[0]:.1f})")
