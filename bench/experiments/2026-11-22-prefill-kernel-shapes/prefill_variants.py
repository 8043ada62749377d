"""Which kernel shape should codegen emit for prefill? Times hand-written variants of the rolled attention
kernel that the compiler emits for global and causal prefill, beside the generated modules and cuDNN, in one
process on the GPU:

    ptr   pointer loads (as emitted today), scores scaled once per element before the max
    fma   pointer loads; max taken on the raw scores, scale folded into the exp2 argument (one FMA per element)
    tma   fma, with Q/K/V/O moved through tensor descriptors (the copy engine)
    tma_nofma     tma with the scores scaled before the max (as emitted)
    tma_ptrstore  tma with the output stored through a pointer (as emitted)
    tmaload       both: Q/K/V through descriptors, scaled scores, pointer store (the emitted kernel's shape)
    ws    tma, with the key loop warp-specialized (producer warps load, consumer warps compute)
    pp    tma, with the next block's scores issued before this block's softmax

and, for causal, three program orders: row blocks in order within a head, reversed within a head, and the
longest row blocks of every head first (heads vary fastest).

    PYTHONPATH=. python bench/experiments/2026-11-22-prefill-kernel-shapes/prefill_variants.py
        [--seqs 1024,4096,16384] [--out DIR]

Shapes are multiples of every block size (the point is speed; codegen handles tails). Each output is compared
with SDPA's math backend in float32 before it is timed. Imports only torch and triton.
"""
import argparse
import itertools
import json
import math
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.common import GENERATED, cudnn_attention, load

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # older Triton: the tma and ws variants report an error
    TensorDescriptor = None

HEADS, DIM = 32, 128
LOG2E = 1.4426950408889634


def configs(block_i):
    return [dict(BLOCK_I=bi, BLOCK_J=bj, num_warps=bi // 16, num_stages=st)
            for bi, bj, st in itertools.product(block_i, (64, 128), (2, 3, 4))]


@triton.jit
def _tile(q, k_t, v, m, l, acc, scale2, keep, MASKED: tl.constexpr, FMA: tl.constexpr):
    """One key block of the rolling update: new running max m, running sum l and weighted sum acc."""
    s = tl.dot(q, k_t)
    if MASKED:
        s = tl.where(keep, s, float("-inf"))
    return _update(s, v, m, l, acc, scale2, FMA)


@triton.jit
def _update(s, v, m, l, acc, scale2, FMA: tl.constexpr):
    """The rolling update for raw scores s (masked entries -inf) of one key block."""
    if FMA:
        m_new = tl.maximum(m, tl.max(s, 1) * scale2)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * scale2 - m_safe[:, None])
    else:
        s = s * scale2
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l, acc


@triton.jit
def _program(H, S, BLOCK_I: tl.constexpr, ORDER: tl.constexpr):
    n_rows = tl.cdiv(S, BLOCK_I)
    if ORDER == 2:     # heads vary fastest, longest row blocks first
        bh = tl.program_id(0)
        row = n_rows - 1 - tl.program_id(1)
    elif ORDER == 1:   # row blocks reversed within a head
        row = n_rows - 1 - tl.program_id(0)
        bh = tl.program_id(1)
    else:
        row = tl.program_id(0)
        bh = tl.program_id(1)
    return row, bh // H, bh % H


@triton.jit
def attn_ptr(q_ptr, k_ptr, v_ptr, o_ptr, s_b, s_h, s_s, H, S, scale2,
             D: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, CAUSAL: tl.constexpr,
             FMA: tl.constexpr, ORDER: tl.constexpr):
    row, b, h = _program(H, S, BLOCK_I, ORDER)
    base = b.to(tl.int64) * s_b + h.to(tl.int64) * s_h
    offs_i = row * BLOCK_I + tl.arange(0, BLOCK_I)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + base + offs_i[:, None] * s_s + offs_d[None, :])
    m = tl.full([BLOCK_I], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_I], tl.float32)
    acc = tl.zeros([BLOCK_I, D], tl.float32)
    full_hi = row * BLOCK_I if CAUSAL else S
    for start in range(0, full_hi, BLOCK_J):
        offs_j = start + tl.arange(0, BLOCK_J)
        k_t = tl.load(k_ptr + base + offs_j[None, :] * s_s + offs_d[:, None])
        v = tl.load(v_ptr + base + offs_j[:, None] * s_s + offs_d[None, :])
        m, l, acc = _tile(q, k_t, v, m, l, acc, scale2, None, False, FMA)
    if CAUSAL:
        for start in range(full_hi, (row + 1) * BLOCK_I, BLOCK_J):
            offs_j = start + tl.arange(0, BLOCK_J)
            k_t = tl.load(k_ptr + base + offs_j[None, :] * s_s + offs_d[:, None])
            v = tl.load(v_ptr + base + offs_j[:, None] * s_s + offs_d[None, :])
            keep = offs_i[:, None] >= offs_j[None, :]
            m, l, acc = _tile(q, k_t, v, m, l, acc, scale2, keep, True, FMA)
    out = acc / tl.where(l == 0, 1.0, l)[:, None]
    tl.store(o_ptr + base + offs_i[:, None] * s_s + offs_d[None, :], out.to(o_ptr.dtype.element_ty))


@triton.jit
def attn_tma(q_desc, k_desc, v_desc, o_desc, o_ptr, s_b, s_h, s_s, H, S, scale2,
             D: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, CAUSAL: tl.constexpr,
             WARP_SPECIALIZE: tl.constexpr, NEXT_FIRST: tl.constexpr, ORDER: tl.constexpr,
             FMA: tl.constexpr, STORE_TMA: tl.constexpr):
    """With NEXT_FIRST the scores of the next key block are issued before the softmax of this one, so the
    matrix unit could work while the exponentials run."""
    row, b, h = _program(H, S, BLOCK_I, ORDER)
    i0 = row * BLOCK_I
    q = q_desc.load([b, h, i0, 0]).reshape(BLOCK_I, D)
    m = tl.full([BLOCK_I], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_I], tl.float32)
    acc = tl.zeros([BLOCK_I, D], tl.float32)
    full_hi = i0 if CAUSAL else S
    if NEXT_FIRST:
        if full_hi > 0:
            s = tl.dot(q, k_desc.load([b, h, 0, 0]).reshape(BLOCK_J, D).T)
            for start in range(BLOCK_J, full_hi, BLOCK_J):
                v = v_desc.load([b, h, start - BLOCK_J, 0]).reshape(BLOCK_J, D)
                s_next = tl.dot(q, k_desc.load([b, h, start, 0]).reshape(BLOCK_J, D).T)
                m, l, acc = _update(s, v, m, l, acc, scale2, True)
                s = s_next
            v = v_desc.load([b, h, full_hi - BLOCK_J, 0]).reshape(BLOCK_J, D)
            m, l, acc = _update(s, v, m, l, acc, scale2, True)
    else:
        for start in tl.range(0, full_hi, BLOCK_J, warp_specialize=WARP_SPECIALIZE):
            k = k_desc.load([b, h, start, 0]).reshape(BLOCK_J, D)
            v = v_desc.load([b, h, start, 0]).reshape(BLOCK_J, D)
            m, l, acc = _tile(q, k.T, v, m, l, acc, scale2, None, False, FMA)
    if CAUSAL:
        offs_i = i0 + tl.arange(0, BLOCK_I)
        for start in tl.range(i0, i0 + BLOCK_I, BLOCK_J, warp_specialize=WARP_SPECIALIZE):
            k = k_desc.load([b, h, start, 0]).reshape(BLOCK_J, D)
            v = v_desc.load([b, h, start, 0]).reshape(BLOCK_J, D)
            keep = offs_i[:, None] >= (start + tl.arange(0, BLOCK_J))[None, :]
            m, l, acc = _tile(q, k.T, v, m, l, acc, scale2, keep, True, FMA)
    out = acc / tl.where(l == 0, 1.0, l)[:, None]
    if STORE_TMA:
        o_desc.store([b, h, i0, 0], out.to(tl.float16).reshape(1, 1, BLOCK_I, D))
    else:
        offs_i = i0 + tl.arange(0, BLOCK_I)
        base = b.to(tl.int64) * s_b + h.to(tl.int64) * s_h
        tl.store(o_ptr + base + offs_i[:, None] * s_s + tl.arange(0, D)[None, :], out.to(o_ptr.dtype.element_ty))


def launcher(variant, causal, cfg, order):
    """A function (q, k, v) -> o for one variant, config and program order."""
    cfg = dict(cfg)
    bi, bj = cfg.pop("BLOCK_I"), cfg.pop("BLOCK_J")
    scale2 = LOG2E / math.sqrt(DIM)

    def grid(B, S):
        rows = triton.cdiv(S, bi)
        return (B * HEADS, rows) if order == 2 else (rows, B * HEADS)

    if variant in ("ptr", "fma"):
        def run(q, k, v):
            o = torch.empty_like(q)
            B, H, S, D = q.shape
            attn_ptr[grid(B, S)](q, k, v, o, *q.stride()[:3], H, S, scale2, D=D, BLOCK_I=bi, BLOCK_J=bj,
                                 CAUSAL=causal, FMA=variant == "fma", ORDER=order, **cfg)
            return o
        return run
    if TensorDescriptor is None:
        raise RuntimeError("this Triton has no host tensor descriptors")

    def run(q, k, v):
        o = torch.empty_like(q)
        B, H, S, D = q.shape
        dq, do = (TensorDescriptor.from_tensor(t, [1, 1, bi, D]) for t in (q, o))
        dk, dv = (TensorDescriptor.from_tensor(t, [1, 1, bj, D]) for t in (k, v))
        attn_tma[grid(B, S)](dq, dk, dv, do, o, *o.stride()[:3], H, S, scale2, D=D, BLOCK_I=bi, BLOCK_J=bj,
                             CAUSAL=causal, WARP_SPECIALIZE=variant == "ws", NEXT_FIRST=variant == "pp", ORDER=order,
                             FMA=variant not in ("tma_nofma", "tmaload"),
                             STORE_TMA=variant not in ("tma_ptrstore", "tmaload"), **cfg)
        return o
    return run


def load_generated(op):
    path = GENERATED / f"{op}.py"
    return load(path).forward if path.exists() else None


def cudnn(causal):
    return lambda q, k, v: cudnn_attention(q, k, v, causal)


def check(fn, q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    n = min(q.shape[2], 2048)   # the reference on the first rows of the first head keeps memory small
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :1, :n].float(), k[:, :1].float(), v[:, :1].float(),
            attn_mask=(torch.arange(n, device=q.device)[:, None] >= torch.arange(q.shape[2], device=q.device)[None])
            if causal else None)
    out = fn(q, k, v)[:, :1, :n].float()
    err = ((out - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"relative error {err:.2e}")
    return err


def tflops(ms, S, causal):
    pairs = S * (S + 1) / 2 if causal else S * S
    return 4 * HEADS * pairs * DIM / (ms * 1e-3) / 1e12


def time_one(fn, q, k, v, causal, S):
    try:
        check(fn, q, k, v, causal)
        ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=50, rep=200, return_mode="median")
        return round(tflops(ms, S, causal), 1)
    except Exception as e:   # a variant this Triton cannot build is reported, not fatal
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def rows_error(key, rows):
    return next(r["tflops"] for r in rows if (r["op"], r["S"], r["variant"], r["order"]) == key)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--variants", default="ptr,fma,tma,ws,pp")
    ap.add_argument("--block-i", default="128", help="row block sizes (16 rows per warp)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for causal, S in itertools.product((False, True), map(int, args.seqs.split(","))):
        op = "causal_pf" if causal else "global_pf"
        q, k, v = (torch.randn(1, HEADS, S, DIM, device="cuda", dtype=torch.float16) for _ in range(3))
        baseline = {"generated": load_generated(op), "cudnn": cudnn(causal)}
        for name, fn in baseline.items():
            if fn is not None:
                rows.append(dict(op=op, S=S, variant=name, config="", order="", tflops=time_one(fn, q, k, v, causal, S)))
                print(rows[-1], flush=True)
        best = {}
        for variant, cfg in itertools.product(args.variants.split(","), configs(map(int, args.block_i.split(",")))):
            r = time_one(launcher(variant, causal, cfg, 0), q, k, v, causal, S)
            rows.append(dict(op=op, S=S, variant=variant, config=cfg, order=0, tflops=r))
            print(rows[-1], flush=True)
            if isinstance(r, float) and r > best.get(variant, (0, None))[0]:
                best[variant] = (r, cfg)
        if causal:
            for variant, (_, cfg) in best.items():
                for order in (1, 2):
                    r = time_one(launcher(variant, causal, cfg, order), q, k, v, causal, S)
                    rows.append(dict(op=op, S=S, variant=variant, config=cfg, order=order, tflops=r))
                    print(rows[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prefill_variants.json").write_text(json.dumps(
        dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=rows),
        indent=1))
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print("| op | S | variant | order | best TF/s | config |")
    print("|---|---|---|---|---|---|")
    for key, group in itertools.groupby(rows, key=lambda r: (r["op"], r["S"], r["variant"], r["order"])):
        ok = [r for r in group if isinstance(r["tflops"], float)]
        if ok:
            top = max(ok, key=lambda r: r["tflops"])
            cfg = top["config"] and "{BLOCK_I}/{BLOCK_J}/{num_stages}".format(**top["config"])
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {top['tflops']} | {cfg} |")
        else:
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | failed | {rows_error(key, rows)} |")


if __name__ == "__main__":
    sys.exit(main())
