"""Experiment: why does the atomic backward (dQ added by the dK/dV kernel, `optimize --backward --atomic`: five
matrix products instead of seven) run slower than the default two passes? Text edits of its generated gradient
kernel (bench/generated/backward/global_pf_fp16_atomic.py), each run through the module's own backward():

    as_is       the generated kernel: dQ's share is tl.dot(trans(dS^T), K) with dS^T masked to the valid keys,
                added through the copy engine's bulk reduce
    no_mask     without the mask of the valid keys (K is zero past the end, so those rows add 0)
    k_first     dQ^T = K^T dS^T: no transpose of dS^T in registers; added by pointer atomics in that layout
    both        no_mask and k_first
    pointers    as_is, added by pointer atomics instead of the bulk reduce

Every variant's gradients are compared with the default (two-pass) backward's.

    python bench/experiments/2026-11-27-key-block-gradients/atomic_dq_forms.py [--seqs 4096,16384]
"""
import argparse
import re
import sys
import types
import linecache
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
KERNEL = "global_pf_dv_dk_dq0"

MASKED_PRODUCT = re.compile(r"(\w+) = tl\.trans\((\w+)\)\n(\s+)(\w+) = tl\.where\(valid_j\[None, :\], \1, 0\.0\)\n"
                            r"\s+(\w+) = tl\.dot\(\4, (\w+)\)")
POINTER_ADD = re.compile(r"offs_i\[:, None\] \* out2_s2 \+ offs_d\[None, :\] \* out2_s3, (\w+)"
                         r"(, mask=valid_i\[:, None\])?, sem='relaxed'")


def edit(src: str, variant: str) -> str:
    def product(m):
        ds, indent, k = m[2], m[3], m[6]
        if variant == "no_mask":
            return f"{m[1]} = tl.trans({ds})\n{indent}{m[5]} = tl.dot({m[1]}, {k})"
        if variant == "k_first":
            return f"{m[4]} = tl.where(valid_j[:, None], {ds}, 0.0)\n{indent}{m[5]} = tl.dot(tl.trans({k}), {m[4]})"
        return f"{m[5]} = tl.dot(tl.trans({k}), {ds})"   # both
    if variant in ("no_mask", "k_first", "both"):
        src = MASKED_PRODUCT.sub(product, src)
    if variant in ("k_first", "both"):
        src = POINTER_ADD.sub(lambda m: f"offs_i[None, :] * out2_s2 + offs_d[:, None] * out2_s3, {m[1]}"
                              + (", mask=valid_i[None, :]" if m[2] else "") + ", sem='relaxed'", src)
    if variant in ("k_first", "both", "pointers"):
        src = src.replace("'TMA_REDUCE': 1", "'TMA_REDUCE': 0")
    return src


def module_of(name: str, src: str):
    file = f"<experiment {name}>"
    linecache.cache[file] = (len(src), None, src.splitlines(True), file)
    mod = types.ModuleType(name)
    mod.__file__ = file
    exec(compile(src, file, "exec"), mod.__dict__)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--variants", default="as_is,no_mask,k_first,both,pointers")
    args = ap.parse_args()
    from bench.common import load_module
    default = load_module(ROOT / "bench/generated/backward/global_pf_fp16.py")
    atomic = load_module(ROOT / "bench/generated/backward/global_pf_fp16_atomic.py", prefix="atomic_")
    source = atomic._SOURCES[KERNEL]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for S in map(int, args.seqs.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, d_o = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
        flops = 2.5 * 4 * S * S * 128 * 32
        out, saved = default.forward_saved(q, k, v)
        want = default.backward(q, k, v, out=out, grad_out=d_o, saved=saved)
        t = triton.testing.do_bench(lambda: default.backward(q, k, v, out=out, grad_out=d_o, saved=saved),
                                    return_mode="median")
        print(f"S={S}: default (two passes) {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s)", flush=True)
        a_out, a_saved = atomic.forward_saved(q, k, v)
        for variant in args.variants.split(","):
            try:
                atomic._MODULES[KERNEL] = module_of(f"{KERNEL}_{variant}", edit(source, variant))
                got = atomic.backward(q, k, v, out=a_out, grad_out=d_o, saved=a_saved)
                err = max(((x.float() - y.float()).abs().max() / y.float().abs().max().clamp(min=1)).item()
                          for x, y in zip(got, want))
                t = triton.testing.do_bench(lambda: atomic.backward(q, k, v, out=a_out, grad_out=d_o, saved=a_saved),
                                            return_mode="median")
                print(f"  atomic {variant}: max rel diff vs default {err:.2e}, {t:.3f} ms "
                      f"({flops / t / 1e9:.0f} TFLOP/s)", flush=True)
            except Exception as e:   # noqa: BLE001 - a variant that fails is a line saying so
                print(f"  atomic {variant}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
