"""A data-dependent mask whose blocks are mostly partial: 16 global positions flagged by a captured tensor, plus a
causal window of 256, at S = 4096, fp16, 32 heads, D = 128, through neptune_eqsat.flex_attention with the flags
stored as bool, int32 and float32, against FlexAttention with its block mask prebuilt:

    python bench/experiments/2026-11-26-per-call-classification/flags.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from bench import common  # noqa: E402
from bench.suite.masks import check, flex_call, neptune_call  # noqa: E402


def main():
    print(f"GPU: {common.gpu_name()}")
    S = 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    where = torch.randperm(S, device="cuda", generator=g)[:16]
    for label, dtype in [("bool", torch.bool), ("int32", torch.int32), ("float32", torch.float32)]:
        flags = torch.zeros(S, dtype=dtype, device="cuda")
        flags[where] = 1

        def mask_mod(b, h, i, j, flags=flags):
            return (flags[i] != 0) | (flags[j] != 0) | (i >= j) & (i - j < 256)
        for system, make in [("neptune", neptune_call), ("flex", flex_call)]:
            fn = make(q, k, v, mask_mod, None)
            err, ok = check(fn(), q, k, v, mask_mod, None)
            ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"flags {label:<8} {system:<8} {ms * 1e3:8.1f} us  ok={ok} err={err:.1e}", flush=True)


if __name__ == "__main__":
    main()
