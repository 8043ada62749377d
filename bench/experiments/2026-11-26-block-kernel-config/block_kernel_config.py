"""The classifying kernel of masks that read tensors (codegen/block_kernel.py): its time per call against its
warps and the keys a program summarizes at once, for the document masks of bench.suite.masks, each variant
compiled in a process of its own (fresh module cache):

    python bench/experiments/2026-11-26-block-kernel-config/block_kernel_config.py [--variants 4:2048,8:4096]

Prints the builder kernel's time per call (torch.profiler) and the masked call's do_bench time with the mask's
tensors written before every call, each output checked against float64 first.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CASES = [("document_causal", 4096), ("document_causal", 16384), ("document_causal_decode_q1", 16384)]


def one(warps: int, chunk: int) -> None:
    sys.path.insert(0, str(ROOT))
    import torch
    import triton.testing
    from neptune_eqsat.codegen import block_kernel
    block_kernel.WARPS, block_kernel.KB_CHUNK_ELEMENTS = warps, chunk
    from bench.suite.masks import D, SYSTEMS, check, masks
    from bench.tools.mask_breakdown import kernel_times
    for name, S in CASES:
        mask_mod, score_mod, hkv, *decode = masks(S, "cuda")[name]
        g = torch.Generator(device="cuda").manual_seed(S)
        q = torch.randn(1, 32, decode[0] if decode else S, D, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(1, hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn_like(k)
        fn = SYSTEMS["neptune_new_data"](q, k, v, mask_mod, score_mod)
        err, ok = check(fn(), q, k, v, mask_mod, score_mod)
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        builder = sum(us for n, us in kernel_times(fn, 50).items() if "_blocks" in n)
        print(f"warps={warps:<2} keys={chunk:<5} {name:<26} S={S:<6} builder {builder:6.2f} us  "
              f"call {ms * 1e3:8.1f} us  ok={ok} err={err:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="4:2048,8:2048,8:4096,4:1024,16:4096")
    ap.add_argument("--one", default="")
    a = ap.parse_args()
    if a.one:
        one(*map(int, a.one.split(":")))
        return
    for v in a.variants.split(","):
        env = dict(os.environ, NEPTUNE_EQSAT_CACHE=tempfile.mkdtemp(), NEPTUNE_EQSAT_COMPILE_AHEAD="0")
        subprocess.run([sys.executable, __file__, "--one", v], env=env, cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
