"""Experiment: what makes the generated key-block gradient pass (dK, dV) of global attention run at ~450 TFLOP/s
on an H100 while the query-block pass (dQ) of the same backward runs at ~590? Triton kernels of the same pass,
written by hand, that differ from the generated one in one respect each:

    LOADS    0: Q and dO each copied twice per block by the copy engine (as the generated kernel: once as
                stored for the dV / dK products, once transposed for S^T / dP^T)
             1: Q and dO loaded once each through pointers, Q as Q^T; the other order is tl.trans of the same tile
    LEAN     0: the generated per-element work: P16 = f16(exp2(s c - m log2e)), P = f16(P16 / l),
                dS = f16(f16(stat2 + dP / l) P16) (the forward's roundings, kept by the derivation)
             1: one row statistic each: P = exp2(s c - lse2), dS = P (dP - delta), rounded once for the product
             2: the statistics of 0 (m, l, stat2), each value rounded once, for the product
             3: as 2, a column past the end masked by its statistic (m = inf) rather than by a select
             4: as 0, masked as 3
             5: as 4, the statistics' own math once per row: a = m log2e and r = 1 / l read instead of m and l
             6: as 5, each value rounded once

    python bench/experiments/2026-11-27-gluon-backward/dkdv_forms.py [--seqs 4096,16384]

Run against the backward modules generated before `plan/staging.py` (their forward saves the row max and row
sum, and `stat2` is -D / l); the modules generated since read the logsumexp and -D instead.
"""
import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

SCALE_LOG2 = tl.constexpr(0.12751743082459868)   # 1/sqrt(128) * log2(e)
SCALE = tl.constexpr(0.08838834764831843)


@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, a_ptr, b_ptr, c_ptr, q_desc, do_desc, S, H,
                BLOCK_J: tl.constexpr, BLOCK_I: tl.constexpr, LOADS: tl.constexpr, LEAN: tl.constexpr):
    """a, b, c: m, l, stat2 (LEAN 0) or lse2, delta, unused (LEAN 1). Tensors [B, H, S, 128] contiguous."""
    jb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    base = bh.to(tl.int64) * S * 128
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, 128)
    valid_j = offs_j < S
    k = tl.load(k_ptr + base + offs_j[:, None] * 128 + offs_d[None, :], mask=valid_j[:, None], other=0.0)
    v = tl.load(v_ptr + base + offs_j[:, None] * 128 + offs_d[None, :], mask=valid_j[:, None], other=0.0)
    dk = tl.zeros([BLOCK_J, 128], tl.float32)
    dv = tl.zeros([BLOCK_J, 128], tl.float32)
    for start in range(0, S, BLOCK_I):
        offs_i = start + tl.arange(0, BLOCK_I)
        valid_i = offs_i < S
        if LOADS == 0:
            q = q_desc.load([b, h, start, 0]).reshape(BLOCK_I, 128)
            qT = q_desc.load([b, h, start, 0]).reshape(BLOCK_I, 128).T
            do = do_desc.load([b, h, start, 0]).reshape(BLOCK_I, 128)
            doT = do_desc.load([b, h, start, 0]).reshape(BLOCK_I, 128).T
        else:
            qT = tl.load(q_ptr + base + offs_i[None, :] * 128 + offs_d[:, None], mask=valid_i[None, :], other=0.0)
            do = tl.load(do_ptr + base + offs_i[:, None] * 128 + offs_d[None, :], mask=valid_i[:, None], other=0.0)
            q = tl.trans(qT)
            doT = tl.trans(do)
        st = tl.dot(k, qT)
        dpt = tl.dot(v, doT)
        rows = bh.to(tl.int64) * S + offs_i
        if LEAN == 0:
            m = tl.load(a_ptr + rows, mask=valid_i, other=0.0)
            inv_l = 1.0 / tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p16 = tl.math.exp2(st * SCALE_LOG2 - (m * 1.4426950408889634)[None, :]).to(tl.float16)
            pn = tl.where(valid_i[None, :], (p16.to(tl.float32) * inv_l[None, :]).to(tl.float16), 0.0)
            ds = (st2[None, :] + dpt * inv_l[None, :]).to(tl.float16).to(tl.float32) * p16.to(tl.float32)
            ds = tl.where(valid_i[None, :], ds, 0.0).to(tl.float16)
        elif LEAN == 2:   # the same statistics, without rounding P and dS / P to 16 bits between steps
            m = tl.load(a_ptr + rows, mask=valid_i, other=0.0)
            inv_l = 1.0 / tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p = tl.math.exp2(st * SCALE_LOG2 - (m * 1.4426950408889634)[None, :])
            pn = tl.where(valid_i[None, :], p * inv_l[None, :], 0.0).to(tl.float16)
            ds = tl.where(valid_i[None, :], (st2[None, :] + dpt * inv_l[None, :]) * p, 0.0).to(tl.float16)
        elif LEAN == 3:   # as 2, a column past the end masked by its statistic (exp2(-inf) = 0), not a select
            m = tl.load(a_ptr + rows, mask=valid_i, other=float("inf"))
            inv_l = 1.0 / tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p = tl.math.exp2(st * SCALE_LOG2 - (m * 1.4426950408889634)[None, :])
            pn = (p * inv_l[None, :]).to(tl.float16)
            ds = ((st2[None, :] + dpt * inv_l[None, :]) * p).to(tl.float16)
        elif LEAN == 4:   # as 0 (the roundings), masked as 3
            m = tl.load(a_ptr + rows, mask=valid_i, other=float("inf"))
            inv_l = 1.0 / tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p16 = tl.math.exp2(st * SCALE_LOG2 - (m * 1.4426950408889634)[None, :]).to(tl.float16)
            pn = (p16.to(tl.float32) * inv_l[None, :]).to(tl.float16)
            ds = ((st2[None, :] + dpt * inv_l[None, :]).to(tl.float16).to(tl.float32) * p16.to(tl.float32)).to(tl.float16)
        elif LEAN == 5:   # as 4, with the row statistics' own math done once per row (a = m log2e, r = 1 / l)
            a = tl.load(a_ptr + rows, mask=valid_i, other=float("inf"))
            r = tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p16 = tl.math.exp2(st * SCALE_LOG2 - a[None, :]).to(tl.float16)
            pn = (p16.to(tl.float32) * r[None, :]).to(tl.float16)
            ds = ((st2[None, :] + dpt * r[None, :]).to(tl.float16).to(tl.float32) * p16.to(tl.float32)).to(tl.float16)
        elif LEAN == 6:   # as 5, each value rounded once, for the product
            a = tl.load(a_ptr + rows, mask=valid_i, other=float("inf"))
            r = tl.load(b_ptr + rows, mask=valid_i, other=1.0)
            st2 = tl.load(c_ptr + rows, mask=valid_i, other=0.0)
            p = tl.math.exp2(st * SCALE_LOG2 - a[None, :])
            pn = (p * r[None, :]).to(tl.float16)
            ds = ((st2[None, :] + dpt * r[None, :]) * p).to(tl.float16)
        else:
            lse2 = tl.load(a_ptr + rows, mask=valid_i, other=float("inf"))
            delta = tl.load(b_ptr + rows, mask=valid_i, other=0.0)
            p = tl.math.exp2(st * SCALE_LOG2 - lse2[None, :])
            pn = p.to(tl.float16)
            ds = (p * (dpt - delta[None, :])).to(tl.float16)
        dv = tl.dot(pn, do, dv)
        dk = tl.dot(ds, q, dk)
    tl.store(dk_ptr + base + offs_j[:, None] * 128 + offs_d[None, :], (dk * SCALE).to(tl.float16),
             mask=valid_j[:, None])
    tl.store(dv_ptr + base + offs_j[:, None] * 128 + offs_d[None, :], dv.to(tl.float16), mask=valid_j[:, None])


def dkdv(q, k, v, d_o, a, b, c, loads, lean, block_j=128, block_i=64, warps=8, stages=2):
    B, H, S, D = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    q_desc = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, block_i, D])
    do_desc = TensorDescriptor(d_o, list(d_o.shape), list(d_o.stride()), [1, 1, block_i, D])
    grid = (triton.cdiv(S, block_j), B * H)
    dkdv_kernel[grid](q, k, v, d_o, dk, dv, a, b, c, q_desc, do_desc, S, H, BLOCK_J=block_j, BLOCK_I=block_i,
                      LOADS=loads, LEAN=lean, num_warps=warps, num_stages=stages)
    return dk, dv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--variants", default="1,4,3;1,5,3;1,6,3;1,1,3;0,5,3",
                    help="LOADS,LEAN,stages of each variant, ';'-separated")
    args = ap.parse_args()
    from bench.common import load_module
    mod = load_module(ROOT / "bench/generated/backward/global_pf_fp16.py")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for S in map(int, args.seqs.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, d_o = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
        out, (m, l) = mod.forward_saved(q, k, v)
        st = mod._module("stat2").forward(d_o, out, l)
        st = st[0] if isinstance(st, tuple) else st
        lse2 = m * 1.4426950408889634 + torch.log2(l)
        delta = (d_o.float() * out.float()).sum(-1)
        generated = mod._module("global_pf_dv_dk0")
        want_dv, want_dk = generated.forward(q, k, v, d_o, m, l, st)
        flops = 4 * 2 * S * S * 128 * 32   # the four products of the pass
        t_gen = triton.testing.do_bench(lambda: generated.forward(q, k, v, d_o, m, l, st), return_mode="median")
        print(f"S={S}: generated dK/dV pass {t_gen:.3f} ms ({flops / t_gen / 1e9:.0f} TFLOP/s)", flush=True)
        for variant in args.variants.split(";"):
            loads, lean, stages = map(int, variant.split(","))
            stats = (lse2, delta, delta) if lean == 1 else (m * 1.4426950408889634, 1 / l, st) if lean in (5, 6) else (m, l, st)
            try:
                dk, dv = dkdv(q, k, v, d_o, *stats, loads, lean, stages=stages)
                torch.cuda.synchronize()
                err = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1)).item()
                          for a, b in ((dk, want_dk), (dv, want_dv)))
                t = triton.testing.do_bench(lambda: dkdv(q, k, v, d_o, *stats, loads, lean, stages=stages),
                                            return_mode="median")
                print(f"  LOADS={loads} LEAN={lean} stages={stages}: max rel diff {err:.2e}, {t:.3f} ms "
                      f"({flops / t / 1e9:.0f} TFLOP/s), {t_gen / t:.2f}x the generated pass", flush=True)
            except Exception as e:   # noqa: BLE001 - a variant that fails is a line saying so
                print(f"  LOADS={loads} LEAN={lean} stages={stages}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
