"""Experiment: the key-block gradients (dK, dV) of global attention as a warp-specialized Gluon kernel, against
the generated Triton kernel of the same pass (bench/generated/backward/global_pf_fp16.py, `global_pf_dv_dk0`).

Written by hand to measure the schedule before the generator emits it: a producer warpgroup copies a key
block's K and V once and the query blocks' Q and dO into a ring of stages; two consumer warpgroups, 64 keys
each, compute per query block S^T = K Q^T and dP^T = V dO^T, the per-element work of the generated kernel
(P^T from the saved row max and row sum, dS^T from the row statistic `stat2`), and accumulate dV += P^T dO and
dK += dS^T Q in registers. A consumer's next S^T / dP^T are issued while its last dV / dK products run.

    python bench/experiments/2026-11-27-gluon-backward/dkdv_gluon.py [--seqs 4096,16384] [--stages 2]

Run against the backward modules generated before `plan/staging.py` (their forward saves the row max and row
sum, and `stat2` is -D / l); the modules generated since read the logsumexp and -D instead.
"""
import argparse
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

ROWS = gl.constexpr(64)   # keys per consumer warpgroup


@gluon.jit
def dkdv_producer(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H,
                  k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                  BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr):
    pid = gl.program_id(0)
    n_jb = gl.cdiv(S, BLOCK_J)
    jb = pid % n_jb
    bh = pid // n_jb
    b = bh // H
    h = bh % H
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, h, jb * BLOCK_J, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, h, jb * BLOCK_J, 0], kv_bar, v_smem)
    for it in range(gl.cdiv(S, BLOCK_I)):
        stage = it % STAGES
        mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, it * BLOCK_I, 0], ready.index(stage), q_smem.index(stage))
        tma.async_copy_global_to_shared(do_desc, [b, h, it * BLOCK_I, 0], ready.index(stage), do_smem.index(stage))


@gluon.jit
def dkdv_consumer(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H,
                  k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                  BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                  ME: gl.constexpr):
    D: gl.constexpr = 128
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_I, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    pid = gl.program_id(0)
    n_jb = gl.cdiv(S, BLOCK_J)
    jb = pid % n_jb
    bh = pid // n_jb
    b = bh // H
    h = bh % H
    row0 = bh * S   # the saved row vectors are [B, H, S], contiguous
    k_tile = k_smem.reshape([BLOCK_J, D]).slice(ME * ROWS, ROWS)
    v_tile = v_smem.reshape([BLOCK_J, D]).slice(ME * ROWS, ROWS)
    dk = gl.zeros([ROWS, D], gl.float32, O_LAYOUT)
    dv = gl.zeros([ROWS, D], gl.float32, O_LAYOUT)
    zeros_s = gl.zeros([ROWS, BLOCK_I], gl.float32, S_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    if OVERLAP:
        # the last block's dV / dK products run while this block's per-element work is computed: P^T and dS^T
        # of the block before, and its stage of Q and dO, are carried into the next step (the first adds zeros)
        pn = gl.zeros([ROWS, BLOCK_I], gl.float16, P_LAYOUT)
        ds = gl.zeros([ROWS, BLOCK_I], gl.float16, P_LAYOUT)
        prev_stage = 0
        for it in range(gl.cdiv(S, BLOCK_I)):
            stage = it % STAGES
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            q_t = q_smem.index(stage).reshape([BLOCK_I, D])
            do_t = do_smem.index(stage).reshape([BLOCK_I, D])
            st = warpgroup_mma(k_tile, q_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_tile, do_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dv = warpgroup_mma(pn, do_smem.index(prev_stage).reshape([BLOCK_I, D]), dv, is_async=True)
            dk = warpgroup_mma(ds, q_smem.index(prev_stage).reshape([BLOCK_I, D]), dk, is_async=True)
            offs_i = it * BLOCK_I + gl.arange(0, BLOCK_I, layout=S_COLS)
            valid_i = offs_i < S
            m = gl.load(m_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            inv_l = 1.0 / gl.load(l_ptr + row0 + offs_i, mask=valid_i, other=1.0)
            st2 = gl.load(st_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            st = warpgroup_mma_wait(num_outstanding=3, deps=(st,))
            p16 = gl.exp2(st * 0.12751743082459868 - (m * 1.4426950408889634)[None, :]).to(gl.float16)
            pn_new = gl.where(valid_i[None, :], (p16.to(gl.float32) * inv_l[None, :]).to(gl.float16), 0.0)
            dpt = warpgroup_mma_wait(num_outstanding=2, deps=(dpt,))
            ds_new = (st2[None, :] + dpt * inv_l[None, :]).to(gl.float16).to(gl.float32) * p16.to(gl.float32)
            ds_new = gl.where(valid_i[None, :], ds_new.to(gl.float16), 0.0)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            mbarrier.arrive(empty.index(prev_stage), count=1, pred=it > 0)
            pn = gl.convert_layout(pn_new, P_LAYOUT)
            ds = gl.convert_layout(ds_new, P_LAYOUT)
            prev_stage = stage
        dv = warpgroup_mma(pn, do_smem.index(prev_stage).reshape([BLOCK_I, D]), dv, is_async=True)
        dk = warpgroup_mma(ds, q_smem.index(prev_stage).reshape([BLOCK_I, D]), dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    else:   # each block's products in turn; the other consumer's fill the tensor cores meanwhile
        for it in range(gl.cdiv(S, BLOCK_I)):
            stage = it % STAGES
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            q_t = q_smem.index(stage).reshape([BLOCK_I, D])
            do_t = do_smem.index(stage).reshape([BLOCK_I, D])
            st = warpgroup_mma(k_tile, q_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_tile, do_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            offs_i = it * BLOCK_I + gl.arange(0, BLOCK_I, layout=S_COLS)
            valid_i = offs_i < S
            m = gl.load(m_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            inv_l = 1.0 / gl.load(l_ptr + row0 + offs_i, mask=valid_i, other=1.0)
            st2 = gl.load(st_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
            p16 = gl.exp2(st * 0.12751743082459868 - (m * 1.4426950408889634)[None, :]).to(gl.float16)
            pn = gl.where(valid_i[None, :], (p16.to(gl.float32) * inv_l[None, :]).to(gl.float16), 0.0)
            dv = warpgroup_mma(gl.convert_layout(pn, P_LAYOUT), do_t, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
            ds = (st2[None, :] + dpt * inv_l[None, :]).to(gl.float16).to(gl.float32) * p16.to(gl.float32)
            ds = gl.where(valid_i[None, :], ds.to(gl.float16), 0.0)
            dk = warpgroup_mma(gl.convert_layout(ds, P_LAYOUT), q_t, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            mbarrier.arrive(empty.index(stage), count=1)
    # the gradients leave through this consumer's rows of K and V, which no product reads any more
    k_tile.store((dk * 0.08838834764831843).to(gl.float16))
    v_tile.store(dv.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, h, jb * BLOCK_J + ME * ROWS, 0], k_smem.slice(ME * ROWS, ROWS, dim=2))
    tma.async_copy_shared_to_global(dv_desc, [b, h, jb * BLOCK_J + ME * ROWS, 0], v_smem.slice(ME * ROWS, ROWS, dim=2))
    tma.store_wait(pendings=0)


@gluon.jit
def dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H,
                BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    k_smem = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_J, 128], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_J, 128], v_desc.layout)
    q_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_I, 128], q_desc.layout)
    do_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_I, 128], do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)   # both consumers release a stage
    fence_async_shared()
    gl.warp_specialize([
        (dkdv_producer, (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H, k_smem, v_smem,
                         q_smem, do_smem, kv_bar, ready, empty, BLOCK_J, BLOCK_I, STAGES)),
        (dkdv_consumer, (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H, k_smem, v_smem,
                         q_smem, do_smem, kv_bar, ready, empty, BLOCK_J, BLOCK_I, STAGES, OVERLAP, gl.constexpr(0))),
        (dkdv_consumer, (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, m_ptr, l_ptr, st_ptr, S, H, k_smem, v_smem,
                         q_smem, do_smem, kv_bar, ready, empty, BLOCK_J, BLOCK_I, STAGES, OVERLAP, gl.constexpr(1))),
    ], [4, 4], [240, 240])


def descriptor(x, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def gluon_dkdv(q, k, v, d_o, m, l, st, block_i=64, stages=2, overlap=0):
    B, H, S, D = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    BLOCK_J = 2 * ROWS.value
    descs = [descriptor(x, [1, 1, block_i, D]) for x in (q, d_o)]
    descs += [descriptor(x, [1, 1, BLOCK_J, D]) for x in (k, v)]
    descs += [descriptor(x, [1, 1, ROWS.value, D]) for x in (dk, dv)]
    grid = (triton.cdiv(S, BLOCK_J) * B * H,)
    dkdv_kernel[grid](*descs, m, l, st, S, H, BLOCK_J=BLOCK_J, BLOCK_I=block_i, STAGES=stages, OVERLAP=overlap,
                      num_warps=4, maxnreg=168)
    return dk, dv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1000,4096,16384")
    ap.add_argument("--variants", default="0,64,2;0,32,2;0,32,3;1,32,2;1,64,2",
                    help="overlap,BLOCK_I,stages of each Gluon variant, ';'-separated")
    args = ap.parse_args()
    from bench.common import load_module
    mod = load_module(ROOT / "bench/generated/backward/global_pf_fp16.py")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for S in map(int, args.seqs.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, d_o = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
        out, (m, l) = mod.forward_saved(q, k, v)
        st = mod._module("stat2").forward(d_o, out, l)
        st = st[0] if isinstance(st, tuple) else st
        dkdv_triton = mod._module("global_pf_dv_dk0")
        want_dv, want_dk = dkdv_triton.forward(q, k, v, d_o, m, l, st)
        flops = 4 * 2 * S * S * 128 * 32   # the four products of the pass
        t_tri = triton.testing.do_bench(lambda: dkdv_triton.forward(q, k, v, d_o, m, l, st), return_mode="median")
        t_all = triton.testing.do_bench(lambda: mod.backward(q, k, v, out=out, grad_out=d_o, saved=(m, l)),
                                        return_mode="median")
        print(f"S={S}: whole backward {t_all:.3f} ms; Triton dK/dV pass {t_tri:.3f} ms "
              f"({flops / t_tri / 1e9:.0f} TFLOP/s)", flush=True)
        for variant in args.variants.split(";"):
            overlap, block_i, stages = map(int, variant.split(","))
            try:
                dk, dv = gluon_dkdv(q, k, v, d_o, m, l, st, block_i, stages, overlap)
                torch.cuda.synchronize()
                err = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1)).item()
                          for a, b in ((dk, want_dk), (dv, want_dv)))
                t = triton.testing.do_bench(lambda: gluon_dkdv(q, k, v, d_o, m, l, st, block_i, stages, overlap),
                                            return_mode="median")
                print(f"  gluon overlap={overlap} BLOCK_I={block_i} stages={stages}: max rel diff {err:.2e}, "
                      f"{t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s), {t_tri / t:.2f}x the Triton pass", flush=True)
            except Exception as e:   # noqa: BLE001 - a variant that fails is a line saying so
                print(f"  gluon overlap={overlap} BLOCK_I={block_i} stages={stages}: {type(e).__name__}: "
                      f"{str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
