"""Experiment: global attention's whole backward in one warp-specialized Gluon pass of five matrix products,
against the generated two-pass backward (bench/generated/backward/global_pf_fp16.py: dK/dV per key block, then
dQ per query block, seven products).

Written by hand to measure the schedule before the generator emits it. Each program owns a key block of 128 keys:
a producer warpgroup copies its K and V once and the query blocks' Q and dO into a ring of stages; two consumer
warpgroups, 64 keys each, compute per query block S^T = K Q^T and dP^T = V dO^T, then the generated kernel's
per-element form (P^T = exp2(S^T c - lse), dS^T = (dP^T + stat) P^T, with the saved base-2 logsumexp and the
row statistic -D), accumulate dV += P^T dO and dK += dS^T Q in registers, and write dS^T to shared memory. Once
both halves are there, each consumer computes half of dQ's columns, dQ[:, half] = dS K[:, half], and adds it to
an fp32 buffer through the copy engine's bulk reduce (cp.reduce.async.bulk.tensor, which Gluon builds but does not
name), so no register waits on the additions.

    python bench/experiments/2026-11-27-one-pass-backward/one_pass_gluon.py [--seqs 4096,16384]
"""
import argparse
import sys
from pathlib import Path

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

ROWS = gl.constexpr(64)   # keys per consumer warpgroup
HALF = gl.constexpr(64)   # dQ columns per consumer warpgroup
LOG2_SCALE = gl.constexpr(0.12751743082459868)   # softmax scale * log2(e)
SCALE = gl.constexpr(0.08838834764831843)


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add a shared-memory tile into global memory through the copy engine (the bulk tensor reduce)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def tile_of(S, H, BLOCK_J: gl.constexpr, ORDER: gl.constexpr):
    """This program's key block, batch and kv head: heads first (ORDER 0), or key blocks first (ORDER 1: under a
    causal mask the first key blocks see the most query blocks, so the longest programs start first)."""
    pid = gl.program_id(0)
    n_jb = gl.cdiv(S, BLOCK_J)
    if ORDER:
        jb = pid // (gl.num_programs(0) // n_jb)
        bh = pid % (gl.num_programs(0) // n_jb)
    else:
        jb = pid % n_jb
        bh = pid // n_jb
    return jb, bh // H, bh % H


@gluon.jit
def one_pass_producer(q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H,
                      k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_bar, done_bar,
                      BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                      GROUP: gl.constexpr, DEFER: gl.constexpr, ORDER: gl.constexpr):
    jb, b, h = tile_of(S, H, BLOCK_J, ORDER)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, h, jb * BLOCK_J, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, h, jb * BLOCK_J, 0], kv_bar, v_smem)
    first = (jb * BLOCK_J) // BLOCK_I if CAUSAL else 0   # the first query block that sees this key block
    blocks = gl.cdiv(S, BLOCK_I) - first
    for it in range(GROUP * blocks):   # the query heads of the group, each over its query blocks
        stage = it % STAGES
        hq = h * GROUP + it // blocks
        start = (first + it % blocks) * BLOCK_I
        mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, hq, start, 0], ready.index(stage), q_smem.index(stage))
        tma.async_copy_global_to_shared(do_desc, [b, hq, start, 0], ready.index(stage), do_smem.index(stage))


@gluon.jit
def one_pass_consumer(q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H,
                      k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_bar, done_bar,
                      BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                      GROUP: gl.constexpr, DEFER: gl.constexpr, ORDER: gl.constexpr,
                      ME: gl.constexpr):
    D: gl.constexpr = 128
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_I, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    Q_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    S_KEYS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    jb, b, h = tile_of(S, H, BLOCK_J, ORDER)
    keys = k_smem.reshape([BLOCK_J, D])
    k_tile = keys.slice(ME * ROWS, ROWS)
    k_cols = keys.slice(ME * HALF, HALF, dim=1)   # every key, this consumer's half of the head dimension
    v_tile = v_smem.reshape([BLOCK_J, D]).slice(ME * ROWS, ROWS)
    dq_tile = dq_smem.index(ME)
    dq_rows = dq_tile.reshape([BLOCK_I, HALF])
    dk = gl.zeros([ROWS, D], gl.float32, O_LAYOUT)
    dv = gl.zeros([ROWS, D], gl.float32, O_LAYOUT)
    zeros_s = gl.zeros([ROWS, BLOCK_I], gl.float32, S_LAYOUT)
    zeros_q = gl.zeros([BLOCK_I, HALF], gl.float32, Q_LAYOUT)
    offs_j = jb * BLOCK_J + ME * ROWS + gl.arange(0, ROWS, layout=S_KEYS)
    first = (jb * BLOCK_J) // BLOCK_I if CAUSAL else 0
    mbarrier.wait(kv_bar, 0)
    blocks = gl.cdiv(S, BLOCK_I) - first
    if not DEFER:
        for it in range(GROUP * blocks):
            hq = h * GROUP + it // blocks
            row0 = (b * H * GROUP + hq) * S   # the saved row vectors are [B, H * GROUP, S], contiguous
            start = (first + it % blocks) * BLOCK_I
            stage = it % STAGES
            buf = it % 2
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            q_t = q_smem.index(stage).reshape([BLOCK_I, D])
            do_t = do_smem.index(stage).reshape([BLOCK_I, D])
            st = warpgroup_mma(k_tile, q_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_tile, do_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            offs_i = start + gl.arange(0, BLOCK_I, layout=S_COLS)
            valid_i = offs_i < S
            lse = gl.load(lse_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            stat = gl.load(st_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
            if CAUSAL:
                valid = valid_i[None, :] & (offs_i[None, :] >= offs_j[:, None])
            else:
                valid = valid_i[None, :] & (offs_j[:, None] >= 0)
            p16 = gl.where(valid, gl.exp2(st * LOG2_SCALE - lse[None, :]).to(gl.float16), 0.0)
            dv = warpgroup_mma(gl.convert_layout(p16, P_LAYOUT), do_t, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt,))
            ds16 = ((dpt + stat[None, :]).to(gl.float16).to(gl.float32) * p16.to(gl.float32)).to(gl.float16)
            dk = warpgroup_mma(gl.convert_layout(ds16, P_LAYOUT), q_t, dk, is_async=True)
            ds_t = ds_smem.index(buf)
            ds_t.slice(ME * ROWS, ROWS).store(ds16)
            fence_async_shared()
            mbarrier.arrive(ds_bar.index(buf), count=1)
            mbarrier.wait(ds_bar.index(buf), (it // 2) & 1)   # both halves of dS^T are in shared memory
            dq = warpgroup_mma(ds_t.permute((1, 0)), k_cols, zeros_q, use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
            mbarrier.arrive(empty.index(stage), count=1)
            tma.store_wait(pendings=0)   # the last block's dQ has left dq_tile
            dq_rows.store(dq * SCALE)
            fence_async_shared()
            async_reduce_add(dq_desc, [b, hq, start, ME * HALF], dq_tile)
    else:   # the last block's dQ is multiplied after this block's S^T and dP^T are issued, and its dV and dK
        # products are waited for after them, so a consumer's tensor-core work is queued while it waits
        prev_start = 0
        prev_hq = 0
        prev_stage = 0
        dk = warpgroup_mma_init(dk)   # carried through the loop as products in flight
        dv = warpgroup_mma_init(dv)
        for it in range(GROUP * blocks):
            hq = h * GROUP + it // blocks
            row0 = (b * H * GROUP + hq) * S
            start = (first + it % blocks) * BLOCK_I
            stage = it % STAGES
            buf = it % 2
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            q_t = q_smem.index(stage).reshape([BLOCK_I, D])
            do_t = do_smem.index(stage).reshape([BLOCK_I, D])
            st = warpgroup_mma(k_tile, q_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_tile, do_t.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            # both halves of the last block's dS^T (a fresh barrier passes parity 1: the first block does not wait;
            # its product reads a buffer no one wrote, and is dropped)
            mbarrier.wait(ds_bar.index(1 - buf), ((it + 1) // 2 + 1) & 1)
            dq = warpgroup_mma(ds_smem.index(1 - buf).permute((1, 0)), k_cols, zeros_q, use_acc=False,
                               is_async=True)
            offs_i = start + gl.arange(0, BLOCK_I, layout=S_COLS)
            valid_i = offs_i < S
            lse = gl.load(lse_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            stat = gl.load(st_ptr + row0 + offs_i, mask=valid_i, other=0.0)
            dv, dk, st = warpgroup_mma_wait(num_outstanding=2, deps=(dv, dk, st))
            mbarrier.arrive(empty.index(prev_stage), count=1, pred=it > 0)
            if CAUSAL:
                valid = valid_i[None, :] & (offs_i[None, :] >= offs_j[:, None])
            else:
                valid = valid_i[None, :] & (offs_j[:, None] >= 0)
            p16 = gl.where(valid, gl.exp2(st * LOG2_SCALE - lse[None, :]).to(gl.float16), 0.0)
            dv = warpgroup_mma(gl.convert_layout(p16, P_LAYOUT), do_t, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=2, deps=(dpt,))
            ds16 = ((dpt + stat[None, :]).to(gl.float16).to(gl.float32) * p16.to(gl.float32)).to(gl.float16)
            dk = warpgroup_mma(gl.convert_layout(ds16, P_LAYOUT), q_t, dk, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=2, deps=(dq,))
            ds_smem.index(buf).slice(ME * ROWS, ROWS).store(ds16)
            fence_async_shared()
            mbarrier.arrive(ds_bar.index(buf), count=1)
            if it > 0:
                tma.store_wait(pendings=0)   # the block before's dQ has left dq_tile
                dq_rows.store(dq * SCALE)
                fence_async_shared()
                async_reduce_add(dq_desc, [b, prev_hq, prev_start, ME * HALF], dq_tile)
            prev_start = start
            prev_hq = hq
            prev_stage = stage
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        last = GROUP * blocks - 1
        mbarrier.wait(ds_bar.index(last % 2), (last // 2) & 1)
        dq = warpgroup_mma(ds_smem.index(last % 2).permute((1, 0)), k_cols, zeros_q, use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        tma.store_wait(pendings=0)
        dq_rows.store(dq * SCALE)
        fence_async_shared()
        async_reduce_add(dq_desc, [b, prev_hq, prev_start, ME * HALF], dq_tile)
    # the other consumer's last dQ product reads this consumer's keys: wait for it before K's rows are reused
    mbarrier.arrive(done_bar, count=1)
    mbarrier.wait(done_bar, 0)
    k_tile.store((dk * SCALE).to(gl.float16))
    v_tile.store(dv.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, h, jb * BLOCK_J + ME * ROWS, 0], k_smem.slice(ME * ROWS, ROWS, dim=2))
    tma.async_copy_shared_to_global(dv_desc, [b, h, jb * BLOCK_J + ME * ROWS, 0], v_smem.slice(ME * ROWS, ROWS, dim=2))
    tma.store_wait(pendings=0)


@gluon.jit
def one_pass_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H,
                    BLOCK_J: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                      GROUP: gl.constexpr, DEFER: gl.constexpr, ORDER: gl.constexpr):
    k_smem = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_J, 128], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [1, 1, BLOCK_J, 128], v_desc.layout)
    q_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_I, 128], q_desc.layout)
    do_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 1, BLOCK_I, 128], do_desc.layout)
    DS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_J, BLOCK_I], gl.float16)
    ds_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_J, BLOCK_I], DS_LAYOUT)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 1, BLOCK_I, HALF], dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(done_bar, count=2)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)   # both consumers release a stage
    for s in gl.static_range(2):
        mbarrier.init(ds_bar.index(s), count=2)   # both consumers' halves of dS^T
    fence_async_shared()
    gl.warp_specialize([
        (one_pass_producer, (q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H, k_smem, v_smem,
                              q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_bar, done_bar, BLOCK_J, BLOCK_I,
                              STAGES, CAUSAL, GROUP, DEFER, ORDER)),
        (one_pass_consumer, (q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H, k_smem, v_smem,
                              q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_bar, done_bar, BLOCK_J, BLOCK_I,
                              STAGES, CAUSAL, GROUP, DEFER, ORDER, gl.constexpr(0))),
        (one_pass_consumer, (q_desc, do_desc, k_desc, v_desc, dq_desc, dk_desc, dv_desc, lse_ptr, st_ptr, S, H, k_smem, v_smem,
                              q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_bar, done_bar, BLOCK_J, BLOCK_I,
                              STAGES, CAUSAL, GROUP, DEFER, ORDER, gl.constexpr(1))),
    ], [4, 4], [240, 240])


def descriptor(x, block):
    dtype = gl.float32 if x.dtype == torch.float32 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def one_pass_backward(q, k, v, d_o, lse, stat, block_i=64, stages=2, causal=0, defer=0, order=0):
    """dq, dk, dv of attention (global or causal, each kv head shared by a group of query heads) from the saved
    base-2 logsumexp and the row statistic -D."""
    group = q.shape[1] // k.shape[1]
    B, H, S, D = k.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    BLOCK_J = 2 * ROWS.value
    descs = [descriptor(x, [1, 1, block_i, D]) for x in (q, d_o)]
    descs += [descriptor(x, [1, 1, BLOCK_J, D]) for x in (k, v)]
    descs += [descriptor(dq_acc, [1, 1, block_i, HALF.value])]
    descs += [descriptor(x, [1, 1, ROWS.value, D]) for x in (dk, dv)]
    grid = (triton.cdiv(S, BLOCK_J) * B * H,)
    one_pass_kernel[grid](*descs, lse, stat, S, H, BLOCK_J=BLOCK_J, BLOCK_I=block_i, STAGES=stages,
                          CAUSAL=causal, GROUP=group, DEFER=defer, ORDER=order, num_warps=4, maxnreg=168)
    return dq_acc.to(q.dtype), dk, dv


def reference(q, k, v, d_o, causal):
    """Gradients of the plain math in float64."""
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ v.repeat_interleave(group, 1)).backward(d_o.double())
    return q.grad, k.grad, v.grad


HEADS = {"gqa_pf": (64, 8)}   # query heads, kv heads (others: 32, 32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1000,4096,16384")
    ap.add_argument("--ops", default="global_pf,causal_pf,gqa_pf")
    ap.add_argument("--anchors", default="", help="systems of bench.suite.backward timed beside, e.g. flex,sdpa_cudnn")
    ap.add_argument("--variants", default="2,0,0;2,1,0;2,0,1;2,1,1",
                    help="stages,defer,order of each variant, ';'-separated")
    args = ap.parse_args()
    from bench.common import load_module
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for op in args.ops.split(","):
        mod = load_module(ROOT / f"bench/generated/backward/{op}_fp16.py")
        causal = int(op != "global_pf")
        for S in map(int, args.seqs.split(",")):
            g = torch.Generator(device="cuda").manual_seed(0)
            heads, kv_heads = HEADS.get(op, (32, 32))
            q, k, v, d_o = (torch.randn(1, n, S, 128, device="cuda", dtype=torch.float16, generator=g)
                            for n in (heads, kv_heads, kv_heads, heads))
            out, saved = mod.forward_saved(q, k, v)
            t = dict(zip(mod.INPUTS, (q, k, v)))
            t.update(zip(mod.SAVED, saved))
            t["out_o"], t["d_o"] = out, d_o
            lse = t["saved2"]
            want = mod.backward(q, k, v, out=out, grad_out=d_o, saved=saved)
            flops = 2.5 * 4 * S * S * 128 * heads / (2 if causal else 1)
            t_two = triton.testing.do_bench(lambda: mod.backward(q, k, v, out=out, grad_out=d_o, saved=saved),
                                            return_mode="median")
            line = f"{op} S={S}: two passes {t_two:.3f} ms ({flops / t_two / 1e9:.0f} TFLOP/s)"
            if S <= 1024:   # float64 oracle
                ref = reference(q, k, v, d_o, causal)
                errs = [((a.double() - r).abs().max() / r.abs().max()).item() for a, r in zip(want, ref)]
                line += f", max rel err vs float64 {max(errs):.1e}"
            for name in filter(None, args.anchors.split(",")):
                from bench.suite.attention import OPS
                from bench.suite.backward import system_call
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                call = system_call(name, OPS[op], None, *leaves, None, d_o)
                if call is not None:
                    ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
                    line += f"; {name} {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s)"
            print(line, flush=True)
            for variant in args.variants.split(";"):
                stages, defer, order = map(int, variant.split(","))

                def run():
                    stat = mod._run("stat4", t, mod.STAGES["stat4"])
                    return one_pass_backward(q, k, v, d_o, lse, stat[0] if isinstance(stat, tuple) else stat,
                                             64, stages, causal, defer, order)
                try:
                    got = run()
                    torch.cuda.synchronize()
                    diff = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                               for a, b in zip(got, want))
                    msg = f"max rel diff vs two passes {diff:.1e}"
                    if S <= 1024:
                        errs = [((a.double() - r).abs().max() / r.abs().max()).item() for a, r in zip(got, ref)]
                        msg += f", vs float64 {max(errs):.1e}"
                    ms = triton.testing.do_bench(run, return_mode="median")
                    print(f"  one pass stages={stages} defer={defer} order={order}: {msg}, {ms:.3f} ms "
                          f"({flops / ms / 1e9:.0f} TFLOP/s), {t_two / ms:.2f}x the two passes", flush=True)
                except Exception as e:   # noqa: BLE001 - a variant that fails is a line saying so
                    print(f"  one pass stages={stages} defer={defer} order={order}: {type(e).__name__}: {str(e)[:300]}",
                          flush=True)


if __name__ == "__main__":
    main()
