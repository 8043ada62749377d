"""Where a masked call's time goes when the mask's tensors change every call (new document ids each batch):

    python -m bench.tools.mask_breakdown [--masks document_causal,...] [--seqs 4096,16384] [--calls 50]

For each mask of bench.suite.masks, through neptune_eqsat.flex_attention:
- `gpu`: each CUDA kernel's time per call (torch.profiler), the data written before every call and the tables
  rebuilt from it, beside the same call with the data unchanged;
- `host`: wall time per call of back-to-back calls (the GPU synchronized once at the end), which is what a
  launch-bound call (decode) pays;
- `do_bench`: the median time as bench.suite.masks measures it, for both;
- `--layers`: host time per call of each layer of a neptune call (the callables' reads, the plan's lookup, the
  module's forward, run_plan, the whole flex_attention call).
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


def host_layers(q, k, v, mask_mod, score_mod, calls):
    """Host microseconds per call of each layer of neptune_eqsat.flex_attention, innermost first."""
    from neptune_eqsat import flex
    from neptune_eqsat.frontend.flex_trace import reads
    gqa = q.shape[1] != k.shape[1]
    plan = flex._plan(score_mod, mask_mod, None, gqa)
    captures = flex.captures_of(plan)
    compiled = flex._module_for(plan, q, k, v)
    inputs = [flex._as_kernel_input(c, q.device) for c in captures]
    layers = {
        "torch.empty_like(q), for the host's speed": lambda: torch.empty_like(q),
        "reads of both callables": lambda: (reads(score_mod), reads(mask_mod)),
        "_plan (reads, lookup)": lambda: flex._plan(score_mod, mask_mod, None, gqa),
        "module.forward": lambda: compiled.module.forward(q, k, v, *inputs),
        "run_plan": lambda: flex.run_plan(q, k, v, captures, plan),
        "flex_attention": lambda: flex.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod,
                                                      enable_gqa=gqa),
    }
    for name, fn in layers.items():
        print(f"      host {host_us(fn, calls):8.1f} us/call  {name}")


def main():
    import triton.testing
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masks", default="document_causal,document_causal_decode_q1,document_causal_decode_q4")
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--systems", default="neptune,neptune_new_data,flex")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--repeats", type=int, default=1, help="do_bench this many times in a row (drift after a first call)")
    ap.add_argument("--layers", action="store_true", help="host time of each layer of a neptune call")
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
            dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
            q = torch.randn(1, a.heads, decode[0] if decode else S, D, device="cuda", dtype=dtype, generator=g)
            k = torch.randn(1, hkv, S, D, device="cuda", dtype=dtype, generator=g)
            v = torch.randn_like(k)
            print(f"\n{name}  S={S}")
            for system in a.systems.split(","):
                fn = SYSTEMS[system](q, k, v, mask_mod, score_mod)
                fn()
                for _ in range(a.repeats):
                    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                    print(f"  {system:<17} do_bench {ms * 1e3:8.1f} us   host {host_us(fn, a.calls):8.1f} us/call")
                for kernel, us in kernel_times(fn, a.calls).items():
                    print(f"      {us:8.2f} us  {kernel}")
                if a.layers and system == "neptune":
                    host_layers(q, k, v, mask_mod, score_mod, a.calls)
                if a.host_profile and system.startswith("neptune"):
                    host_profile(fn, a.calls, a.host_profile)


if __name__ == "__main__":
    main()
