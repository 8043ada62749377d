"""Does warp specialization close the prefill gap to cuDNN? A hand-written Gluon kernel of global prefill laid
out the way FlashAttention-3 and cuDNN lay out Hopper attention, timed beside the emitted Triton module, the
best single-warpgroup Gluon kernel of gluon_prefill.py and cuDNN, in one process.

Each program owns 2 x 64 query rows and three partitions of warps:

    producer     one warpgroup (one warp busy): copies Q once and K/V blocks into a ring with the copy engine
    consumer 0   one warpgroup, query rows 0-63: scores, online softmax, weighted sum of V
    consumer 1   one warpgroup, query rows 64-127: the same

Both consumers read the same K/V stage; a stage is refilled when both have released it. Options:

    PINGPONG     the consumers take turns issuing their matrix products (two mbarriers pass the turn), so one
                 computes exponentials while the other's products occupy the tensor cores
    OVERLAP      within a consumer, the next block's scores are issued together with this block's weighted
                 sum, and the softmax of the next block runs while the weighted sum is in flight

    PYTHONPATH=. python bench/experiments/2026-11-22-gluon-prefill/gluon_pingpong.py
        [--seqs 1024,4096,16384] [--rounds 3]

Shapes are multiples of 128 (the point is speed). Each output is compared with SDPA's math backend in float32
before it is timed. Imports only torch and triton.
"""
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from gluon_prefill import descriptors

HEADS, DIM = 32, 128
LOG2E = 1.4426950408889634
ROWS = gl.constexpr(64)          # query rows per consumer warpgroup (one m64 warpgroup product per block)
CONSUMERS = gl.constexpr(2)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, N_CTX,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Q once, then every K/V block into the ring: wait until both consumers released the stage, then copy."""
    row0 = gl.program_id(1) * N_CTX + gl.program_id(0) * (ROWS * CONSUMERS)
    kv0 = gl.program_id(1) * N_CTX
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, 0], q_bar, q_smem)
    for j in range(N_CTX // BLOCK_N):
        stage = j % STAGES
        mbarrier.wait(kv_empty.index(stage), ((j // STAGES) & 1) ^ 1)   # a fresh barrier passes parity 1
        bar = kv_ready.index(stage)
        mbarrier.expect(bar, 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv0 + j * BLOCK_N, 0], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [kv0 + j * BLOCK_N, 0], bar, v_smem.index(stage))


@gluon.jit
def _take_turn(turns, turn, ME: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait until the other consumer has finished the turns this one must follow: consumer 0's turn t follows
    t turns of consumer 1; consumer 1's turn t follows t + 1 turns of consumer 0."""
    if PINGPONG:
        mbarrier.wait(turns.index(ME), (turn & 1) ^ (1 - ME))


@gluon.jit
def _pass_turn(turns, ME: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - ME), count=1)


@gluon.jit
def _online_softmax(qk, m_i, l_i, qk_scale):
    """Probabilities of one block of raw scores, the rescale factor of what came before, new max and sum."""
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(qk * qk_scale - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _consumer(o_desc, q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turns, qk_scale, N_CTX,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, ME: gl.constexpr,
              PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q = q_smem.slice(ME * ROWS, ROWS, dim=0)
    n_blocks = N_CTX // BLOCK_N
    m_i = gl.full([ROWS], float("-inf"), gl.float32, s_rows)
    l_i = gl.full([ROWS], 0.0, gl.float32, s_rows)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    zeros_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        # turn 0: scores of block 0 alone
        mbarrier.wait(kv_ready.index(0), 0)
        _take_turn(turns, 0, ME, PINGPONG)
        qk = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        _pass_turn(turns, ME, PINGPONG)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
        m_i = gl.max(qk, axis=1) * qk_scale
        p = gl.exp2(qk * qk_scale - m_i[:, None])
        l_i = gl.sum(p, axis=1)
        for j in range(1, n_blocks):
            stage = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(kv_ready.index(stage), (j // STAGES) & 1)
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
            _take_turn(turns, j, ME, PINGPONG)
            qk = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            acc = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
            _pass_turn(turns, ME, PINGPONG)
            qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk,))
            p, alpha, m_i, l_i = _online_softmax(qk, m_i, l_i, qk_scale)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        last = (n_blocks - 1) % STAGES
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)
        _take_turn(turns, n_blocks, ME, PINGPONG)
        acc = warpgroup_mma(p16, v_smem.index(last), acc, is_async=True)
        _pass_turn(turns, ME, PINGPONG)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(last), count=1)
    else:
        for j in range(n_blocks):
            stage = j % STAGES
            mbarrier.wait(kv_ready.index(stage), (j // STAGES) & 1)
            _take_turn(turns, j, ME, PINGPONG)
            qk = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            _pass_turn(turns, ME, PINGPONG)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
            p, alpha, m_i, l_i = _online_softmax(qk, m_i, l_i, qk_scale)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p16 = gl.convert_layout(p.to(gl.float16), p_layout)
            acc = warpgroup_mma(p16, v_smem.index(stage), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(stage), count=1)
        _take_turn(turns, n_blocks, ME, PINGPONG)   # keep the turn count equal to the overlapped form's
        _pass_turn(turns, ME, PINGPONG)

    # the output goes out through this consumer's own slice of Q, which no product reads any more
    out = acc / gl.convert_layout(l_i, o_rows)[:, None]
    q.store(out.to(gl.float16))
    fence_async_shared()
    row0 = gl.program_id(1) * N_CTX + gl.program_id(0) * (ROWS * CONSUMERS) + ME * ROWS
    tma.async_copy_shared_to_global(o_desc, [row0, 0], q)
    tma.store_wait(pendings=0)


@gluon.jit
def pingpong_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX,
                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                    PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    q_smem = gl.allocate_shared_memory(gl.float16, [ROWS * CONSUMERS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turns.index(i), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, N_CTX,
                     BLOCK_N, STAGES)),
        (_consumer, (o_desc, q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turns, qk_scale, N_CTX,
                     BLOCK_N, HEAD_DIM, STAGES, gl.constexpr(0), PINGPONG, OVERLAP)),
        (_consumer, (o_desc, q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turns, qk_scale, N_CTX,
                     BLOCK_N, HEAD_DIM, STAGES, gl.constexpr(1), PINGPONG, OVERLAP)),
    ], [4, 4], [240, 240])


def pingpong_attention(q, k, v, pingpong=True, overlap=True, block_n=128, stages=2, maxnreg=168):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    rows, tile = ROWS.value, ROWS.value * CONSUMERS.value
    descs = descriptors((q, k, v, o), ([tile, D], [block_n, D], [block_n, D], [rows, D]))
    grid = (N // tile, B * H)
    pingpong_kernel[grid](*descs, LOG2E / math.sqrt(D), N, BLOCK_N=block_n, HEAD_DIM=D, STAGES=stages,
                          PINGPONG=int(pingpong), OVERLAP=int(overlap), num_warps=4, maxnreg=maxnreg)
    return o


def main() -> None:
    from gluon_prefill import compare, gluon_attention

    def variants(q, k, v):
        out = {"gluon_serial_n128_s3": lambda: gluon_attention(q, k, v, False, block_n=128, stages=3)}
        for pingpong in (0, 1):
            for overlap in (0, 1):
                for stages in (2, 3):
                    out[f"ws_pp{pingpong}_ov{overlap}_s{stages}"] = (
                        lambda pingpong=pingpong, overlap=overlap, stages=stages:
                        pingpong_attention(q, k, v, pingpong, overlap, stages=stages))
        return out
    compare(variants)

if __name__ == "__main__":
    main()
