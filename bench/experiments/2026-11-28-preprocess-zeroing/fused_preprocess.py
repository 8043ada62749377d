"""Before attention's one-pass backward, two fixed costs run over memory: D = sum_e dO * O (a row stage reading
two [B, H, S, 128] tensors) and the zeroed fp32 buffer dQ is added into (a memset of one such tensor in fp32).
Does one kernel doing both (each program zeroes the dQ rows whose D it computes, as FlashAttention-3's
preprocess does) take less than the two? Variants, each timed from a CUDA graph (the GPU's time alone):

    d_alone        the row stage alone (pointer loads, BLOCK rows a program)
    zeros_alone    torch.zero_ of the fp32 buffer (a memset)
    d_then_zeros   both, one after the other (what a call runs now)
    fused          one kernel: D, and zeros stored over the same rows of the buffer

    PYTHONPATH=. python bench/experiments/2026-11-28-preprocess-zeroing/fused_preprocess.py [--seqs 4096,16384]

Checks D against float64 and the buffer all zeros first. Imports only torch and triton.
"""
import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def row_stage(do_ptr, o_ptr, d_ptr, dq_ptr, rows, BLOCK: tl.constexpr, E: tl.constexpr, ZERO: tl.constexpr):
    offs_r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_e = tl.arange(0, E)
    keep = offs_r < rows
    at = offs_r[:, None] * E + offs_e[None, :]
    do = tl.load(do_ptr + at, mask=keep[:, None], other=0.0, eviction_policy="evict_first")
    o = tl.load(o_ptr + at, mask=keep[:, None], other=0.0, eviction_policy="evict_first")
    if ZERO:
        tl.store(dq_ptr + at, tl.zeros([BLOCK, E], tl.float32), mask=keep[:, None])
    tl.store(d_ptr + offs_r, -tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1), mask=keep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--heads", type=int, default=32)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "bf16, B = 1, D = 128; us per call from a CUDA graph (median)")
    for S in map(int, args.seqs.split(",")):
        shape = (1, args.heads, S, 128)
        do, o = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        d = torch.empty(shape[:3], device="cuda", dtype=torch.float32)
        dq = torch.empty(shape, device="cuda", dtype=torch.float32)
        rows = d.numel()

        def stage(block, warps, zero):
            grid = (triton.cdiv(rows, block),)
            return lambda: row_stage[grid](do, o, d, dq, rows, BLOCK=block, E=128, ZERO=zero, num_warps=warps)
        dq.fill_(1.0)
        stage(64, 8, True)()
        expect = -(do.double() * o.double()).sum(-1)
        assert (d.double() - expect).abs().max().item() < 1e-3 * expect.abs().max().item()
        assert not dq.any()
        for block, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
            times = {}
            d_alone = stage(block, warps, False)
            fused = stage(block, warps, True)
            for name, fn in (("d_alone", d_alone), ("zeros_alone", dq.zero_),
                             ("d_then_zeros", lambda: (dq.zero_(), d_alone())), ("fused", fused)):
                times[name] = triton.testing.do_bench_cudagraph(fn, rep=200) * 1e3
            print(f"S={S} BLOCK={block} warps={warps}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()),
                  flush=True)


if __name__ == "__main__":
    main()
