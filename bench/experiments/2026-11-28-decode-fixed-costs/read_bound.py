"""How fast can any kernel read a grouped-query decode call's K and V (KV = 4k: 16 MB; 32k: 134 MB), timed
the way the suite times decode (bench.suite.attention.cuda_timer: an L2 flush before each call, events), next
to a copy moving the same bytes? This bounds what a decode kernel can reach against the copy.

    python bench/experiments/2026-11-28-decode-fixed-costs/read_bound.py [--kv 4096,32768]

A read kernel: P programs, each summing a contiguous slab of K and V (one value a program, so nothing is
written), BLOCK elements a load; the best of a sweep over P, BLOCK and warps is printed next to the copy.
"""
import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def read_slabs(k_ptr, v_ptr, out_ptr, n, slab, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * slab, tl.minimum(pid * slab + slab, n), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(k_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += tl.load(v_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def main():
    from bench.suite import attention
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="4096,32768")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    timer = attention.cuda_timer(50, 300)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for kv in map(int, args.kv.split(",")):
        k, v = (torch.randn(8 * kv * 128, device="cuda", dtype=torch.float16) for _ in range(2))
        n = k.numel()
        nbytes = 4 * n
        src = torch.empty(n, device="cuda", dtype=torch.float16).normal_()
        dst = torch.empty_like(src)
        copy = min(timer(lambda: dst.copy_(src)) for _ in range(3))
        print(f"KV={kv} copy of the same bytes {copy * 1e3:6.1f} us {nbytes / copy / 1e6:6.0f} GB/s", flush=True)
        results = []
        for programs in (sms, 2 * sms, 4 * sms, 8 * sms, 16 * sms):
            for block in (1024, 4096, 8192):
                for warps in (4, 8):
                    slab = -(-n // programs // block) * block
                    out = torch.empty(programs, device="cuda", dtype=torch.float32)

                    def call():
                        read_slabs[(programs,)](k, v, out, n, slab, BLOCK=block, num_warps=warps)
                    call()
                    expected = k.float().sum() + v.float().sum()
                    assert torch.allclose(out.sum(), expected, rtol=1e-3, atol=1.0), (out.sum(), expected)
                    ms = min(timer(call) for _ in range(2))
                    results.append((ms, programs, block, warps))
        results.sort()
        for ms, programs, block, warps in results[:5]:
            print(f"KV={kv} read P={programs:5d} BLOCK={block:5d} warps={warps} {ms * 1e3:6.1f} us "
                  f"{nbytes / ms / 1e6:6.0f} GB/s  copy / this {copy / ms:6.1%}", flush=True)


if __name__ == "__main__":
    main()
