"""Where does grouped-query decode lose time against a copy of its bytes? Builds variants of the generated
gqa_dc module by editing its kernel source, and times them beside cuDNN and a copy of the same bytes, under
do_bench (the L2 cache starts full of dirty lines) and with a clean flush:

    emitted        the module as generated
    nocombine      no program combines (the output is not written): the cost of the combine at the end
    prefetch       the unmasked key loop loads the next block's K and V into registers before this block's
                   products (a register double buffer)
    vearly         V is loaded with K at the top of the block, not after the scores
    interleave     chunk c takes key blocks c, c + chunks, c + 2 chunks, ... instead of one run of blocks, so
                   programs running together read neighbouring blocks
    dynamic        the programs of a kv head take its key blocks one at a time from a counter (an atomic add),
                   so a program that runs fast takes more blocks: the split is balanced as it runs
    read_chunks    not attention: the same programs (kv head x chunk) only read their K and V blocks, with the
                   same loads, and sum them: what the grid and its loads can reach with no work per block
    read_interleave, read_dynamic  not attention: read_chunks with the block orders of interleave and dynamic
    read_flat      not attention: K and V read as two flat arrays in blocks of 16-128 KB (read-once hint): a
                   read-only ceiling for these bytes

    PYTHONPATH=. python bench/experiments/2026-11-22-gqa-decode-time/gqa_decode_variants.py
                                        [--kv 32768] [--rounds 3] [--variants emitted,nocombine,...]
                                        [--grid stream|descriptors|big|small|tuned] [--reads]
                                        [--combines default,rows8_chunks32,...]

Every variant that writes the output is compared with float64 first. Imports only torch and triton.
"""
import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.common import FLUSH_BYTES, GENERATED, cudnn_attention, load, time_in_rounds
from bench.suite.attention import COPY_ROW, read_only, same_bytes_copy

UNCHECKED = (COPY_ROW, "nocombine", "read_chunks", "read_flat", "read_interleave", "read_dynamic")   # no output
K_LOAD = ('tl.load(k_ptr + b * k_s0 + h_group * k_s1 + offs_j[None, :] * k_s2 + offs_d[:, None] * k_s3, '
          'eviction_policy="evict_first" if STREAM else "")')
V_LOAD = ('tl.load(v_ptr + b * v_s0 + h_group * v_s1 + offs_j[:, None] * v_s2 + offs_e[None, :] * v_s3, '
          'eviction_policy="evict_first" if STREAM else "")')
FULL_LOOP = "    for start in range(full_lo, full_hi, BLOCK_J):\n        offs_j = start + tl.arange(0, BLOCK_J)\n"
CHUNK_RANGE = "    chunk_lo = pid_chunk * chunk_len\n    chunk_hi = tl.minimum(chunk_lo + chunk_len, SKV)\n"
EDGE_LOOPS = {   # the masked loops before and after the unmasked one -> the same run by chunk 0 only
    "    for start in range(lo, full_lo, BLOCK_J):\n":
        "    for start in range(lo, tl.where(pid_chunk == 0, full_lo, lo), BLOCK_J):\n",
    "    for start in range(full_hi, hi, BLOCK_J):\n":
        "    for start in range(full_hi, tl.where(pid_chunk == 0, hi, full_hi), BLOCK_J):\n"}
GRAB_OFFSET = 512   # the dynamic variant's block counters sit past the tiles' tickets in the same zeroed buffer
GRIDS = {   # (BLOCK_J, num_warps, chunks per kv head, descriptor loads, stages)
    "stream": [(128, w, c, 0, 1) for w, c in itertools.product((8, 4), (32, 16, 64))],
    "descriptors": list(itertools.product((128, 64), (4, 8), (32, 64, 128), (1,), (1, 2))),
    "big": [(bj, w, c, 0, 1) for bj, w, c in itertools.product((256, 128), (8, 16), (16, 32))],
    "small": [(64, w, c, 0, 1) for w, c in itertools.product((8, 4), (32, 64))],
    "tuned": [(128, 8, 32, 0, 1)],
}
COMBINES = {   # --combines: how the last chunk program of a kv head combines the partials (rows x chunks a step)
    "default": None,
    "rows8_chunks32": dict(in_kernel=1, BLOCK_I_H=8, BLOCK_J_CHUNK=32),
    "rows4_chunks32": dict(in_kernel=1, BLOCK_I_H=4, BLOCK_J_CHUNK=32),
    "rows8_chunks8": dict(in_kernel=1, BLOCK_I_H=8, BLOCK_J_CHUNK=8),
    "rows2_chunks32": dict(in_kernel=1, BLOCK_I_H=2, BLOCK_J_CHUNK=32),
    "second_kernel": dict(in_kernel=0, num_warps=4, num_stages=1, BLOCK_I_H=8, BLOCK_J_CHUNK=16),
}


@triton.jit
def _kv_block_sum(k_ptr, v_ptr, h, start, S, BLOCK_J: tl.constexpr, D: tl.constexpr):
    """K and V of kv head h, keys start.. start + BLOCK_J, loaded once (read-once hint) and added in fp32."""
    rows = h * S * D + (start + tl.arange(0, BLOCK_J))[:, None] * D + tl.arange(0, D)[None, :]
    return (tl.load(k_ptr + rows, eviction_policy="evict_first").to(tl.float32)
            + tl.load(v_ptr + rows, eviction_policy="evict_first").to(tl.float32))


@triton.jit
def read_chunks_kernel(k_ptr, v_ptr, out_ptr, S, CHUNK, BLOCK_J: tl.constexpr, D: tl.constexpr):
    h, c = tl.program_id(0), tl.program_id(1)
    total = tl.zeros([BLOCK_J, D], dtype=tl.float32)
    for start in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, S), BLOCK_J):
        total += _kv_block_sum(k_ptr, v_ptr, h, start, S, BLOCK_J, D)
    tl.store(out_ptr + h * tl.num_programs(1) + c, tl.sum(total))


@triton.jit
def read_ordered_kernel(k_ptr, v_ptr, out_ptr, grab_ptr, S, BLOCK_J: tl.constexpr, D: tl.constexpr,
                        DYNAMIC: tl.constexpr):
    """read_chunks with chunk c reading blocks c, c + chunks, ... (DYNAMIC 0) or taking the next block of its
    head from a counter (DYNAMIC 1; the last program of a head to finish zeroes the head's two counters)."""
    h, c, chunks = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    n_blocks = S // BLOCK_J
    total = tl.zeros([BLOCK_J, D], dtype=tl.float32)
    if DYNAMIC:
        blk = tl.atomic_add(grab_ptr + h, 1)
        while blk < n_blocks:
            nxt = tl.atomic_add(grab_ptr + h, 1)   # in flight while this block loads
            total += _kv_block_sum(k_ptr, v_ptr, h, blk * BLOCK_J, S, BLOCK_J, D)
            blk = nxt
        if tl.atomic_add(grab_ptr + tl.num_programs(0) + h, 1) == chunks - 1:
            tl.store(grab_ptr + h, 0)
            tl.store(grab_ptr + tl.num_programs(0) + h, 0)
    else:
        for blk in range(c, n_blocks, chunks):
            total += _kv_block_sum(k_ptr, v_ptr, h, blk * BLOCK_J, S, BLOCK_J, D)
    tl.store(out_ptr + h * chunks + c, tl.sum(total))


def read_systems(k, v) -> dict:
    """Read-only kernels over K and V (see the module docstring), keyed by their row names."""
    heads, S, D = k.shape[1], k.shape[2], k.shape[3]
    chunk_counts = (32, 64, 128, 256)
    sums = torch.empty(heads * max(chunk_counts), device=k.device)   # one per program
    grab = torch.zeros(2 * heads, device=k.device, dtype=torch.int32)
    systems = {}
    for w, chunks in itertools.product((4, 8), chunk_counts):
        chunk = -(-S // chunks)
        systems[f"read_chunks BJ=128 w={w} chunks={chunks}"] = (
            lambda w=w, chunks=chunks, chunk=chunk: read_chunks_kernel[(heads, chunks)](
                k, v, sums, S, chunk, BLOCK_J=128, D=D, num_warps=w, num_stages=1))
    for (name, dynamic), w, chunks in itertools.product((("read_interleave", 0), ("read_dynamic", 1)), (4, 8),
                                                        (32, 64)):
        systems[f"{name} BJ=128 w={w} chunks={chunks}"] = (
            lambda w=w, chunks=chunks, dynamic=dynamic: read_ordered_kernel[(heads, chunks)](
                k, v, sums, grab, S, BLOCK_J=128, D=D, DYNAMIC=dynamic, num_warps=w, num_stages=1))
    for kb, w in ((16, 4), (64, 8), (128, 16)):   # KB per program per tensor
        systems[f"read_flat {kb} KB blocks w={w}"] = read_only(k, v, block=kb * 512, num_warps=w)
    return systems


def _edit(src: str, variant: str) -> str:
    """The module source with one kernel edit; the edits address the emitted lines of the unmasked loop."""
    k_var, v_var = (next(ln.split(" = ")[0].strip() for ln in src.splitlines() if ln.strip().endswith(" = " + x))
                    for x in (K_LOAD, V_LOAD))
    if variant in ("interleave", "dynamic"):   # every program spans the whole key range; edge blocks: chunk 0
        src = src.replace(CHUNK_RANGE, "    chunk_lo = 0\n    chunk_hi = SKV\n")
        for loop, chunk0_only in EDGE_LOOPS.items():
            src = src.replace(loop, chunk0_only)
    if variant == "interleave":
        strided = "range(full_lo + pid_chunk * BLOCK_J, full_hi, tl.num_programs(2) * BLOCK_J)"
        return src.replace(FULL_LOOP, FULL_LOOP.replace("range(full_lo, full_hi, BLOCK_J)", strided))
    if variant == "dynamic":
        grab = f"tickets_ptr + {GRAB_OFFSET} + pid_grid * tl.num_programs(0) + pid_row"
        src = src.replace(FULL_LOOP, (
            f"    blk = tl.atomic_add({grab}, 1)\n    n_full = (full_hi - full_lo) // BLOCK_J\n"
            f"    while blk < n_full:\n        nxt = tl.atomic_add({grab}, 1)\n"
            "        start = full_lo + blk * BLOCK_J\n        offs_j = start + tl.arange(0, BLOCK_J)\n"))
        last_loop = list(EDGE_LOOPS.values())[1]
        src = src.replace(last_loop, "        blk = nxt\n" + last_loop, 1)
        reset = "            tl.store(ticket, 0)\n"
        return src.replace(reset, f"{reset}            tl.store({grab}, 0)\n")
    if variant == "nocombine":
        return src.replace("if tl.atomic_add(ticket, 1) == tl.num_programs(2) - 1:", "if tl.atomic_add(ticket, 1) < 0:")
    if variant == "vearly":
        src = src.replace(f"{v_var} = {V_LOAD}\n", f"{v_var} = v_early\n")
        return src.replace(f"{k_var} = {K_LOAD}\n", f"{k_var} = {K_LOAD}\n            v_early = {V_LOAD}\n")
    if variant == "prefetch":
        k_next, v_next = (x.replace(f"offs_j[{i}]", f"offs_n[{i}]").replace(", eviction", ", mask=more, other=0.0, eviction")
                          for x, i in ((K_LOAD, "None, :"), (V_LOAD, ":, None")))
        first = ("    offs_n = full_lo + tl.arange(0, BLOCK_J)\n    more = full_lo < full_hi\n"
                 f"    k_next = {k_next}\n    v_next = {v_next}\n")
        step = ("        k_this = k_next\n        v_this = v_next\n"
                "        offs_n = start + BLOCK_J + tl.arange(0, BLOCK_J)\n        more = start + BLOCK_J < full_hi\n"
                f"        k_next = {k_next}\n        v_next = {v_next}\n")
        src = src.replace(FULL_LOOP, first + FULL_LOOP + step)
        return src.replace(f"{k_var} = {K_LOAD}\n", f"{k_var} = k_this\n").replace(f"{v_var} = {V_LOAD}\n", f"{v_var} = v_this\n")
    return src


def _module(src: str, name: str, folder: Path):
    path = folder / f"gqa_dc_{name}.py"
    path.write_text(src)
    return load(path)

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="emitted,nocombine,prefetch,vearly")
    ap.add_argument("--grid", default="stream", choices=sorted(GRIDS))
    ap.add_argument("--reads", action="store_true", help="add the read-only kernels (read_chunks, read_flat)")
    ap.add_argument("--combines", default="default", help=f"combine configs, of {','.join(COMBINES)}")
    ap.add_argument("--module", default=str(GENERATED / "gqa_dc.py"))
    args = ap.parse_args()
    src = Path(args.module).read_text()
    assert src.count(K_LOAD) == 1 and src.count(V_LOAD) == 1 and src.count(FULL_LOOP) == 1, \
        "the module's unmasked loop is not the form these edits address (generate it again)"
    clean = torch.empty(FLUSH_BYTES // 2, device="cuda", dtype=torch.float16).normal_()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}")
    q = torch.randn(1, 64, 1, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 8, args.kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    nbytes = (2 * q.numel() + 2 * k.numel()) * 2
    systems = {COPY_ROW: same_bytes_copy(nbytes), "cudnn": lambda: cudnn_attention(q, k, v)}
    if args.reads:
        systems.update(read_systems(k, v))
    folder = Path(tempfile.mkdtemp())
    for variant in args.variants.split(","):
        mod = _module(_edit(src, variant), variant, folder)
        for (bj, w, c, tma, stages), combine in itertools.product(GRIDS[args.grid], args.combines.split(",")):
            cfg = dict(BLOCK_J=bj, num_warps=w, num_stages=stages, CHUNKS=c, STREAM=1, USE_TMA=tma)
            if COMBINES[combine]:
                cfg["COMBINE"] = COMBINES[combine]
            tag = (f"{variant} BJ={bj} w={w} chunks={c}" + (f" descriptors stages={stages}" if tma else "")
                   + ("" if combine == "default" else f" {combine}"))
            systems[tag] = lambda mod=mod, cfg=cfg: mod.forward(q, k, v, config=cfg)
    time_in_rounds(systems, clean, nbytes / 1e9, args.rounds, f"gqa_dc KV={args.kv}", want, width=52,
                   checked=lambda name: name.split()[0] not in UNCHECKED)


if __name__ == "__main__":
    sys.exit(main())
