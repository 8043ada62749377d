"""The default tunables a generated module starts from (block sizes, warps, pipeline stages), on the GPU and
under the interpreter, with the measurements that chose them; tuning replaces them per GPU and shape."""
from __future__ import annotations

from neptune_eqsat.plan.schedule import Schedule


GPU_CONFIG = {"num_warps": 8, "num_stages": 3}   # measured best of a small sweep on an H100 (bench/tools/sweep_configs.py)


INTERPRETER_CONFIG = {"num_warps": 1, "num_stages": 1}


# the warp-specialized Gluon kernel (gluon.py) of plans that have one: 3 stages of key blocks of 128 were the
# fastest of a sweep on an H100 (bench/experiments/2026-11-22-gluon-prefill/gluon_pingpong.py: global prefill 1.00x cuDNN at S 4096, 1.03x at 16384)
# WS_OUT_BUF 1: the output leaves through a shared buffer of its own, so the next tile's A is copied once this
# tile's last A B^T is done, with as many of WS_STAGES as fit beside it (2 of 128 keys; see gluon.py)
GLUON_CONFIG = {"BACKEND": "gluon", "WS_BLOCK_J": 128, "WS_STAGES": 3, "WS_PERSISTENT": 0, "WS_OUT_BUF": 0}


# a kernel whose tiles hold only rows and a block of the loop axis (softmax, a norm, cross-entropy: no matrix
# product) streams its rows: one row per program fills the GPU, and long loop blocks keep the loads wide. On an
# H100 (bench/suite/rows.py --sweep) this ran softmax over 4096 x 32768 in 0.55 ms against 1.30 with 128-row tiles,
# LayerNorm over 8192 x 4096 in 0.055 against 0.17, cross-entropy over a 128k vocabulary in 0.72 against 2.4.
VECTOR_ROWS_CONFIG = {"num_warps": 4, "num_stages": 3, "row": 1, "loop": 2048}


# a kernel with no reduction at all (the last of a staged plan: each element from its inputs and the stages)
# writes long rows: wide blocks of them per program, so that each program moves kilobytes, not a few hundred bytes
ELEMENTWISE_CONFIG = {"num_warps": 4, "num_stages": 1, "row": 2048}


# a loop whose blocks each hold a matrix product with a K loop of its own (logits h W^T under a log-sum-exp over
# the vocabulary): 128 x 256 output tiles in K steps of 64, as a matrix multiplication's best (see module.py)
CONTRACTION_LOOP_BLOCK = 256


def elementwise_rows(sched: Schedule) -> bool:
    return bool(sched.row) and not sched.loop and not sched.inner and sched.col is None


def whole_row_lines(block: str, length: str) -> list[str]:
    """Launcher lines for a loop block left 0: a row of up to 32768 elements in one block (read once; the output
    pass finds it in cache), with warps to hold it; longer rows in blocks of 2048. On an H100 LayerNorm over
    4096 x 16384 ran 0.098 ms this way against 0.141 in blocks of 2048, softmax over 4096 x 32768 0.373 against
    0.554 (bench/suite/rows.py --sweep)."""
    return [f"    if cfg[{block!r}] == 0:",
            f"        cfg[{block!r}] = triton.next_power_of_2({length}) if {length} <= 32768 else 2048",
            f"        cfg['num_warps'] = 4 if cfg[{block!r}] <= 4096 else 8 if cfg[{block!r}] <= 16384 else 16"]


# a loop carrying two or more states as wide as a tile's column (dK and dV of attention's backward, each 128 x
# 128 in fp32): 128 x 128 blocks spilled registers on an H200, 64 query rows per step ran the causal backward at
# 16384 in 17.9 ms against 25.4 (bench/results/h200/2026-11-26-backward-configs); with one row statistic per
# step (staging.py), 3 stages beat 2 on an H100 at 4096 (global 1.77 against 2.01 ms, causal 1.05 / 1.12, GQA
# 2.13 / 2.26) and at 16384 for causal and GQA (13.5 / 14.2, 27.2 / 28.7 ms; global 31.3 / 30.4)
# (bench/results/h100/2026-11-27-backward-row-statistics)
WIDE_STATES_CONFIG = {"loop": 64, "num_stages": 3}


def wide_states(sched: Schedule) -> int:
    """The loop's states that hold a whole column tile (64 or more elements wide) per row."""
    def width(r) -> int:
        n = 1
        for a in r.free & ({sched.col} | set(sched.inner)):
            n *= sched.extent(a)
        return n
    return sum(1 for r in sched.reductions if width(r) >= 64)


def default_blocks(sched: Schedule) -> tuple[dict, dict]:
    gpu, cpu = dict(GPU_CONFIG), dict(INTERPRETER_CONFIG)
    row_block, loop_block = 128, 128
    if wide_states(sched) >= 2:
        loop_block = WIDE_STATES_CONFIG["loop"]
        gpu["num_stages"] = WIDE_STATES_CONFIG["num_stages"]
    if sched.streams_rows:
        gpu.update(num_warps=VECTOR_ROWS_CONFIG["num_warps"], num_stages=VECTOR_ROWS_CONFIG["num_stages"])
        row_block, loop_block = VECTOR_ROWS_CONFIG["row"], VECTOR_ROWS_CONFIG["loop"]
    if elementwise_rows(sched):
        gpu.update(num_warps=ELEMENTWISE_CONFIG["num_warps"], num_stages=ELEMENTWISE_CONFIG["num_stages"])
        row_block = ELEMENTWISE_CONFIG["row"]
    if sched.chunked and sched.loop:
        loop_block = CONTRACTION_LOOP_BLOCK
    if sched.row:
        gpu[f"BLOCK_{sched.row.upper()}"] = row_block
        cpu[f"BLOCK_{sched.row.upper()}"] = 16
    if sched.loop:
        gpu[f"BLOCK_{sched.loop.upper()}"] = loop_block
        cpu[f"BLOCK_{sched.loop.upper()}"] = 16
    for a in sched.chunked:   # the depth of each step of a long contraction (a matrix product's K loop)
        gpu[f"BLOCK_{a.upper()}"] = 64
        cpu[f"BLOCK_{a.upper()}"] = 16
    return gpu, cpu


SPLIT_KEYS = ("CHUNKS", "COMBINE")   # config entries that are not kernel arguments


# the combine kernel reduces over few chunks and holds no matrix tile: small row blocks
COMBINE_GPU = {"num_warps": 4, "num_stages": 1}


COMBINE_CPU = {"num_warps": 1, "num_stages": 1}


def quick_config(gpu: dict) -> dict:
    """QUICK: what a first call changes in CONFIG to run kernels that compile fast and whose compile no length
    or mask data changes (each entry below says which)."""
    quick = {"ONE_LOOP": 1} if "ONE_LOOP" in gpu else {}
    # tiles of matrix products at half the side, in 4 warps: a smaller kernel for LLVM and ptxas
    quick.update({k: v // 2 for k, v in gpu.items() if k.startswith("BLOCK_") and 64 <= v <= 256})
    # a loop block the launcher would size to the row (0, defaults.whole_row_lines): fixed, so that a new row
    # length compiles nothing
    quick.update({k: VECTOR_ROWS_CONFIG["loop"] for k, v in gpu.items() if k.startswith("BLOCK_") and v == 0})
    if any(k.startswith("BLOCK_") for k in quick):
        quick["num_warps"] = 4
    # no software pipelining (a third less to compile), no bound tests dropped for lengths that are a multiple of
    # the block (EVEN_*) and a fixed row order: nothing the kernel is compiled for depends on the call
    quick["num_stages"] = 1
    quick.update({k: 0 for k in gpu if k.startswith("EVEN_")})
    if "USE_TMA" in gpu:   # loads through pointers: the launcher, built while the kernel compiles, then fits it
        quick["USE_TMA"] = 0
    if "ROW_ORDER" in gpu:
        quick["ROW_ORDER"] = gpu["ROW_ORDER"]
    if "COMBINE" in gpu:
        quick["COMBINE"] = {"in_kernel": 0, **({"ONE_LOOP": 1} if "ONE_LOOP" in gpu["COMBINE"] else {})}
    if "BACKEND" in gpu:
        quick["BACKEND"] = "triton"
    return quick
