"""Where a masked call's time goes when the mask's tensors change every call (new document ids each batch):

    python -m bench.tools.mask_breakdown [--masks document_causal,...] [--seqs 4096,16384] [--calls 50]

For each mask of bench.suite.masks, through neptune_eqsat.flex_attention:
- `gpu`: each CUDA kernel's time per call (torch.profiler), the data written before every call and the tables
  rebuilt from it, beside the same call with the data unchanged;
- `host`: wall time per call of back-to-back calls (the GPU synchronized once at the end), which is what a
  launch-bound call (decode) pays;
- `do_bench`: the median time as bench.suite.masks measures it, for both.
Needs a CUDA GPU and the compiler (egglog).
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from bench import common
from bench.common import host_profile, host_us
from bench.suite.masks import D, SYSTEMS, masks

common.import_package()


def kernel_times(fn, calls):
    """{kernel name: microseconds per call} over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name[:60]] += e.device_time / calls
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def main():
    import triton.testing
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masks", default="document_causal,document_causal_decode_q1,document_causal_decode_q4")
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--systems", default="neptune,neptune_new_data,flex")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--host-profile", type=int, default=0, help="also print the N functions of most host time")
    a = ap.parse_args()
    torch._dynamo.config.recompile_limit = 1 << 16   # one FlexAttention compile per mask and shape
    torch._dynamo.config.accumulated_recompile_limit = 1 << 16
    print(f"GPU: {common.gpu_name()}")
    for S in map(int, a.seqs.split(",")):
        table = masks(S, "cuda")
        for name in a.masks.split(","):
            mask_mod, score_mod, hkv, *decode = table[name]
            g = torch.Generator(device="cuda").manual_seed(S)
            q = torch.randn(1, a.heads, decode[0] if decode else S, D, device="cuda", dtype=torch.float16, generator=g)
            k = torch.randn(1, hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
            v = torch.randn_like(k)
            print(f"\n{name}  S={S}")
            for system in a.systems.split(","):
                fn = SYSTEMS[system](q, k, v, mask_mod, score_mod)
                fn()
                ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                print(f"  {system:<17} do_bench {ms * 1e3:8.1f} us   host {host_us(fn, a.calls):8.1f} us/call")
                for kernel, us in kernel_times(fn, a.calls).items():
                    print(f"      {us:8.2f} us  {kernel}")
                if a.host_profile and system.startswith("neptune"):
                    host_profile(fn, a.calls, a.host_profile)


if __name__ == "__main__":
    main()
