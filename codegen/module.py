"""The generated module: one Triton kernel, its launcher `forward(...)` and the tunable defaults.

The module imports only torch, triton and the standard library.
"""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

from neptune_eqsat import ir
from neptune_eqsat.combine import combine_plan
from neptune_eqsat.cost import split_count
from neptune_eqsat.tune import GLUON_KEYS, bucket
from neptune_eqsat.schedule import Schedule

from . import blocks, masks
from .gluon import CONSUMERS, ROWS, GluonWriter, NotEligible, gluon_source
from .kernel import Context, KernelWriter, Val, grid_sizes, jit_decorator

GPU_CONFIG = {"num_warps": 8, "num_stages": 3}   # measured best of a small sweep on an H100 (bench/sweep_configs.py)
INTERPRETER_CONFIG = {"num_warps": 1, "num_stages": 1}
# the warp-specialized Gluon kernel (gluon.py) of plans that have one: 3 stages of key blocks of 128 were the
# fastest of a sweep on an H100 (bench/gluon_pingpong.py: global prefill 1.00x cuDNN at S 4096, 1.03x at 16384)
GLUON_CONFIG = {"BACKEND": "gluon", "WS_BLOCK_J": 128, "WS_STAGES": 3, "WS_PERSISTENT": 0}
GLUON_IMPORTS = """from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
"""
GLUON_ROWS = ROWS * CONSUMERS      # rows per program
GLUON_MAXNREG = 168                # 3 warpgroups: 240 registers for each consumer, 24 for the producer


# a kernel whose tiles hold only rows and a block of the loop axis (softmax, a norm, cross-entropy: no matrix
# product) streams its rows: one row per program fills the GPU, and long loop blocks keep the loads wide. On an
# H100 (bench/rows.py --sweep) this ran softmax over 4096 x 32768 in 0.55 ms against 1.30 with 128-row tiles,
# LayerNorm over 8192 x 4096 in 0.055 against 0.17, cross-entropy over a 128k vocabulary in 0.72 against 2.4.
VECTOR_ROWS_CONFIG = {"num_warps": 4, "num_stages": 3, "row": 1, "loop": 2048}


def vector_rows(sched: Schedule) -> bool:
    return bool(sched.row) and bool(sched.loop) and not sched.inner and sched.col is None


def whole_row_lines(block: str, length: str) -> list[str]:
    """Launcher lines for a loop block left 0: a row of up to 32768 elements in one block (read once; the output
    pass finds it in cache), with warps to hold it; longer rows in blocks of 2048. On an H100 LayerNorm over
    4096 x 16384 ran 0.098 ms this way against 0.141 in blocks of 2048, softmax over 4096 x 32768 0.373 against
    0.554 (bench/rows.py --sweep)."""
    return [f"    if cfg[{block!r}] == 0:",
            f"        cfg[{block!r}] = triton.next_power_of_2({length}) if {length} <= 32768 else 2048",
            f"        cfg['num_warps'] = 4 if cfg[{block!r}] <= 4096 else 8 if cfg[{block!r}] <= 16384 else 16"]


def _row_loop_blocks(sched: Schedule) -> tuple[dict, dict]:
    gpu, cpu = dict(GPU_CONFIG), dict(INTERPRETER_CONFIG)
    row_block, loop_block = 128, 128
    if vector_rows(sched):
        gpu.update(num_warps=VECTOR_ROWS_CONFIG["num_warps"], num_stages=VECTOR_ROWS_CONFIG["num_stages"])
        row_block, loop_block = VECTOR_ROWS_CONFIG["row"], VECTOR_ROWS_CONFIG["loop"]
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


def _bounds(w: KernelWriter, reds: list[ir.Term]):
    """Key-range bounds from the mask predicates the reductions use, or None."""
    used = {m for r in reds for m in masks.mask_wheres(r, w.loop)}
    preds = sorted({m.args[0] for m in used}, key=ir.show)
    if not preds or w.row is None:
        return None
    both = preds[0]
    for extra in preds[1:]:
        both = ir.bin("and", both, extra)
    name = (lambda k: k[1] if k[0] == "dim" or k[1] in w.s.grid else f"offs_{k[1]}")
    bounds = masks.key_bounds(both, w.row, w.loop, name, "i_lo", "i_hi", w.ext(w.loop))
    if bounds is not None and not (len(preds) == 1 and masks.skippable(reds, list(used), w.loop)):
        bounds.lo_any, bounds.hi_any, bounds.work_grows = "0", w.ext(w.loop), False
    return bounds


def _table(w: KernelWriter, p: int, reds: list[ir.Term]) -> blocks.BlockTable | None:
    """Pass p's classified mask (one table per predicate, shared by the passes that test it), or None."""
    pred = blocks.table_predicate(w, reds)
    if pred is None:
        return None
    if pred not in w.tables:
        n = len(w.tables)
        w.tables[pred] = blocks.BlockTable(pred, f"blocks{n}", f"_{w.name}_blocks{n}",
                                           tuple(g for g in w.s.grid if g in pred.free))
    return w.tables[pred]


def _pass_bounds(w: KernelWriter, p: int, reds: list[ir.Term]) -> list[str]:
    """Lines computing lo, full_lo, full_hi, hi for pass p (see masks.py)."""
    bj, n = w.block(w.loop), w.ext(w.loop)
    bounds = _bounds(w, reds)
    lines = []
    if bounds is None and any(masks.mask_wheres(r, w.loop) for r in reds):
        # a mask the bounds analysis cannot read (not linear in the row and loop axes): test it in every block
        lines += ["lo = 0", f"hi = {n}", "full_lo = 0", "full_hi = 0"]
    elif bounds is None:
        lines += ["lo = 0", f"hi = {n}", "full_lo = 0", f"full_hi = ({n} // {bj}) * {bj}"]
    else:
        lines += [f"lo = ({bounds.lo_any} // {bj}) * {bj}", f"hi = {bounds.hi_any}",
                  f"full_lo = tl.minimum(tl.maximum((({bounds.lo_all} + {bj} - 1) // {bj}) * {bj}, lo), hi)",
                  f"full_hi = tl.maximum(tl.minimum(({bounds.hi_all} // {bj}) * {bj}, hi), full_lo)"]
    if w.s.split:   # this program's chunk of the loop axis
        lines += ["lo = tl.maximum(lo, chunk_lo)", "hi = tl.minimum(hi, chunk_hi)",
                  "full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)",
                  "full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)"]
    return [f"{x}  # pass {p}" if i == 0 else x for i, x in enumerate(lines)]


def grid_index_lines(w: KernelWriter, sched: Schedule) -> list[str]:
    """The grid axes' indices from program axis 1 (pid_grid), the last grid axis varying fastest."""
    lines, rest = [], "pid_grid"
    for k, g in enumerate(reversed(sched.grid)):
        if k == len(sched.grid) - 1:
            lines.append(f"{g} = {rest}")
        else:
            lines += [f"{g} = {rest} % {w.ext(g)}", f"rest{k} = {rest} // {w.ext(g)}"]
            rest = f"rest{k}"
    return lines


def kernel_source(sched: Schedule, name: str, partials: list | None = None, *, combine: KernelWriter | None = None,
                  tile: bool = False) -> tuple[str, KernelWriter]:
    """The kernel of a schedule. With `partials` (a split plan's workspaces) it is the partial-results kernel:
    program axis 2 picks a chunk of the loop axis, and the split reductions' states are stored, not the output;
    with `combine` (the combine step's writer, emitted with tile=True) the last chunk program of each tile to
    finish also combines the tile's partials. With `tile` it is a function of (pid_row, pid_grid) that other
    kernels call, rather than a kernel."""
    w = KernelWriter(sched, name)
    w.tma = not tile   # a tile function takes no descriptors: the kernels that call it hold pointers only
    w.stream = bool(partials)
    spec, loop, row = sched.spec, sched.loop, sched.row
    head: list[str] = []
    first_table = _table(w, 0, sched.in_pass(0)) if row and loop and not tile and not partials else None
    if first_table is not None:
        # row blocks in the order the table lists them, most key blocks first: ROW_ORDER 1 runs one head after
        # another, each from its longest row block (a head's keys stay in cache), ROW_ORDER 2 starts every
        # head's longest first (balances better when there are few row blocks per head); 0 keeps the natural
        # order. On an H100, ROW_ORDER 2 was 5-20% slower than the natural order at S = 16384 for document
        # masks, and up to 30% faster at S = 4096 for global tokens (bench/masks.py)
        w.row_order = True
        order = blocks.order_code(first_table, w)
        head += ["if ROW_ORDER == 2:", "    pid_grid = tl.program_id(0)", f"    pid_row = {order.format(1)}",
                 "elif ROW_ORDER == 1:", "    pid_grid = tl.program_id(1)", f"    pid_row = {order.format(0)}",
                 "else:", "    pid_grid = tl.program_id(1)", "    pid_row = tl.program_id(0)"]
    elif row and not tile:
        b = _bounds(w, sched.reductions) if loop else None
        if b is not None and b.work_grows and not partials:
            # later row blocks see more keys: run the longest first, so the last wave is short (ROW_ORDER 1,
            # one head after another, keeps a head's keys in cache; ROW_ORDER 2 starts every head's longest
            # blocks first and balances better when there are few blocks per head)
            w.row_order = True
            head += ["if ROW_ORDER == 2:",
                     "    pid_row = tl.num_programs(1) - 1 - tl.program_id(1)",
                     "    pid_grid = tl.program_id(0)",
                     "elif ROW_ORDER == 1:",
                     "    pid_row = tl.num_programs(0) - 1 - tl.program_id(0)",
                     "    pid_grid = tl.program_id(1)",
                     "else:",
                     "    pid_row = tl.program_id(0)",
                     "    pid_grid = tl.program_id(1)"]
        elif b is not None and b.work_grows:
            head += ["pid_row = tl.num_programs(0) - 1 - tl.program_id(0)"]
        else:
            head += ["pid_row = tl.program_id(0)"]
    if not tile and not w.row_order and first_table is None:
        head += ["pid_grid = tl.program_id(1)"]
    head += grid_index_lines(w, sched)
    for a in w.tile_axes:
        if a == loop or a in w.chunked:   # a chunked axis's offsets are set in its own loop
            continue
        start = f"pid_row * {w.block(a)} + " if a == row else ""
        head.append(f"offs_{a} = {start}tl.arange(0, {w.block(a)})")
        if w.padded(a):
            head.append(f"valid_{a} = offs_{a} < {w.ext(a)}")
    if row:
        head += [f"i_lo = pid_row * {w.block(row)}", f"i_hi = tl.minimum(i_lo + {w.block(row)}, {w.ext(row)}) - 1"]
    if partials:
        head += ["pid_chunk = tl.program_id(2)", "chunk_lo = pid_chunk * chunk_len",
                 f"chunk_hi = tl.minimum(chunk_lo + chunk_len, {w.ext(loop)})"]

    body: list[str] = []
    done: set = set()
    even_used = False   # does a pass test EVEN_<loop> (listed masks, see below)
    for p in range(sched.passes):
        reds = sched.in_pass(p)
        w.ctx = Context(f"body{p}", f"pre{p}", complete=set(done), running=set(reds))
        for r in reds:
            w.init_state(r, f"init{p}")
        table = _table(w, p, reds)
        even = f"EVEN_{loop.upper()}" if table is not None and not partials else None
        even_used = even_used or even is not None
        loops = []
        for masked in (True, False):
            blk = f"body{p}{'m' if masked else 'u'}"
            w.ctx.body, w.ctx.masked = blk, masked
            w.blocks[blk] += [f"offs_{loop} = start + tl.arange(0, {w.block(loop)})"]
            if masked and even:
                # a listed partial block runs past the keys' end only when their count is not a multiple of
                # the block: otherwise every lane is valid, and the bound tests fold away
                w.blocks[blk] += [f"if {even}:", f"    valid_{loop} = tl.full([{w.block(loop)}], 1, tl.int1)",
                                  "else:", f"    valid_{loop} = offs_{loop} < {w.ext(loop)}"]
            elif masked:
                w.blocks[blk] += [f"valid_{loop} = offs_{loop} < {w.ext(loop)}"]
            head_lines = len(w.blocks[blk])
            for r in reds:
                w.update(r)
            used = " ".join(w.blocks[blk])
            prevs = [f"{w.state[r].code}_prev = {w.state[r].code}" for r in reds if f"{w.state[r].code}_prev" in used]
            w.blocks[blk][head_lines:head_lines] = prevs   # the states as they were when the block began
            loops.append(w.blocks[blk])
        loop_lines = []
        if table is not None:   # the row block's lists of partial and full key blocks (blocks.py)
            bounds, partial, full = blocks.kernel_lines(table, w)
            for header, lines in ((partial, loops[0]), (full, loops[1])):
                loop_lines += header + ["    " + x for x in lines]
        else:
            bounds = _pass_bounds(w, p, reds)
            for lo, hi, lines in (("lo", "full_lo", loops[0]), ("full_lo", "full_hi", loops[1]),
                                  ("full_hi", "hi", loops[0])):
                loop_lines.append(f"for start in range({lo}, {hi}, {w.block(loop)}):")
                loop_lines += ["    " + x for x in lines]
        body += [f"# pass {p} over {loop}: " + ", ".join(ir.show(r)[:60] for r in reds)]
        body += ["__PRE%d__" % p] + w.blocks[f"init{p}"] + bounds + loop_lines
        done |= set(reds)

    out_axes = {"out": spec.output_index or spec.output_axes}
    if partials:
        body += ["# this chunk's partial results"] + _store_partials(w, partials)
        out_axes = {**{p.name: ("chunk",) + p.axes for p in partials}, **(out_axes if combine else {})}
    else:
        body += _store_output(w, sched, done)
    text = "\n".join(body)
    for p in range(sched.passes):
        text = text.replace("__PRE%d__" % p, "\n".join(w.blocks[f"pre{p}"]) or "pass")
    inputs = list(spec.inputs)
    params = [f"{n}_ptr" for n in inputs + list(out_axes)]
    for n in inputs:
        params += [f"{n}_s{k}" for k in range(len(spec.inputs[n].shape))]
    for n, axes in out_axes.items():
        params += [f"{n}_s{k}" for k in range(len(axes))]
    params += [param for param, _, _ in w.descriptors.values()]
    params += [f"{t.param}_ptr" for t in w.tables.values()]
    params += w.dims + (["chunk_len"] if partials else [])
    w.constexprs = [f"BLOCK_{a.upper()}" for a in (row, loop) if a] + [f"BLOCK_{a.upper()}" for a in sched.chunked]
    w.constexprs += ["USE_TMA"] if w.descriptors else []
    w.constexprs += ["ROW_ORDER"] if w.row_order else []
    w.constexprs += ["STREAM"] if w.streamed else []
    w.constexprs += ["F32_DOT"] if w.f32_dot else []
    w.constexprs += [f"EVEN_{loop.upper()}"] if even_used else []
    if combine is not None:
        params += [p for p in combine.params if p not in params] + ["tickets_ptr"]
        w.constexprs += [f"COMBINE_{c}" for c in combine.constexprs] + ["COMBINE_IN_KERNEL"]
        text += "\n" + "\n".join(_combine_in_kernel(w, combine))
    w.params = params
    consts = [f"{c}: tl.constexpr" for c in w.constexprs]
    sig = ",\n    ".join([", ".join(params[i:i + 6]) for i in range(0, len(params), 6)] + consts)
    code = "\n".join(head + w.blocks["prologue"]) + "\n" + text
    if tile:
        return (f"@triton.jit\ndef {name}_tile(\n    pid_row, pid_grid,\n    {sig},\n):\n"
                + textwrap.indent(code, "    ") + "\n"), w
    return f"{jit_decorator('triton', grid_sizes(w, params))}\ndef {name}_kernel(\n    {sig},\n):\n" + textwrap.indent(code, "    ") + "\n", w



def _combine_in_kernel(w: KernelWriter, cw: KernelWriter) -> list[str]:
    """The tail of the partial-results kernel: the last of a tile's chunk programs to finish combines the tile.
    Each program counts itself in on the tile's ticket (an atomic add, acquire-release at GPU scope, after a
    barrier so every thread's partial stores come first); the one that sees all others arrived resets the
    ticket for the next call and runs the combine over the tile's rows, in row blocks of the combine's size."""
    rows = f"BLOCK_{w.row.upper()}" if w.row else "1"
    sub = f"({rows} // COMBINE_BLOCK_{cw.row.upper()})" if cw.row else "1"
    args = ", ".join(cw.params + [f"COMBINE_{c}" for c in cw.constexprs])
    pid_row = "pid_row" if w.row else "0"
    call = [f"{cw.name}_tile({pid_row} * {sub} + part, pid_grid, {args})"]
    if cw.row:   # row blocks past the last row (a tile of 16 rows holding 8) are skipped, not run masked
        call = [f"if ({pid_row} * {sub} + part) * COMBINE_BLOCK_{cw.row.upper()} < {cw.ext(cw.row)}:",
                "    " + call[0]]
    return ["if COMBINE_IN_KERNEL:",
            "    tl.debug_barrier()",
            f"    ticket = tickets_ptr + pid_grid * tl.num_programs(0) + {pid_row}",
            "    if tl.atomic_add(ticket, 1) == tl.num_programs(2) - 1:",
            "        tl.store(ticket, 0)",
            f"        for part in tl.static_range({sub}):"] + ["            " + x for x in call]


def _store_partials(w: KernelWriter, partials: list) -> list[str]:
    lines = []
    for p in partials:
        st = w.state[p.reduction]
        ptr = " + ".join([f"{p.name}_ptr", f"pid_chunk * {p.name}_s0"] +
                         [f"{w.expand(w.emit(ir.axis(a)), st.axes)} * {p.name}_s{k + 1}" for k, a in enumerate(p.axes)])
        checks = [w.expand(Val(f"valid_{a}", (a,), "bool"), st.axes) for a in st.axes if w.padded(a)]
        lines.append(f"tl.store({ptr}, {st.code}{', mask=' + ' & '.join(checks) if checks else ''})")
    return lines


def _store_output(w: KernelWriter, sched: Schedule, done: set) -> list[str]:
    spec, loop = sched.spec, sched.loop
    body: list[str] = []
    out_tile = w.canon({a for a in spec.output_axes if a in w.tile_axes})
    w.ctx = Context("write" if sched.writes_loop else "epilogue", "pre_out" if sched.writes_loop else "epilogue",
                    complete=set(done), running=set())
    if sched.writes_loop:
        w.blocks["write"] += [f"offs_{loop} = start + tl.arange(0, {w.block(loop)})",
                              f"valid_{loop} = offs_{loop} < {w.ext(loop)}"]
    v = w.emit(sched.term)
    dt = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32", "f64": "tl.float64"}[spec.output_dtype]
    shape = ", ".join(w.block(a) for a in out_tile)
    value = w.expand(w.as_float(v), out_tile)
    if set(v.axes) != set(out_tile):
        value = f"({value} + tl.zeros([{shape}], tl.float32))"
    index = spec.output_index or tuple(ir.axis(a) for a in spec.output_axes)
    ptr = " + ".join(["out_ptr"] + [f"{w.expand(w.emit(x), out_tile)} * out_s{k}" for k, x in enumerate(index)])
    checks = [w.expand(type(v)(f"valid_{a}", (a,), "bool"), out_tile) for a in out_tile if w.padded(a)]
    store = f"tl.store({ptr}, {value}.to({dt}){', mask=' + ' & '.join(checks) if checks else ''})"
    blk = w.ctx.body
    found = w.descriptor_block("out", index, out_tile, transposable=False) if w.tma and not sched.writes_loop else None
    if found is None:
        w.blocks[blk].append(store)
    else:   # the copy engine where the launcher could build the descriptor, a pointer store otherwise
        param, coords, blocks, _ = found
        w.blocks[blk] += ["if USE_TMA:", f"    {param}.store([{', '.join(coords)}], {value}.to({dt}).reshape({', '.join(blocks)}))",
                          "else:", f"    {store}"]
    if sched.writes_loop:
        body += ["# write the output block by block"] + w.blocks["pre_out"]
        body += [f"for start in range(0, {w.ext(loop)}, {w.block(loop)}):"] + ["    " + x for x in w.blocks["write"]]
    else:
        body += ["# epilogue"] + w.blocks["epilogue"]
    return body


MODULE = '''"""{title}

Generated by neptune-eqsat from spec `{spec}`. Do not edit: regenerate with
    neptune-eqsat optimize {spec_file} -o {out_file}

Plan:
{plan}
"""
import functools
import math
import os
import weakref

import torch
import triton
import triton.language as tl
{gluon_imports}
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"   # read when the kernels are defined
# Triton's interpreter multiplies bf16 tiles wrongly, so there bf16 matrix products take fp32 operands
BF16_DOT = tl.constexpr(tl.float32 if _INTERPRETED else tl.bfloat16)
NAME = {name!r}
PLAN = {plan_one!r}
# Tunables: block sizes, warps and pipeline stages (GPU), and the small blocks used under the interpreter.
# F32_DOT (where a matrix product takes fp32 operands): "ieee" multiplies in full fp32, "tf32" on the tensor
# cores in TF32 (10-bit mantissa operands, fp32 accumulation), faster and less exact.
CONFIG = {gpu!r}
INTERPRETER_CONFIG = {cpu!r}
# Tunables measured best per GPU name and shape bucket (each size rounded up to a power of two); they replace
# CONFIG's for calls in that bucket on that GPU. A bucket a GPU was not measured at takes what was measured on
# TUNED_FOR, the GPU the module was made for.
TUNED = {tuned!r}
TUNED_FOR = {tuned_for!r}
# Inputs of forward in order: name -> (dtype, shape); a str in a shape is a size given at run time.
INPUTS = {inputs_table!r}


{kernels}

{runtime}

{helpers}
def _tuned_config(gpu_name, shape_bucket):
    """The tunables measured best on this GPU for this shape bucket, else those measured on TUNED_FOR."""
    table = TUNED.get(gpu_name, {{}})
    return table[shape_bucket] if shape_bucket in table else TUNED.get(TUNED_FOR, {{}}).get(shape_bucket, {{}})


def forward({args}, *, config=None):
    """{doc}"""
    if isinstance({first}, torch.Tensor) and {first}.is_cuda:   # a call like an earlier one (inputs' signature, config) replays its launches
        key = _signature({args}) if config is None else (_signature({args}), repr(config))
        replay = _REPLAYS.get(key)
        if replay is not None:
            return replay({args})
    sizes = {{}}
{binds}
    device = {first}.device
    if device.type == "cpu" and not _INTERPRETED:
        raise RuntimeError("CPU tensors run under Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    cfg = dict(INTERPRETER_CONFIG if device.type == "cpu" else CONFIG)
    if device.type == "cuda":
        cfg.update(_tuned_config(_gpu_name(device), bucket(sizes)))
    cfg.update(config or {{}})
    rec = _Recording(({args},)) if device.type == "cuda" and _replay_enabled() else None
{dims}
{launch}
    if rec is not None:
        _REPLAYS[key] = rec.replay(device, out)
    return out
'''

TORCH_DTYPE = {"f16": "torch.float16", "bf16": "torch.bfloat16", "f32": "torch.float32", "f64": "torch.float64"}
SPLIT_KEYS = ("CHUNKS", "COMBINE")   # config entries that are not kernel arguments
# the combine kernel reduces over few chunks and holds no matrix tile: small row blocks
COMBINE_GPU = {"num_warps": 4, "num_stages": 1}
COMBINE_CPU = {"num_warps": 1, "num_stages": 1}


def _f32_dot_default(w: KernelWriter, gpu: dict, cpu: dict) -> None:
    """Matrix products of fp32 operands multiply in full fp32 unless the config asks for TF32."""
    if w.f32_dot:
        gpu["F32_DOT"] = cpu["F32_DOT"] = "ieee"


def _grid(w: KernelWriter, sched: Schedule, cfg: str) -> tuple[str, str]:
    rows = f"-(-{w.ext(sched.row)} // {cfg}['BLOCK_{sched.row.upper()}'])" if sched.row else "1"
    return rows, " * ".join([w.ext(g) for g in sched.grid]) or "1"


def _call_args(params: list[str]) -> str:
    """The launcher's argument list for a kernel's parameters: tensors for X_ptr, their strides, then sizes."""
    args = []
    for p in params:
        stem, _, k = p.rpartition("_s")
        if p.endswith("_ptr"):
            args.append(p[:-4])
        elif stem and k.isdigit():
            if k == "0":
                args.append(f"*{stem}.stride()")
        else:
            args.append(p)
    return ", ".join(args)


def _launch(w: KernelWriter, grid: str, cfg: str) -> list[str]:
    blocks = [f"{cfg}[{b!r}]" for b in w.constexprs]
    consts = ", ".join(blocks) + ("," if len(blocks) == 1 else "")
    return [f"    _launch(rec, {w.name}_kernel, ({grid}), (", f"        {_call_args(w.params)},",
            f"    ), {cfg}, ({consts}))"]


def _descriptor_lines(w: KernelWriter, cfg: str) -> list[str]:
    """Launcher lines building the kernel's tensor descriptors; where any cannot be built (layout, Triton, GPU)
    every load and store falls back to pointers."""
    if not w.descriptors:
        return []
    names = [param for param, _, _ in w.descriptors.values()]
    lines = []
    for param, tensor, shape in w.descriptors.values():
        block = ", ".join(f"{cfg}[{b!r}]" if b.startswith("BLOCK_") else b for b in shape)
        lines.append(f"    {param} = _descriptor({tensor}, [{block}]) if {cfg}['USE_TMA'] else None")
    lines += [f"    if None in ({', '.join(names)},):",
              f"        {' = '.join(names)} = None",
              f"        {cfg}['USE_TMA'] = 0"]
    return lines


def _gluon_launch(w: GluonWriter, sched: Schedule) -> list[str]:
    """Launcher lines running the Gluon kernel when the config asks for it on a Hopper GPU and every descriptor
    can be built; they open an if whose else runs the Triton kernel."""
    sizes = {"BLOCK_I": str(GLUON_ROWS), "BLOCK_J": "cfg['WS_BLOCK_J']"}
    lines = ["    gluon_descs = (None,)",
             "    if cfg.get('BACKEND') == 'gluon' and device.type == 'cuda' and _hopper(device):"]
    names = []
    for param, tensor, shape in list(w.descriptors.values()) + [("out_desc", "out", w.out_block)]:
        block = ", ".join(sizes.get(b, b) for b in shape)
        lines.append(f"        {param} = _gluon_descriptor({tensor}, [{block}])")
        names.append(param)
    lines += [f"        gluon_descs = ({', '.join(names)},)",
              "    if None not in gluon_descs:",
              "        gluon_cfg = {'BLOCK_I': %d, 'BLOCK_J': cfg['WS_BLOCK_J'], 'STAGES': cfg['WS_STAGES'], %s"
              "'num_warps': 4, 'maxnreg': %d}" % (GLUON_ROWS, "'ORDER': cfg['WS_ORDER'], " if "ORDER" in w.constexprs
                                                  else "", GLUON_MAXNREG),
              f"        tiles = -(-{w.ext(sched.row)} // {GLUON_ROWS}) * {' * '.join(w.ext(g) for g in sched.grid) or '1'}",
              "        programs = min(tiles, _sm_count(device)) if cfg['WS_PERSISTENT'] else tiles",
              f"        _launch(rec, {w.name}_gluon_kernel, (max(programs, 1),), (",
              f"            {_call_args(w.params)},",
              "        ), gluon_cfg, (%s,))" % ", ".join(f"gluon_cfg[{c!r}]" for c in w.constexprs)]
    return lines


def module_source(sched: Schedule, name: str, plan: str, spec_file: str = "SPEC.py", out_file: str = "OUT.py",
                  tuned: dict | None = None, by_gpu: dict[str, dict[str, dict]] | None = None,
                  tuned_for: str = "") -> str:
    """The module's source; `tuned` (a measured config) replaces the default GPU tunables it names, and
    `by_gpu` (GPU name -> shape bucket -> measured config) those of calls on that GPU whose sizes fall in a
    bucket; a bucket not measured on the GPU of a call takes the config measured on `tuned_for`."""
    spec = sched.spec
    inputs = list(spec.inputs)
    shape = spec.output_shape or [spec.extent(a) for a in spec.output_axes]
    out_alloc = (f"    out = _empty(rec, ({', '.join(str(e) if isinstance(e, int) else e.name for e in shape)},), "
                 f"{TORCH_DTYPE[spec.output_dtype]}, device)")
    gpu, cpu = _row_loop_blocks(sched)
    helpers = gluon_imports = ""
    if sched.split:
        kernels, w, launch, dims_used = _split_parts(sched, name, inputs, out_alloc, gpu, cpu)
        # the block lists are built before the partial-results kernel launches (after the output's allocation)
        at = launch.index(out_alloc)
        launch[at + 1:at + 1] = [blocks.builder_call(t, w, "kernel_cfg") for t in w.tables.values()]
        helpers = blocks.helpers_source(w) + (inspect.getsource(split_count) + "\n\n_chunk_counts = functools.lru_cache(maxsize=4096)(split_count)\n\n\n"
                   "def _program_slots(device):\n"
                   "    return _sm_count(device) if device.type == \"cuda\" else 4\n\n")
    else:
        kernel, w = kernel_source(sched, name)
        kernels, dims_used = kernel, w.dims
        _f32_dot_default(w, gpu, cpu)
        if w.descriptors:
            gpu["USE_TMA"] = cpu["USE_TMA"] = 1
        rows, rest = _grid(w, sched, "cfg")
        grid = f"{rows}, {rest}"
        if w.row_order:
            gpu["ROW_ORDER"] = cpu["ROW_ORDER"] = 1
            grid = f"({rest}, {rows}) if cfg['ROW_ORDER'] == 2 else ({rows}, {rest})"

        tables = list(w.tables.values())
        even = [c for c in w.constexprs if c.startswith("EVEN_")]
        if even:   # the launcher decides; a config may set it 0 to keep the bound tests
            gpu[even[0]] = cpu[even[0]] = 1
        order = []
        if tables:
            # two pipeline stages: on an H100 10-25% faster than three for masks whose blocks are mostly
            # partial (dilated windows, neighborhoods), within 2% elsewhere (bench/mask_configs.py)
            gpu["num_stages"] = 2
            if w.row_order:
                order = [f"    cfg['ROW_ORDER'] = _row_order({tables[0].param}_skewed, cfg, config)"]
        whole_row = []
        if vector_rows(sched):   # BLOCK 0: the launcher sizes the loop block to the row (whole_row_lines)
            gpu[f"BLOCK_{sched.loop.upper()}"] = 0
            whole_row = whole_row_lines(f"BLOCK_{sched.loop.upper()}", w.ext(sched.loop))
        launch = [out_alloc] + whole_row + [blocks.builder_call(t, w, "cfg") for t in tables] + order + \
            [f"    cfg[{c!r}] = int(bool(cfg[{c!r}]) and {w.ext(sched.loop)} % cfg['BLOCK_{sched.loop.upper()}'] == 0)"
             for c in even] + _descriptor_lines(w, "cfg") + _launch(w, grid, "cfg")
        helpers += blocks.helpers_source(w)
        try:
            gsrc, gw = gluon_source(sched, name)
        except NotEligible:
            pass
        else:   # the warp-specialized Hopper kernel, where it can run; the Triton kernel otherwise
            kernels += "\n\n" + gsrc
            gluon_imports = GLUON_IMPORTS
            dims_used = list(dict.fromkeys(dims_used + gw.dims))
            gpu.update(GLUON_CONFIG)
            if "ORDER" in gw.constexprs:
                gpu["WS_ORDER"] = 1
            cpu["BACKEND"] = "triton"   # the interpreter runs Triton kernels only
            launch = [out_alloc] + _gluon_launch(gw, sched) + [
                "    else:", f"        cfg = {{k: v for k, v in cfg.items() if k not in {('BACKEND',) + GLUON_KEYS!r}}}"] + [
                "    " + x for x in launch[1:]]

    def shape_code(shape) -> str:
        return "(" + "".join((repr(s) if isinstance(s, int) else repr(s.name)) + ", " for s in shape).strip() + ")"

    binds = "\n".join(f"    _bind(sizes, {n!r}, {n}, {shape_code(spec.inputs[n].shape)}, "
                      f"{TORCH_DTYPE[spec.inputs[n].dtype]}, {inputs[0]!r}, {inputs[0]})" for n in inputs)
    gpu.update({k: v for k, v in (tuned or {}).items() if k in gpu})
    tuned_table = {name: {b: {k: v for k, v in c.items() if k in gpu} for b, c in sorted(table.items())}
                   for name, table in sorted((by_gpu or {}).items())}
    inputs_table = {n: (TORCH_DTYPE[spec.inputs[n].dtype].split(".")[1],
                        tuple(e if isinstance(e, int) else e.name for e in spec.inputs[n].shape)) for n in inputs}
    derived = spec.derived
    bases = [derived[d][1] for d in dims_used if d in derived]
    dims_used = list(dict.fromkeys(list(dims_used) + bases))
    dims = "\n".join([f"    {d} = sizes[{d!r}]" for d in dims_used if d not in derived] +
                     [f"    {d} = {derived[d][0]} * {derived[d][1]}" for d in dims_used if d in derived])
    title = (spec.doc.splitlines() or [spec.name])[0]
    return MODULE.format(
        title=title, spec=spec.name, spec_file=spec_file, out_file=out_file,
        plan=textwrap.indent(plan, "    "), plan_one=plan, name=name, gpu=gpu, cpu=cpu, kernels=kernels,
        helpers=helpers + inspect.getsource(bucket) + "\n\n", runtime=_runtime_source(), tuned=tuned_table,
        tuned_for=tuned_for,
        gluon_imports=gluon_imports, inputs_table=inputs_table, args=", ".join(inputs), first=inputs[0], binds=binds, dims=dims or "    pass",
        launch="\n".join(launch), doc=f"{spec.name}: inputs {', '.join(inputs)}; returns {spec.output_name}.",
    )


def _runtime_source() -> str:
    """The launch helpers (launch.py) without their module header and imports."""
    text = (Path(__file__).parent / "launch.py").read_text()
    marker = "# ---- copied into every generated module from here on\n"
    return text[text.index(marker) + len(marker):].rstrip() + "\n"


def _split_parts(sched: Schedule, name: str, inputs: list[str], out_alloc: str, gpu: dict, cpu: dict):
    """Kernels and launch code of a split plan: partial results per chunk, combined by the last chunk program
    of each tile to finish (COMBINE["in_kernel"]), or by a second kernel."""
    comb = combine_plan(sched)
    cname = f"{name}_combine"
    tile_src, cw = kernel_source(comb.sched, cname, tile=True)
    part_src, w = kernel_source(sched, name, comb.partials, combine=cw)
    _f32_dot_default(w, gpu, cpu)
    wrapper = (f"{jit_decorator('triton', grid_sizes(cw, cw.params))}\ndef {cname}_kernel(\n    {', '.join(cw.params)},\n    "
               + ", ".join(f"{c}: tl.constexpr" for c in cw.constexprs) + ",\n):\n"
               + f"    {cname}_tile(tl.program_id(0), tl.program_id(1), {', '.join(cw.params + cw.constexprs)})\n")
    row, crow, chunks = f"BLOCK_{sched.row.upper()}", f"BLOCK_{comb.sched.row.upper()}", f"BLOCK_{comb.chunk_axis.upper()}"
    cgpu = {"in_kernel": 1, **COMBINE_GPU, crow: 8, chunks: 16}
    ccpu = {"in_kernel": 1, **COMBINE_CPU, crow: 2, chunks: 4}
    for a in comb.sched.chunked:   # a long reduction the combine finishes (a label's logit), in its own loop
        cgpu[f"BLOCK_{a.upper()}"], ccpu[f"BLOCK_{a.upper()}"] = 64, 16
    # few query rows: the smallest tile the matrix units take; a row at a time where there is no matrix product;
    # a long contraction inside the loop is a matrix multiplication's K loop: tiles as large as its best
    cpu[row] = 16
    gpu[row] = VECTOR_ROWS_CONFIG["row"] if vector_rows(sched) else 128 if sched.chunked else 16
    gpu.update(num_warps=4, CHUNKS=0, COMBINE=cgpu)
    cpu.update(CHUNKS=0, COMBINE=ccpu)
    if sched.chunked:
        # fused linear cross-entropy over 4096 x 131072 x 4096 on an H100: 9.8 ms in 128 x 128 tiles, 3 stages, 8
        # warps, against 40.8 in 16-row tiles read once (bench/rows.py --sweep)
        gpu.update(num_warps=8, num_stages=3, **({"STREAM": 0} if w.streamed else {}))
        cpu.update({"STREAM": 1} if w.streamed else {})
        gpu[f"BLOCK_{sched.loop.upper()}"] = 128
    elif w.streamed:
        # loads marked read-once and not pipelined (a pipelined load drops the mark), in key blocks of 128: on
        # an H100, grouped-query decode at KV 32k ran 59 us against 64 us pipelined, with the cache full of
        # dirty lines as after any kernel that wrote; as fast with a clean cache (bench/decode_variants.py)
        gpu.update(STREAM=1, num_stages=1)
        cpu["STREAM"] = 1
    elif not vector_rows(sched):
        gpu[f"BLOCK_{sched.loop.upper()}"] = 64   # short key blocks (best in a sweep on an H100)
    rows, rest = _grid(w, sched, "cfg")
    n, bj = w.ext(sched.loop), f"cfg['BLOCK_{sched.loop.upper()}']"
    slots = "_program_slots(device)"
    if w.streamed:   # without pipelining a program waits out each load: two programs per SM overlap their waits
        slots += " * (2 if cfg['STREAM'] and cfg['num_stages'] == 1 else 1)"
    launch = [f"    kernel_cfg = {{k: v for k, v in cfg.items() if k not in {SPLIT_KEYS!r}}}",
              f"    blocks = -(-{n} // {bj})",
              f"    chunks = cfg['CHUNKS'] or _chunk_counts({rows} * {rest}, blocks, {slots})",
              f"    chunk_len = max(-(-blocks // chunks), 1) * {bj}",
              f"    {comb.chunk_dim} = max(-(-{n} // chunk_len), 1)   # no empty chunks"]
    for p in comb.partials:
        shape = ", ".join([comb.chunk_dim] + [w.ext(a) for a in p.axes])
        launch.append(f"    {p.name} = _empty(rec, ({shape},), torch.float32, device)")
    launch += [out_alloc, "    combine_cfg = dict(cfg['COMBINE'])",
               "    in_kernel = combine_cfg.pop('in_kernel', 1)",
               f"    combine_cfg[{crow!r}] = min(combine_cfg[{crow!r}], cfg[{row!r}])   # whole row blocks of a tile",
               f"    tickets = _tickets(rec, device, ({rows}) * ({rest}))",
               "    kernel_cfg.update(COMBINE_IN_KERNEL=in_kernel, "
               + ", ".join(f"COMBINE_{c}=combine_cfg[{c!r}]" for c in cw.constexprs) + ")"]
    if w.descriptors:
        # off by default on the GPU: building a call's descriptors on the host cost more than the copy engine
        # saved in short decode kernels (H100: causal_dc at KV 4096, 40 us a call with pointers, 60-110 us
        # with descriptors; 29 us either way in a CUDA graph); tuning may turn it on
        gpu["USE_TMA"], cpu["USE_TMA"] = 0, 1
    launch += _descriptor_lines(w, "kernel_cfg") + _launch(w, f"{rows}, {rest}, {comb.chunk_dim}", "kernel_cfg")
    crows, crest = _grid(cw, comb.sched, "combine_cfg")
    launch += ["    if not in_kernel:"] + ["    " + x for x in _launch(cw, f"{crows}, {crest}", "combine_cfg")]
    dims = [d for d in dict.fromkeys(w.dims + cw.dims) if d != comb.chunk_dim]
    return tile_src + "\n\n" + wrapper + "\n\n" + part_src, w, launch, dims
