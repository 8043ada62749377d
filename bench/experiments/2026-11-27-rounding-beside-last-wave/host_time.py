"""Host and GPU time of a generated backward call, module against module: the median wall time of a call
(synchronized), the host time to issue it (not synchronized), and the kernels one call runs (profiler), after
the background compiles are done.

    PYTHONPATH=. python bench/experiments/2026-11-27-rounding-beside-last-wave/host_time.py MODULE [MODULE ...]
                        [--S 1000] [--dtype bf16] [--heads 32] [--kv-heads 16]
"""
import argparse
import statistics
import time

import torch

from bench.suite.backward import module_call

ap = argparse.ArgumentParser()
ap.add_argument("modules", nargs="+")
ap.add_argument("--S", type=int, default=1000)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=16)
args = ap.parse_args()
print(torch.cuda.get_device_name(), f"S={args.S}", args.dtype)
for path in args.modules:
    module, call = module_call(path, args.S, args.dtype, args.heads, args.kv_heads, warm=20)
    for kernels_module in module._MODULES.values():   # the background compiles of every kernel module
        kernels_module.wait_for_compiles()
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    wall, host = [], []
    for _ in range(30):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = [(e.key, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0]
    print(f"{path}: wall {statistics.median(wall) * 1e3:.3f} ms, host {statistics.median(host) * 1e3:.3f} ms, "
          f"kernels {sum(t for _, t in kernels) / 1e3:.3f} ms")
    for name, t in sorted(kernels, key=lambda x: -x[1]):
        print(f"    {t:9.1f} us  {name[:80]}")
