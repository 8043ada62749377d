"""The Triton kernel of a schedule: a prologue, one loop over the loop axis per pass (each reduction of the pass
updated per block, masked blocks skipped or tested), an epilogue storing the output; for a split plan, the
partial-results kernel and the combine step as a tile function it calls."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.plan.schedule import Schedule

from . import blocks
from .kernel import KernelWriter, grid_sizes, jit_decorator
from .values import Context, Val, dtype_code
from .loops import grid_index_lines, mask_bounds, pass_bounds, pass_table


@dataclass
class Pass:
    """One pass over the loop axis: values read from reductions finished in earlier passes (`pre`, filled while
    later code is emitted), the states' initial values, the key range, and the loops over key blocks."""
    comment: str
    pre: list[str]
    init: list[str]
    bounds: list[str]
    loops: list[str]


@dataclass
class Kernel:
    """A Triton kernel as data, drawn by `render`: its parameters and compile-time constants, the program's
    head (program ids, offsets, row range), a prologue (values that do not vary along the loop axis), its
    passes, and an epilogue that stores the output (or a split plan's partial results)."""
    name: str
    params: list[str]
    constexprs: list[str]
    unspecialized: list[str]   # sizes that only count programs: one compiled kernel serves every value
    tile: bool                 # a function of (pid_row, pid_grid) that other kernels call
    head: list[str]
    prologue: list[str]
    passes: list[Pass]
    epilogue: list[str]


def render(k: Kernel) -> str:
    body = []
    for p in k.passes:
        body += [p.comment, "\n".join(p.pre) or "pass"] + p.init + p.bounds + p.loops
    code = "\n".join(k.head + k.prologue) + "\n" + "\n".join(body + k.epilogue)
    consts = [f"{c}: tl.constexpr" for c in k.constexprs]
    sig = ",\n    ".join([", ".join(k.params[i:i + 6]) for i in range(0, len(k.params), 6)] + consts)
    if k.tile:
        return f"@triton.jit\ndef {k.name}_tile(\n    pid_row, pid_grid,\n    {sig},\n):\n" + textwrap.indent(code, "    ") + "\n"
    return (f"{jit_decorator('triton', k.unspecialized)}\ndef {k.name}_kernel(\n    {sig},\n):\n"
            + textwrap.indent(code, "    ") + "\n")


def kernel_source(sched: Schedule, name: str, partials: list | None = None, *, combine: KernelWriter | None = None,
                  tile: bool = False) -> tuple[str, KernelWriter]:
    """The source of `triton_kernel` (rendered), and its writer."""
    kernel, w = triton_kernel(sched, name, partials, combine=combine, tile=tile)
    return render(kernel), w


def triton_kernel(sched: Schedule, name: str, partials: list | None = None, *, combine: KernelWriter | None = None,
                  tile: bool = False) -> tuple[Kernel, KernelWriter]:
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
    first_table = pass_table(w, 0, sched.in_pass(0)) if row and loop and not tile and not partials else None
    if first_table is not None:
        # row blocks in the order the table lists them, most key blocks first: ROW_ORDER 1 runs one head after
        # another, each from its longest row block (a head's keys stay in cache), ROW_ORDER 2 starts every
        # head's longest first (balances better when there are few row blocks per head); 0 keeps the natural
        # order. On an H100, ROW_ORDER 2 was 5-20% slower than the natural order at S = 16384 for document
        # masks, and up to 30% faster at S = 4096 for global tokens (bench/suite/masks.py)
        w.row_order = True
        order = blocks.order_code(first_table, w)
        head += ["if ROW_ORDER == 2:", "    pid_grid = tl.program_id(0)", f"    pid_row = {order.format(1)}",
                 "elif ROW_ORDER == 1:", "    pid_grid = tl.program_id(1)", f"    pid_row = {order.format(0)}",
                 "else:", "    pid_grid = tl.program_id(1)", "    pid_row = tl.program_id(0)"]
    elif row and not tile:
        b = mask_bounds(w, sched.reductions) if loop else None
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

    passes: list[Pass] = []
    done: set = set()
    even_used = False   # does a pass test EVEN_<loop> (listed masks, see below)
    for p in range(sched.passes):
        reds = sched.in_pass(p)
        w.ctx = Context(f"body{p}", f"pre{p}", complete=set(done), running=set(reds))
        for r in reds:
            w.init_state(r, f"init{p}")
        table = pass_table(w, p, reds)
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
            if p == sched.passes - 1:
                _accumulate(w, sched)
            used = " ".join(w.blocks[blk])
            prevs = [f"{w.state[r].code}_prev = {w.state[r].code}" for r in reds if f"{w.state[r].code}_prev" in used]
            w.blocks[blk][head_lines:head_lines] = prevs   # the states as they were when the block began
            loops.append(w.blocks[blk])
        loop_lines = []
        # ONE_LOOP (a first call's quick kernel): the masked body over every block the pass visits, a half or a
        # third of the code for Triton to compile; else partial blocks masked and full blocks without the mask
        w.one_loop = True
        if table is not None:   # the row block's lists of partial and full key blocks (blocks.py)
            bounds, partial, full, both = blocks.kernel_lines(table, w)
            one, parts = both, ((partial, loops[0]), (full, loops[1]))
        else:
            bounds = pass_bounds(w, p, reds)
            one = [f"for start in range(lo, hi, {w.block(loop)}):"]
            parts = tuple(([f"for start in range({lo}, {hi}, {w.block(loop)}):"], lines) for lo, hi, lines in
                          (("lo", "full_lo", loops[0]), ("full_lo", "full_hi", loops[1]), ("full_hi", "hi", loops[0])))
        loop_lines += ["if ONE_LOOP:"] + ["    " + x for x in one] + ["        " + x for x in loops[0]] + ["else:"]
        for header, lines in parts:
            loop_lines += ["    " + x for x in header] + ["        " + x for x in lines]
        passes.append(Pass(f"# pass {p} over {loop}: " + ", ".join(ir.show(r)[:60] for r in reds),
                           w.blocks[f"pre{p}"], w.blocks[f"init{p}"], bounds, loop_lines))
        done |= set(reds)

    out_axes = {stem: index or axes for stem, axes, _, index in outputs(spec)}
    if partials:
        epilogue = ["# this chunk's partial results"] + _store_partials(w, partials)
        out_axes = {**{p.name: ("chunk",) + p.axes for p in partials}, **(out_axes if combine else {})}
    else:
        epilogue = _store_output(w, sched, done)
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
    w.constexprs += ["ONE_LOOP"] if w.one_loop else []
    w.constexprs += ["TMA_REDUCE"] if w.tma_reduce else []
    if any(t.tensors for t in w.tables.values()):
        # block lists rebuilt at a call by the kernel before this one: launched as its dependent (runtime:
        # _dependent_launch), this kernel waits for them before its first read
        w.constexprs += ["DEPENDENT"]
        head[:0] = ["if DEPENDENT:", "    gdc_wait()"]
    if combine is not None:
        params += [p for p in combine.params if p not in params] + ["tickets_ptr"]
        w.constexprs += [f"COMBINE_{c}" for c in combine.constexprs] + ["COMBINE_IN_KERNEL"]
        epilogue += _combine_in_kernel(w, combine)
    w.params = params
    return Kernel(name, params, list(w.constexprs), grid_sizes(w, params), tile, head, w.blocks["prologue"], passes,
                  epilogue), w


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


def _accumulate(w: KernelWriter, sched: Schedule) -> None:
    """In the last pass's loop body: each output accumulated across programs (Schedule.accumulated) gets this
    program's share for the block, added atomically into its fp32 buffer (which the launcher zeroes)."""
    terms = sched.term.args[1:] if sched.term.op == "pack" else ()
    for k in sched.accumulated:
        o, stem = sched.spec.also[k], f"out{k + 1}"
        index = tuple(ir.axis(a) for a in o.axes)
        full = set() if w.ctx.masked else {sched.loop}   # in full blocks of the loop axis every lane is valid
        value, ptr, checks, out_tile = _output_tile(w, terms[k], stem, o.axes, index, skip=full)
        mask = f", mask={' & '.join(checks)}" if checks else ""
        add = f"tl.atomic_add({ptr}, {value}{mask}, sem='relaxed')"
        found = w.descriptor_block(stem, index, out_tile, transposable=False) if w.tma else None
        if found is None:
            w.blocks[w.ctx.body].append(add)
            continue
        # one bulk reduce of the block into global memory (the part past the tensor's end left alone), rather
        # than an atomic per element
        w.tma_reduce = True
        param, coords, blocks, _ = found
        w.blocks[w.ctx.body] += ["if USE_TMA and TMA_REDUCE:",
                                 f"    {param}.atomic_add([{', '.join(coords)}], {value}.reshape({', '.join(blocks)}))",
                                 "else:", f"    {add}"]


def _store_partials(w: KernelWriter, partials: list) -> list[str]:
    lines = []
    for p in partials:
        st = w.state[p.reduction]
        ptr = " + ".join([f"{p.name}_ptr", f"pid_chunk * {p.name}_s0"] +
                         [f"{w.expand(w.emit(ir.axis(a)), st.axes)} * {p.name}_s{k + 1}" for k, a in enumerate(p.axes)])
        checks = [w.expand(Val(f"valid_{a}", (a,), "bool"), st.axes) for a in st.axes if w.padded(a)]
        lines.append(f"tl.store({ptr}, {st.code}{', mask=' + ' & '.join(checks) if checks else ''})")
    return lines


def outputs(spec) -> list[tuple[str, tuple[str, ...], str, tuple | None]]:
    """(pointer stem, axes, dtype, store index) of each output the kernel writes: the first as `out`, further
    ones (spec.also) as out1, out2, ... in order."""
    first = [("out", spec.output_axes, spec.output_dtype, spec.output_index)]
    return first + [(f"out{k + 1}", o.axes, o.dtype, None) for k, o in enumerate(spec.also)]


def _store_output(w: KernelWriter, sched: Schedule, done: set) -> list[str]:
    spec, loop = sched.spec, sched.loop
    body: list[str] = []
    w.ctx = Context("write" if sched.writes_loop else "epilogue", "pre_out" if sched.writes_loop else "epilogue",
                    complete=set(done), running=set())
    if sched.writes_loop:
        w.blocks["write"] += [f"offs_{loop} = start + tl.arange(0, {w.block(loop)})",
                              f"valid_{loop} = offs_{loop} < {w.ext(loop)}"]
    terms = sched.term.args if sched.term.op == "pack" else (sched.term,)
    for k, (term, (stem, axes, dtype, index)) in enumerate(zip(terms, outputs(spec))):
        if k - 1 not in sched.accumulated:   # those are added to in the loop (_accumulate)
            _store(w, sched, term, stem, axes, dtype, index)
    if sched.writes_loop:
        body += ["# write the output block by block"] + w.blocks["pre_out"]
        body += [f"for start in range(0, {w.ext(loop)}, {w.block(loop)}):"] + ["    " + x for x in w.blocks["write"]]
    else:
        body += ["# epilogue"] + w.blocks["epilogue"]
    return body


def _output_tile(w: KernelWriter, term, stem: str, axes: tuple[str, ...], index: tuple, skip: set = frozenset()):
    """(value in fp32 over the output's tile, pointers at `index`, the bound checks of its padded tile axes but
    those in `skip`, the tile's axes) of one output."""
    out_tile = w.canon({a for a in axes if a in w.tile_axes})
    v = w.emit(term)
    value = w.expand(w.as_float(v), out_tile)
    if set(v.axes) != set(out_tile) or term.op == "const":   # broadcast; a literal made a Triton value
        value = f"({value} + tl.zeros([{', '.join(w.block(a) for a in out_tile)}], tl.{w.fp}))"
    ptr = " + ".join([f"{stem}_ptr"] + [f"{w.expand(w.emit(x), out_tile)} * {stem}_s{k}" for k, x in enumerate(index)])
    checks = [w.expand(Val(f"valid_{a}", (a,), "bool"), out_tile) for a in out_tile if w.padded(a) and a not in skip]
    return value, ptr, checks, out_tile


def _store(w: KernelWriter, sched: Schedule, term, stem: str, axes: tuple[str, ...], dtype: str, index) -> None:
    """The lines storing one output's tile (through a tensor descriptor where the launcher builds one)."""
    index = index or tuple(ir.axis(a) for a in axes)
    value, ptr, checks, out_tile = _output_tile(w, term, stem, axes, index)
    dt = dtype_code("tl", dtype)
    store = f"tl.store({ptr}, {value}.to({dt}){', mask=' + ' & '.join(checks) if checks else ''})"
    blk = w.ctx.body
    found = w.descriptor_block(stem, index, out_tile, transposable=False) \
        if w.tma and not sched.writes_loop and stem == "out" else None
    if found is None:
        w.blocks[blk].append(store)
    else:   # the copy engine where the launcher could build the descriptor, a pointer store otherwise
        param, coords, blocks, _ = found
        w.blocks[blk] += ["if USE_TMA:", f"    {param}.store([{', '.join(coords)}], {value}.to({dt}).reshape({', '.join(blocks)}))",
                          "else:", f"    {store}"]
