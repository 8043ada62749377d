"""What a decode call costs the host, where a short cache makes the launch longer than the kernel:

    python -m bench.tools.host_cost [--ops gqa_dc,causal_dc] [--kv 4096] [--modules bench/generated]
                                    [--before DIR] [--calls 2000] [--profile 12]

For each generated module (and the one of the same name in --before, for a comparison in the same process):
- `same`: back-to-back calls with the same tensors (a replay of the recorded launches every call);
- `growing`: calls on a cache that grows by one key a call (views of one preallocated cache, within the shape
  bucket of --kv), as a decode loop without CUDA graphs makes them: a new signature every call (the kernels of
  every length compiled first, the recorded replays dropped);
- `do_bench`: triton.testing.do_bench of the same call, whose timer includes the host where the host is slower
  than the GPU's flush before every call.
With --profile N, the N functions of most host time in each mode (cProfile). Imports only torch and triton.
"""
import argparse
from pathlib import Path

import torch
import triton

from bench.common import GENERATED, host_profile, host_us, load


def cache_inputs(mod, kv):
    """Random inputs for the module's INPUTS table at B = Q = 1 and SKV = kv, and a function of a length n that
    gives them with every SKV axis cut to n (views of the same tensors, as a preallocated cache is read)."""
    sizes = {"B": 1, "Q": 1, "SKV": kv}
    full = {name: torch.randn([sizes.get(d, d) for d in shape], device="cuda", dtype=getattr(torch, dtype))
            for name, (dtype, shape) in mod.INPUTS.items()}

    def at(n):
        return [t[tuple(slice(0, n) if d == "SKV" else slice(None) for d in mod.INPUTS[name][1])]
                for name, t in full.items()]
    return at


def growing_calls(mod, at, first, count):
    """A function making one call per step on a cache `first + step` keys long (cycling over `count` lengths)."""
    step = [0]

    def call():
        n = first + step[0] % count
        step[0] += 1
        return mod.forward(*at(n))
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="gqa_dc,causal_dc")
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--modules", default=str(GENERATED))
    ap.add_argument("--before", default=None, help="a folder of modules to compare with, in the same process")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", type=int, default=0)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}", flush=True)
    folders = {"after": Path(args.modules)} | ({"before": Path(args.before)} if args.before else {})
    for op in args.ops.split(","):
        first = args.kv // 2 + 1   # the lengths args.kv / 2 + 1 .. args.kv share the shape bucket of args.kv
        for name, folder in folders.items():
            mod = load(folder / f"{op}.py")
            at = cache_inputs(mod, args.kv)
            tensors = at(args.kv)
            same = lambda: mod.forward(*tensors)
            growing = growing_calls(mod, at, first, args.kv - first + 1)
            for length in range(first, args.kv + 1):   # compile every specialization, then wait for the rest
                growing()
            mod.wait_for_compiles()
            mod._REPLAYS.clear()   # every length new again: the timed calls below repeat none
            getattr(mod, "_SEEN_ONCE", {}).clear()
            ms = triton.testing.do_bench(same, warmup=25, rep=200, return_mode="median")
            print(f"{op} KV={args.kv} {name:6s} same {host_us(same, args.calls):6.1f} us/call   growing "
                  f"{host_us(growing, min(args.calls, args.kv - first - 1)):6.1f} us/call   do_bench {ms * 1e3:6.1f} us", flush=True)
            if args.profile:
                for mode, fn in (("same", same), ("growing", growing)):
                    print(f"  {mode}:")
                    host_profile(fn, 400, args.profile)


if __name__ == "__main__":
    main()
