"""A hand-written split decode kernel in Gluon for packed rows (grouped-query decode), to see what the generated
Triton kernel leaves of the copy's rate at KV = 4k and 32k (program_trace.py: its key loop reads 16 MB at
2.3 TB/s, one block in flight a program; the last program's combine is a serial tail of 1.6-3.6 us).

One program a (batch, key/value head) and chunk of key blocks, one warpgroup, no warp specialization:

- the copy engine loads the head's query rows (padded to 64, the warpgroup product's rows) and the chunk's first
  STAGES key and value blocks as soon as the program starts; each block's stage is loaded again with the block
  STAGES ahead as soon as its products are done, so STAGES - 1 blocks are always in flight;
- S = Q K^T and O += P V on the tensor cores from shared memory (P from registers), the running max and sum in
  registers, scores past the cache's end masked (the copy engine fills them with zeros);
- the chunk's partial O, max and sum go to a workspace; the last program of a head (a ticket) loads every
  chunk's max first, weighs each chunk once, and adds their O in one unrolled pass (loads issued together).

    python bench/experiments/2026-11-28-decode-fixed-costs/gluon_split_decode.py [--kv 4096,32768]
        [--modules DIR] [--stages 3] [--block-j 128] [--chunks 0]

checks against float64 and times, in turns, this kernel, the module DIR/gqa_dc.py (if given) and a copy of the
same bytes, with the suite's timer (bench.suite.attention.cuda_timer). Needs a Hopper GPU; imports only torch and
triton (and the bench helpers).
"""
import argparse
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROWS = gl.constexpr(64)   # the products' rows: a head's query rows, padded to what a warpgroup product takes


@gluon.jit
def split_decode(q_desc, k_desc, v_desc, part_o, part_ml, out, tickets, SKV, GROUP_ROWS, chunk_blocks, n_chunks,
                 qk_scale, BLOCK_J: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, CHUNKS_P2: gl.constexpr,
                 ROWS_C: gl.constexpr):
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_J, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    S_COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    O_COLS: gl.constexpr = gl.SliceLayout(0, O_LAYOUT)
    g = gl.program_id(0)   # batch * key/value heads + key/value head
    c = gl.program_id(1)   # chunk
    q_smem = gl.allocate_shared_memory(gl.float16, [ROWS, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, BLOCK_J, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, 1, BLOCK_J, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
    fence_async_shared()
    first = c * chunk_blocks
    n = gl.minimum(chunk_blocks, gl.cdiv(SKV, BLOCK_J) - first)
    kv_bytes: gl.constexpr = 2 * BLOCK_J * D * 2
    mbarrier.expect(q_bar, ROWS * D * 2)
    tma.async_copy_global_to_shared(q_desc, [g * GROUP_ROWS, 0], q_bar, q_smem)
    for st in gl.static_range(STAGES):
        if st < n:
            mbarrier.expect(ready.index(st), kv_bytes)
            tma.async_copy_global_to_shared(k_desc, [g, (first + st) * BLOCK_J, 0], ready.index(st), k_smem.index(st))
            tma.async_copy_global_to_shared(v_desc, [g, (first + st) * BLOCK_J, 0], ready.index(st), v_smem.index(st))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, S_ROWS)
    l_i = gl.zeros([ROWS], gl.float32, S_ROWS)
    acc = gl.zeros([ROWS, D], gl.float32, O_LAYOUT)
    zeros_s = gl.zeros([ROWS, BLOCK_J], gl.float32, S_LAYOUT)
    mbarrier.wait(q_bar, 0)
    for i in range(n):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        k_tile = k_smem.index(s).reshape([BLOCK_J, D])
        qk = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        offs_j = (first + i) * BLOCK_J + gl.arange(0, BLOCK_J, layout=S_COLS)
        scores = gl.where((offs_j < SKV)[None, :], qk * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(scores, axis=1))   # finite: a block holds a key below SKV
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, O_ROWS)[:, None]
        p16 = gl.convert_layout(p.to(gl.float16), P_LAYOUT)
        acc = warpgroup_mma(p16, v_smem.index(s).reshape([BLOCK_J, D]), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        m_i = m_new
        if i + STAGES < n:   # this stage's products are done: load the block STAGES ahead into it
            mbarrier.expect(ready.index(s), kv_bytes)
            tma.async_copy_global_to_shared(k_desc, [g, (first + i + STAGES) * BLOCK_J, 0], ready.index(s),
                                            k_smem.index(s))
            tma.async_copy_global_to_shared(v_desc, [g, (first + i + STAGES) * BLOCK_J, 0], ready.index(s),
                                            v_smem.index(s))
    # this chunk's partials: O (unscaled), max and sum of the head's rows
    part = g * n_chunks + c
    offs_r = gl.arange(0, ROWS, layout=O_ROWS)
    offs_d = gl.arange(0, D, layout=O_COLS)
    gl.store(part_o + (part * ROWS_C + offs_r[:, None]) * D + offs_d[None, :], acc,
             mask=(offs_r < GROUP_ROWS)[:, None])
    offs_rs = gl.arange(0, ROWS, layout=S_ROWS)
    gl.store(part_ml + (part * 2) * ROWS_C + offs_rs, m_i, mask=offs_rs < GROUP_ROWS)
    gl.store(part_ml + (part * 2 + 1) * ROWS_C + offs_rs, l_i, mask=offs_rs < GROUP_ROWS)
    gl.thread_barrier()
    if gl.atomic_add(tickets + g, 1) == n_chunks - 1:   # the head's last chunk: combine them all
        gl.store(tickets + g, 0)
        CL: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 4, 1], [2, 1, 0])
        ML: gl.constexpr = gl.SliceLayout(2, CL)
        cc = gl.arange(0, CHUNKS_P2, layout=gl.SliceLayout(1, ML))
        cr = gl.arange(0, ROWS_C, layout=gl.SliceLayout(0, ML))
        rows_ok = (cc < n_chunks)[:, None] & (cr < GROUP_ROWS)[None, :]
        at = (g * n_chunks + cc)[:, None] * 2 * ROWS_C + cr[None, :]
        m_c = gl.load(part_ml + at, mask=rows_ok, other=float("-inf"), cache_modifier=".cg")
        l_c = gl.load(part_ml + at + ROWS_C, mask=rows_ok, other=0.0, cache_modifier=".cg")
        m_all = gl.max(m_c, axis=0)
        m_all = gl.where(m_all == float("-inf"), 0.0, m_all)   # padded rows
        w = gl.exp2(m_c - m_all[None, :])                          # each chunk's weight, 0 for padding
        total = gl.sum(l_c * w, axis=0)
        w = w / gl.where(total == 0.0, 1.0, total)[None, :]
        cd = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, CL)))
        o_at = ((g * n_chunks + cc)[:, None, None] * ROWS_C + cr[None, :, None]) * D + cd[None, None, :]
        o_c = gl.load(part_o + o_at, mask=rows_ok[:, :, None], other=0.0, cache_modifier=".cg")
        o = gl.sum(o_c * w[:, :, None], axis=0)
        OL: gl.constexpr = gl.SliceLayout(0, CL)
        orow = gl.arange(0, ROWS_C, layout=gl.SliceLayout(1, OL))
        ocol = gl.arange(0, D, layout=gl.SliceLayout(0, OL))
        gl.store(out + (g * GROUP_ROWS + orow[:, None]) * D + ocol[None, :], o.to(gl.float16),
                 mask=(orow < GROUP_ROWS)[:, None])


def prepare(q, k, v, stages=3, block_j=128, chunks=0, sms=132):
    """A call computing out (like q) = softmax(q k^T / sqrt(D)) v per head, key/value head h // (H // HKV); q
    [B, H, 1, D], k and v [B, HKV, SKV, D], fp16. Descriptors and workspaces are built once, here, so that the
    call is one launch (building them costs far more host time than the kernel takes at KV = 4k)."""
    B, H, _, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    group = H // HKV
    blocks = -(-SKV // block_j)
    chunks = chunks or max(1, min(blocks, -(-sms // (B * HKV))))   # about one program a multiprocessor
    chunk_blocks = -(-blocks // chunks)
    chunks = -(-blocks // chunk_blocks)   # no chunk without blocks
    rows_c = max(2, 1 << (group - 1).bit_length())
    q2 = q.reshape(B * H, D)
    k3, v3 = k.reshape(B * HKV, SKV, D), v.reshape(B * HKV, SKV, D)
    lay_q = gl.NVMMASharedLayout.get_default_for([ROWS.value, D], gl.float16)
    lay_kv = gl.NVMMASharedLayout.get_default_for([1, block_j, D], gl.float16)
    q_desc = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [ROWS.value, D], lay_q)
    k_desc = TensorDescriptor(k3, list(k3.shape), list(k3.stride()), [1, block_j, D], lay_kv)
    v_desc = TensorDescriptor(v3, list(v3.shape), list(v3.stride()), [1, block_j, D], lay_kv)
    part_o = torch.empty(B * HKV * chunks * rows_c * D, device=q.device, dtype=torch.float32)
    part_ml = torch.empty(B * HKV * chunks * 2 * rows_c, device=q.device, dtype=torch.float32)
    tickets = prepare.tickets.get(q.device)
    if tickets is None or tickets.numel() < B * HKV:
        tickets = prepare.tickets[q.device] = torch.zeros(max(B * HKV, 1024), device=q.device, dtype=torch.int32)
    out = torch.empty_like(q)
    kernel = split_decode[(B * HKV, chunks)]
    args = (q_desc, k_desc, v_desc, part_o, part_ml, out, tickets, SKV, group, chunk_blocks, chunks,
            math.log2(math.e) / math.sqrt(D))
    meta = dict(BLOCK_J=block_j, D=D, STAGES=stages, CHUNKS_P2=max(2, 1 << (chunks - 1).bit_length()),
                ROWS_C=rows_c, num_warps=4)

    def call():
        kernel(*args, **meta)
        return out
    return call


prepare.tickets = {}


def main():
    from pathlib import Path

    from bench.suite import attention
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="4096,32768")
    ap.add_argument("--modules", default="")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--block-j", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graphs", action="store_true")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    timer = attention.cuda_timer(50, 300)
    module = attention.load_module(Path(args.modules) / "gqa_dc.py") if args.modules else None
    for kv in map(int, args.kv.split(",")):
        q = torch.randn(1, 64, 1, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 8, kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        kk, vv = (x.double().repeat_interleave(8, 1) for x in (k, v))
        ref = torch.softmax(q.double() @ kk.transpose(-1, -2) / math.sqrt(128), -1) @ vv
        calls = {"gluon": prepare(q, k, v, args.stages, args.block_j, args.chunks)}
        if module is not None:
            calls["generated"] = lambda: module.forward(q, k, v)
        nbytes = 2 * (2 * q.numel() + 2 * k.numel())
        src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float16).normal_()
        dst = torch.empty_like(src)
        for name, fn in calls.items():
            err = (fn().double() - ref).abs().max().item()
            print(f"KV={kv} {name:10s} max error {err:.2e}", flush=True)
            if not err < 2e-3:
                calls[name] = None
        calls = {n: f for n, f in calls.items() if f is not None}
        calls["same_bytes_copy"] = lambda: dst.copy_(src)
        if args.graphs:   # the same calls replayed from CUDA graphs: the kernels' time without the host's
            for name, fn in list(calls.items()):
                fn()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                calls[name + " (graph)"] = graph.replay
        times = {n: [] for n in calls}
        for _ in range(args.rounds):
            for n, fn in calls.items():
                times[n].append(timer(fn))
        copy = sorted(times["same_bytes_copy"])[args.rounds // 2]
        for n, ts in times.items():
            ms = sorted(ts)[args.rounds // 2]
            print(f"KV={kv} {n:16s} {ms * 1e3:7.1f} us  {nbytes / ms / 1e6:6.0f} GB/s  copy / this {copy / ms:5.1%}"
                  f"  rounds {' '.join(f'{t * 1e3:.1f}' for t in ts)}", flush=True)


if __name__ == "__main__":
    main()
