"""Tunables of the listed-mask kernels (bench.suite.masks's masks): each config against the module's default.

    PYTHONPATH=. python bench/experiments/2026-11-24-mask-configs/mask_configs.py
        [--seqs 4096,16384] [--masks NAME,...] [--out DIR]

Runs each mask once through neptune_eqsat.flex_attention, then times the generated module's forward with each
config of CONFIGS on the same inputs (the block lists of a config's block sizes are built on its first call and
kept), checking every output against the default's. Needs a GPU and the compiler. Writes mask_configs.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from bench.suite import masks as bench_masks

CONFIGS = [
    {},
    {"EVEN_J": 0},
    {"ROW_ORDER": 0}, {"ROW_ORDER": 2},
    {"num_warps": 4}, {"num_stages": 2}, {"num_stages": 4},
    {"BLOCK_J": 64}, {"BLOCK_J": 64, "num_warps": 4},
    {"BLOCK_I": 64, "num_warps": 4},
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--masks", default="document_causal,prefix_lm,dilated_window,neighborhood_2d,global_tokens")
    ap.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    a = ap.parse_args()
    import triton.testing
    from neptune_eqsat import flex, flex_attention
    rows = []
    for S in map(int, a.seqs.split(",")):
        table = bench_masks.masks(S, "cuda")
        for name in a.masks.split(","):
            mask_mod, score_mod, hkv = table[name][:3]
            g = torch.Generator(device="cuda").manual_seed(S)
            q = torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g)
            k, v = (torch.randn(1, hkv, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
            want = flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
            plan = flex._plan(score_mod, mask_mod, None, False)
            module = flex._module_for(plan, q, k, v).module
            captures = [flex._as_kernel_input(c, q.device) for c in flex._CAPTURES[plan]]
            for cfg in CONFIGS:
                fn = lambda: module.forward(q, k, v, *captures, config=cfg)   # noqa: E731
                try:
                    err = (fn().float() - want.float()).abs().max().item()
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    rows.append({"mask": name, "S": S, "config": cfg, "ms": ms, "diff": err,
                                 "gpu": torch.cuda.get_device_name()})
                    print(f"{name:<20} S={S:<6} {json.dumps(cfg):<40} {ms:.3f} ms  diff {err:.1e}", flush=True)
                except Exception as e:   # a config that does not fit: reported
                    print(f"{name:<20} S={S:<6} {json.dumps(cfg):<40} {type(e).__name__}: {str(e)[:80]}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "mask_configs.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
