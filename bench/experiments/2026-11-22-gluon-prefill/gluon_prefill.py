"""Could a lower-level kernel language close the prefill gap to cuDNN? Times a hand-written Gluon kernel of the
rolled attention loop (global prefill: no mask) beside the emitted Triton module and cuDNN, in one process on
a Hopper GPU. Gluon states what Triton's compiler decides on its own: shared-memory rings filled by the copy
engine under mbarriers, and when each asynchronous warpgroup matrix product is waited for.

    serial    each key block: scores, wait, softmax, weighted sum of V, wait
    overlap   the next block's scores are issued before this block's softmax, so the tensor cores compute
              them while the other units run the exponentials (FlashAttention-3's intra-warpgroup overlap)

Each runs with key blocks of 128 or 64 and 2-4 ring stages.

    PYTHONPATH=. python bench/experiments/2026-11-22-gluon-prefill/gluon_prefill.py
        [--seqs 1024,4096,16384] [--rounds 3]

Shapes are multiples of the block (the point is speed). Each output is compared with SDPA's math backend in
float32 before it is timed. Imports only torch and triton.
"""
import argparse
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.common import GENERATED, cudnn_attention, load

HEADS, DIM = 32, 128
LOG2E = 1.4426950408889634


@gluon.jit
def _softmax_step(qk, m_i, l_i, acc, qk_scale, o_rows: gl.constexpr):
    """Running max, rescale factor, probabilities and running sum for one block of raw scores."""
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(qk * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
    return p, m_new, l_i, acc


@gluon.jit
def _load_block(k_desc, v_desc, k_smem, v_smem, kv_bars, stage, block, kv0, n_blocks, BLOCK_N: gl.constexpr):
    """Start copying key/value block `block` into ring stage `stage`; its barrier completes when both landed
    (nothing is copied past the last block)."""
    pred = block < n_blocks
    bar = kv_bars.index(stage)
    mbarrier.expect(bar, 2 * k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [kv0 + block * BLOCK_N, 0], bar, k_smem.index(stage), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [kv0 + block * BLOCK_N, 0], bar, v_smem.index(stage), pred=pred)


@gluon.jit
def attention_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                     OVERLAP: gl.constexpr):
    num_warps: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    row0 = gl.program_id(1) * N_CTX + gl.program_id(0) * BLOCK_M   # q, k, v, o viewed as [B*H*N, D]
    kv0 = gl.program_id(1) * N_CTX
    n_blocks = N_CTX // BLOCK_N

    q_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bars.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):   # fill the ring
        _load_block(k_desc, v_desc, k_smem, v_smem, kv_bars, i, i, kv0, n_blocks, BLOCK_N)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, s_rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    zeros_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        mbarrier.wait(kv_bars.index(0), 0)
        qk = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        for j in range(n_blocks - 1):
            s = j % STAGES
            s_next = (j + 1) % STAGES
            mbarrier.wait(kv_bars.index(s_next), ((j + 1) // STAGES) & 1)
            qk_next = warpgroup_mma(q_smem, k_smem.index(s_next).permute((1, 0)), zeros_s, use_acc=False,
                                    is_async=True)
            p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale, o_rows)
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
            acc = warpgroup_mma(p16, v_smem.index(s), acc, is_async=True)
            qk, acc = warpgroup_mma_wait(num_outstanding=0, deps=(qk_next, acc))
            # stage s is free: both products that read it are done
            _load_block(k_desc, v_desc, k_smem, v_smem, kv_bars, s, j + STAGES, kv0, n_blocks, BLOCK_N)
        last = (n_blocks - 1) % STAGES
        p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale, o_rows)
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        acc = warpgroup_mma(p16, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        for j in range(n_blocks):
            s = j % STAGES
            mbarrier.wait(kv_bars.index(s), (j // STAGES) & 1)
            qk = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
            p, m_i, l_i, acc = _softmax_step(qk, m_i, l_i, acc, qk_scale, o_rows)
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
            acc = warpgroup_mma(p16, v_smem.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _load_block(k_desc, v_desc, k_smem, v_smem, kv_bars, s, j + STAGES, kv0, n_blocks, BLOCK_N)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bars.index(i))
    out = acc / gl.convert_layout(l_i, o_rows)[:, None]
    o_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, HEAD_DIM], o_desc.layout, out.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0, 0], o_smem)
    tma.store_wait(pendings=0)


def descriptors(tensors, blocks):
    """Copy-engine descriptors of [B, H, N, D] tensors viewed as [B*H*N, D], in the given blocks."""
    flat = [x.reshape(-1, x.shape[-1]) for x in tensors]
    return [TensorDescriptor(x, list(x.shape), list(x.stride()), blk,
                             gl.NVMMASharedLayout.get_default_for(blk, gl.float16)) for x, blk in zip(flat, blocks)]


def gluon_attention(q, k, v, overlap, block_m=128, block_n=128, stages=2, num_warps=8):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    descs = descriptors((q, k, v, o), ([block_m, D], [block_n, D], [block_n, D], [block_m, D]))
    grid = (N // block_m, B * H)
    attention_kernel[grid](*descs, LOG2E / math.sqrt(D), N, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=D,
                           STAGES=stages, OVERLAP=int(overlap), num_warps=num_warps)
    return o


def main() -> None:
    def variants(q, k, v):
        out = {}
        for overlap in (0, 1):
            for block_n, stages in ((128, 2), (128, 3), (64, 3), (64, 4)):
                out[f"gluon_{'overlap' if overlap else 'serial'}_n{block_n}_s{stages}"] = (
                    lambda overlap=overlap, block_n=block_n, stages=stages:
                    gluon_attention(q, k, v, overlap, block_n=block_n, stages=stages))
        return out
    compare(variants)


def compare(variants) -> None:
    """For each --seqs length: the emitted module, cuDNN and `variants(q, k, v)` (name -> call) on the same
    random global-prefill inputs, checked and timed (see time_and_print)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}")
    generated = load(GENERATED / "global_pf.py")
    for S in map(int, args.seqs.split(",")):
        q, k, v = (torch.randn(1, HEADS, S, DIM, device="cuda", dtype=torch.float16) for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        systems = {"generated": lambda: generated.forward(q, k, v), "cudnn": lambda: cudnn_attention(q, k, v),
                   **variants(q, k, v)}
        time_and_print(systems, want, 4 * HEADS * S * S * DIM, S, args.rounds)


def time_and_print(systems: dict, want, flops: float, S: int, rounds: int) -> None:
    """Check each system's output against `want` (dropping failures and wrong outputs), time the rest in turns
    for `rounds` rounds with do_bench, and print their medians, fastest first, as TF/s and against cuDNN."""
    times = {}
    for name, fn in list(systems.items()):
        try:
            err = (fn().float() - want).abs().max().item()
        except Exception as e:   # e.g. out of shared memory
            print(f"  {name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        if not err < 2e-2:
            print(f"  {name}: WRONG, max error {err}")
            continue
        times[name] = []
    for _ in range(rounds):
        for name in times:
            times[name].append(triton.testing.do_bench(systems[name], warmup=25, rep=100, return_mode="median"))
    median = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    cudnn = median.get("cudnn", math.nan)
    for name, ms in sorted(median.items(), key=lambda kv: kv[1]):
        print(f"global_pf S={S:6d} {name:22s} {ms * 1e3:8.1f} us {flops / ms / 1e9:6.1f} TF/s "
              f"{cudnn / ms:5.2f}x cuDNN", flush=True)

if __name__ == "__main__":
    main()
