"""Term -> Gluon kernel for Hopper: the warp-specialized form of a gradient pass whose programs own a block of
rows and add one output into another kernel's rows (Schedule.accumulated), such as attention's dK/dV pass with
dQ added (`optimize --backward --atomic`): five matrix products per block instead of the two passes' seven.

A program owns 128 rows (keys). Its warps split into three partitions:

    producer     one warp: copies the inputs read along the rows once (K, V) and those read along the loop
                 axis (Q, dO) block after block into a ring of shared-memory stages (copy engine, mbarriers)
    consumer 0   rows 0-63: per block, the products within the block (S^T = K Q^T, dP^T = V dO^T), the
                 per-element work of the term (gluon_gradient_writer.py), the products over the loop axis into
                 its states (dV += P^T dO, dK += dS^T Q), and its rows of the accumulated output's tile (dS^T)
                 into shared memory
    consumer 1   rows 64-127: the same

Once both halves of the tile are in shared memory, each consumer multiplies it by half of the row operand's
columns (dQ[:, half] = dS K[:, half]) and adds the result into the fp32 output through the copy engine's bulk
reduce, which no register waits on. FlashAttention-3 lays out its Hopper backward this way; measured by hand first
in bench/experiments/2026-11-27-one-pass-backward (1.22-1.24x FlexAttention's backward for global attention on
an H100, where the Triton form of the same plan ran at 0.96x the two passes)."""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.plan.schedule import Schedule

from .gluon_gradient_writer import GradientWriter
from .gluon_waits import block_with_waits
from .blocks import builder_call, kernel_lines, listed_blocks, order_code
from .gluon_writer import GLUON_DTYPE, ROWS, NotEligible, matched_or_why, start_partitions
from .kernel import grid_sizes, jit_decorator
from . import gluon_split_tail as tail
from .loops import grid_index_lines, mask_bounds, pass_bounds, pass_table
from .triton_kernel import outputs
from .values import Context, Val

ROW_BLOCK = 2 * ROWS    # rows per program: one warpgroup's 64 each
LOOP_BLOCK = 64         # loop-axis block: the accumulated tile's rows, one m64 product
ACC_DESC = "acc_desc"   # the kernel's parameter: the accumulated output's descriptor
GRADIENT_GLUON_CONFIG = {"BACKEND": "gluon", "WS_STAGES": 2, "WS_ORDER": 1}   # (tuning tries ORDER 1 and 2: GROUP)

# the copy engine's bulk tensor reduce, which Gluon (Triton 3.6) builds but does not name
REDUCE_ADD = '''from triton._C.libtriton import ir as _triton_ir
from triton.experimental.gluon.language._core import builtin as _gluon_builtin


@_gluon_builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add a shared-memory tile into global memory at coord through the copy engine (bulk tensor reduce)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_triton_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                              src.handle)
'''


@dataclass
class GradientKernel:
    """A schedule matched to the gradient pattern, with its per-element code written."""
    writer: GradientWriter
    name: str
    head: list[str]            # this program's row block and grid indices
    bounds: list[str]          # the loop axis's range for the row block (mask bounds)
    body: list[str]            # a block's lines: its products issued, each waited for where first read
    acc_lines: list[str]       # the accumulated output's tile into shared memory, its product and add
    epilogue: list[str]        # the outputs' values, once both consumers are past the loop
    stores: list[str]          # and their stores
    out_descs: list            # (descriptor, tensor, block) of the outputs the consumers store
    acc_block: list[str]       # the block of the accumulated output's descriptor (ACC_DESC)
    half: int                  # columns of the accumulated output per consumer
    added: int                 # the further output the product adds into (ACC_DESC's)
    vector_params: list[str]   # the pointers and strides of the added outputs of a value per loop row
    blocks: tuple[str, str]    # the number of loop blocks the row block visits, and block `it`'s first index
    split: tuple[str, str] | None   # (tiles, loop blocks a tile) where every tile is the same work: the last
    #                                 wave's tiles are shared by every multiprocessor (gluon_split_tail.py)


def match_gradients(sched: Schedule, name: str) -> GradientKernel | str:
    """The schedule's roles in the gradient pattern, or why it has none."""
    return matched_or_why(_match, sched, name)


def _match(sched: Schedule, name: str) -> GradientKernel:
    spec = sched.spec
    if sched.loop is None or sched.row is None or sched.split or sched.writes_loop or sched.chunked:
        raise NotEligible("not one pass over a loop axis writing row tiles")
    # one added output is a product with an input read along the rows (dQ = dS K); others may be sums over the rows
    # of a per-element tile, a value per loop row (the gradient of ALiBi's slopes, of a per-head temperature)
    vectors = [k for k in sched.accumulated if all(a in sched.grid or a == sched.loop for a in spec.also[k].axes)]
    matrices = [k for k in sched.accumulated if k not in vectors]
    if sched.passes != 1 or len(matrices) != 1:
        raise NotEligible("not one pass adding one product into another kernel's rows")
    w = GradientWriter(sched, name)
    row, loop = sched.row, sched.loop
    reds = sched.in_pass(0)
    table = pass_table(w, 0, reds)   # a mask whose loop blocks are listed per row block at run time (blocks.py)
    grid_tiles = " * ".join(w.ext(g) for g in sched.grid) or "1"
    row_blocks = f"gl.cdiv({w.ext(row)}, {w.block(row)})"
    # Programs take GROUP grid indices at a time, one row block after another across the group (the launcher's
    # group_size): a wave spans about as many grid indices as one grid index's row blocks would fill, so its row
    # blocks read the same loop blocks at about the same time (from the cache), and under a mask whose work
    # falls with the row block the longest start first, so the last wave is short. One grid index after another
    # (GROUP 1) left the last index's longest row block starting in the last wave: a causal gradient's programs
    # ran 14% past their even share at S = 4096 (a simulation of 132 SMs taking programs in order).
    head = [f"first = gl.program_id(0) // ({row_blocks} * GROUP) * GROUP   # the group's first grid index",
            f"members = gl.minimum(GROUP, {grid_tiles} - first)",
            f"pid_row = (gl.program_id(0) - first * {row_blocks}) // members",
            f"pid_grid = first + (gl.program_id(0) - first * {row_blocks}) % members"]
    if table is not None:   # ORDER 2 (a listed mask whose work a few row blocks hold, the launcher's choice):
        # every grid index's heaviest row block first, in the table's order of work (global tokens: GROUP order
        # started the last heads' rows that see every key in the last wave, 1.2x slower at S = 16384)
        head = ["if ORDER == 2:", f"    pid_grid = gl.program_id(0) % ({grid_tiles})",
                f"    pid_row = {order_code(table, w, f'gl.program_id(0) // ({grid_tiles})')}",
                "else:"] + ["    " + x for x in head]
    head += grid_index_lines(w, sched)
    head += [f"i_lo = pid_row * {w.block(row)}", f"i_hi = gl.minimum(i_lo + {w.block(row)}, {w.ext(row)}) - 1"]

    w.ctx = Context("body0", "pre0", complete=set(), running=set(reds))
    for r in reds:
        w.init_state(r, "init0")
    if len(w.cols) != 1:
        raise NotEligible("the states over the loop axis have columns of different extents")
    k = matrices[0]
    o = spec.also[k]
    term = sched.term.args[k + 1]
    sums = [x for x in ir.walk(term) if ir.is_reduction(x) and x.attrs[1] == row]
    if len(sums) != 1 or sums[0].op != "red" or sums[0].attrs[0] != "sum":
        raise NotEligible(f"output {o.name} is not one sum over the rows")
    # one loop over the blocks, each tested against the loop axis's end and the mask: beside it a loop of full
    # blocks without the tests (as the Triton kernels run) made the consumers spill (compiled for sm_90: 232
    # bytes of stack against 80 for global attention, 400 against 368 under a causal mask). EVEN: both axes'
    # lengths are multiples of their blocks, so no lane lies past an end and the bound tests fold away
    blk = "body0"
    w.ctx.body, w.ctx.masked = blk, True
    w.blocks[blk] += [f"offs_{loop} = start + gl.arange(0, {w.block(loop)}, layout=S_COLS)",
                      "if EVEN:", f"    valid_{loop} = gl.full([{w.block(loop)}], 1, gl.int1, S_COLS)", "else:",
                      f"    valid_{loop} = offs_{loop} < {w.ext(loop)}"]
    for r in reds:
        w.update(r)
    vector_params = [p for v in vectors for p in _added_vector(w, v, blk)]
    found = w.split_product(sums[0].args[0], row)
    if found is None or w.role(found[1])[0] != "row" or found[3].axes != (row, loop):
        raise NotEligible(f"output {o.name}: not a per-element tile times an input read along the rows")
    tile = w.in_sixteen(found[2], found[3], blk)
    operand, col = w.role(found[1])[1], next(a for a in found[1].axes if a != row)
    acc_lines = _accumulated_tile(w, tile, operand)
    # the output's value from the product (a scale outside the sum), in a block of its own
    w.ctx.body = "acc"
    w.cache[("acc", sums[0], False, None)] = Val("acc_part", (loop, col), "f32")
    value = w.emit(term)
    if value.axes != (loop, col) or _reads_beside(term, sums[0]):
        raise NotEligible(f"output {o.name} reads more than its sum over the rows")
    acc_lines += w.blocks.pop("acc", []) + [f"acc_rows.store({value.code})", "fence_async_shared()"]
    if o.dtype not in ("f32", "f16", "bf16") or o.axes[-1] != col or loop not in o.axes or \
            any(a not in sched.grid for a in o.axes if a not in (loop, col)) or w.ext(col) not in ("64", "128"):
        raise NotEligible(f"output {o.name}: not a float [..., {loop}, {col}] tile of 64 or 128 columns")
    half = int(w.ext(col)) // 2
    found = w.descriptor_block(f"out{k + 1}", tuple(ir.axis(a) for a in o.axes), (loop, col))
    if found is None:
        raise NotEligible(f"output {o.name} cannot move as one block of the copy engine")
    acc_block = found[2][:-1] + [str(half)]
    w.descriptors.pop((f"out{k + 1}", tuple(found[2])))
    coords = [a if a in sched.grid else "start" if a == loop else f"ME * {half}" for a in o.axes]
    acc_lines.append(f"tma_reduce_add({ACC_DESC}, [{', '.join(coords)}], acc_smem.index(ME))")
    epilogue, stores, out_descs = _epilogue(w, sched, reds)
    # every row block loops over the whole loop axis (no listed blocks, no bounds that narrow it): equal tiles
    read = mask_bounds(w, reds)
    uniform = table is None and (read is None or (read.lo_any, read.hi_any) == ("0", w.ext(loop)))
    split = (f"{row_blocks} * {grid_tiles}", f"gl.cdiv({w.ext(loop)}, {w.block(loop)})") if uniform else None
    if table is None:
        bounds, blocks = pass_bounds(w, 0, reds), (f"gl.cdiv(hi - lo, {w.block(loop)})", f"lo + it * {w.block(loop)}")
    else:   # the listed blocks, partial and full alike, each tested against the mask (one body: see above)
        bounds, blocks = kernel_lines(table, w)[0], listed_blocks(table, w, index="it")
    kernel = GradientKernel(w, name, head, bounds, block_with_waits(w, w.blocks[blk], blk), acc_lines, epilogue,
                            stores, out_descs, acc_block, half, k, vector_params, blocks, split)
    text = "\n".join(kernel.body + acc_lines + epilogue + stores)
    if re.search(r"<(row|loop):", text):
        raise NotEligible("an input operand is read in arithmetic, not as it is")
    return kernel


def _added_vector(w: GradientWriter, k: int, blk: str) -> list[str]:
    """Block `blk`'s lines adding its share of further output k, a sum over the rows of a per-element tile (a
    value per loop row): each consumer sums its rows (those past the end as 0) and adds the values atomically.
    Returns the output's pointer and stride parameters."""
    sched, row, loop = w.s, w.s.row, w.s.loop
    o, term = sched.spec.also[k], sched.term.args[k + 1]
    sums = [x for x in ir.walk(term) if ir.is_reduction(x) and x.attrs[1] == row]
    if len(sums) != 1 or sums[0].op != "red" or sums[0].attrs[0] != "sum" or o.dtype != "f32":
        raise NotEligible(f"output {o.name}: not an fp32 sum over the rows")
    x = w.as_float(w.emit(sums[0].args[0]))
    if x.axes != (row, loop):
        raise NotEligible(f"output {o.name}: not a sum of a [{row}, {loop}] tile")
    part = w.put(blk, f"gl.sum(gl.where(valid_{row}[:, None], {x.code}, 0.0), axis=0)")
    w.cache[(blk, sums[0], False, None)] = Val(part, (loop,), "f32")
    value = w.emit(term)
    if value.axes != (loop,) or _reads_beside(term, sums[0]):
        raise NotEligible(f"output {o.name} reads more than its sum over the rows")
    ptr = f"out{k + 1}"
    offsets = " + ".join(f"{'offs_' + a if a == loop else a} * {ptr}_s{n}" for n, a in enumerate(o.axes))
    w.blocks[blk].append(f"gl.atomic_add({ptr}_ptr + {offsets}, {value.code}, mask=valid_{loop}, sem='relaxed')")
    return [f"{ptr}_ptr"] + [f"{ptr}_s{n}" for n in range(len(o.axes))]


def _reads_beside(term, inner) -> bool:
    """Does `term` load an input outside its subterm `inner` (an added output's sum over the rows)?"""
    within = set(ir.walk(inner))
    return any(x.op == "load" and x not in within for x in ir.walk(term))


def _accumulated_tile(w: GradientWriter, tile: Val, param: str) -> list[str]:
    """This consumer's rows of the accumulated product's tile into shared memory (the rows past the end as 0);
    once both consumers' are there, the product with this consumer's half of the row operand's columns."""
    row = w.s.row
    cols = f"{param}_smem.reshape([{w.block(row)}, {w.width(param)}]).slice(ME * HALF, HALF, dim=1)"
    states = ", ".join(w.state[r].code for r in w.s.in_pass(0))
    return [f"tile_smem.index(it % 2).slice(ME * {ROWS}, {ROWS}).store(gl.where(valid_{row}[:, None], "
            f"{tile.code}, 0.0))",
            "fence_async_shared()",
            "mbarrier.arrive(tile_bar.index(it % 2), count=1)",
            "mbarrier.wait(tile_bar.index(it % 2), (it // 2) & 1)   # both consumers' rows are in",
            f"acc_part = warpgroup_mma(tile_smem.index(it % 2).permute((1, 0)), {cols}, zeros_half, use_acc=False, "
            "is_async=True)",
            f"{states}, acc_part = warpgroup_mma_wait(num_outstanding=0, deps=({states}, acc_part))",
            "mbarrier.arrive(empty.index(stage), count=1)",
            "tma.store_wait(pendings=0)   # the last block's share has left acc_smem"]


def _epilogue(w: GradientWriter, sched: Schedule, reds) -> tuple[list[str], list[str], list[tuple]]:
    """The outputs other than the accumulated one, each leaving this consumer's rows through shared memory and
    the copy engine (pointer stores from registers hold a 64-bit address per element beside the states): once
    both consumers are done with the loop, consumer 0 takes the tile buffers and consumer 1 the accumulated
    output's, 32 KB each, enough for 64 rows of 128 fp32 columns. Returns the lines up to the stores, the stores
    and the outputs' (descriptor, tensor, block)."""
    row = sched.row
    w.ctx = Context("epilogue", "epilogue", complete=set(reds), running=set())
    terms = sched.term.args if sched.term.op == "pack" else (sched.term,)
    lines = ["tma.store_wait(pendings=0)   # this consumer's adds have left acc_smem",
             "mbarrier.arrive(done_bar, count=1)",
             "mbarrier.wait(done_bar, 0)   # and the other's: no product or add reads tile_smem or acc_smem"]
    stores, descs = [], []
    for k, (stem, axes, dtype, index) in enumerate(outputs(sched.spec)):
        if k - 1 in sched.accumulated:
            continue
        v = w.emit(terms[k])
        col = axes[-1]
        if index is not None or v.axes != (row, col) or axes[-2] != row or dtype not in ("f16", "bf16", "f32") \
                or any(a not in sched.grid for a in axes[:-2]):
            raise NotEligible(f"output {stem} is not a [..., {row}, column] tile")
        to = GLUON_DTYPE.get(dtype, "gl.float32")
        param = f"{stem}_gdesc"
        block = ["1"] * (len(axes) - 2) + [str(ROWS), w.ext(col)]
        descs.append((param, stem, block))
        coords = list(axes[:-2]) + [f"i_lo + ME * {ROWS}", "0"]
        stores += ["tma.store_wait(pendings=0)   # the last output has left",
                  "if ME == 0:",
                  f"    out_tile = tile_smem._reinterpret({to}, [{', '.join(block)}], {param}.layout)",
                  "else:",
                  f"    out_tile = acc_smem._reinterpret({to}, [{', '.join(block)}], {param}.layout)",
                  f"out_tile.reshape([{ROWS}, {w.ext(col)}]).store({v.code}.to({to}))",
                  "fence_async_shared()",
                  f"tma.async_copy_shared_to_global({param}, [{', '.join(coords)}], out_tile)"]
    return w.blocks["epilogue"] + lines, stores, descs


def render_gradients(m: GradientKernel) -> tuple[str, GradientWriter]:
    """The Gluon kernel `{name}_gluon_kernel` of a matched schedule: producer, consumers and the kernel that
    allocates their shared memory and starts them. Sets the writer's params and constexprs."""
    w, name = m.writer, m.name
    sched = w.s
    row, loop = sched.row, sched.loop
    rb, lb = w.block(row), w.block(loop)
    dt = GLUON_DTYPE[w.dtype]
    row_ops, loop_ops = list(w.row_operands), list(w.loop_operands)
    pointers = []
    for n in w.pointer_inputs:
        pointers += [f"{n}_ptr"] + [f"{n}_s{k}" for k in range(len(w.spec.inputs[n].shape))]
    params = row_ops + loop_ops + [ACC_DESC] + [d for d, _, _ in m.out_descs] + pointers + m.vector_params + \
        [f"{t.param}_ptr" for t in w.tables.values()] + w.dims + ["GROUP"] + (tail.SPLIT_PARAMS if m.split else [])
    shared = [f"{p}_smem" for p in row_ops + loop_ops] + ["tile_smem", "acc_smem", "row_bar", "ready", "empty",
                                                           "tile_bar", "done_bar"]
    consts = [rb, lb, "STAGES", "EVEN"] + (["ORDER"] if w.tables else [])
    nbytes = (lambda ps: " + ".join(f"{p}.block_type.nbytes" for p in ps))
    coords = (lambda p, table: ", ".join(table[p][0]))
    copy_rows = [f"mbarrier.expect(row_bar, {nbytes(row_ops)})", *[
        f"tma.async_copy_global_to_shared({p}, [{coords(p, w.row_operands)}], row_bar, {p}_smem)" for p in row_ops]]
    copy_block = [
        "stage = it % STAGES",
        "mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes parity 1",
        f"mbarrier.expect(ready.index(stage), {nbytes(loop_ops)})",
        *[f"tma.async_copy_global_to_shared({p}, [{coords(p, w.loop_operands)}], ready.index(stage), "
          f"{p}_smem.index(stage))" for p in loop_ops]]
    loop = [f"for it in range({m.blocks[0]}):", f"    start = {m.blocks[1]}"]
    head = m.head
    if m.split:   # this program's piece (gluon_split_tail.py)
        head = tail.piece_lines(m.split[1]) + tail.of_piece(m.head)
        loop = ["for it in range(piece_hi - piece_lo):", f"    start = lo + (piece_lo + it) * {lb}"]
    producer = head + m.bounds + copy_rows + loop + ["    " + x for x in copy_block]
    cols = next(iter(w.cols))
    layouts = [
        f"S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
        f"instr_shape=[16, {lb}, 16])",
        f"O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
        f"instr_shape=[16, {cols}, 16])",
        f"HALF: gl.constexpr = {m.half}",
        "H_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
        "instr_shape=[16, HALF, 16])",
        "P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)",
        "S_ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)",
        "S_COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)",
        "O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)",
        "O_COLS: gl.constexpr = gl.SliceLayout(0, O_LAYOUT)"]
    step = ["stage = it % STAGES", "mbarrier.wait(ready.index(stage), (it // STAGES) & 1)"]
    setup = [f"offs_{row} = i_lo + ME * {ROWS} + gl.arange(0, {ROWS}, layout=S_ROWS)",
             "if EVEN:", f"    valid_{row} = gl.full([{ROWS}], 1, gl.int1, S_ROWS)", "else:",
             f"    valid_{row} = offs_{row} < {w.ext(row)}"] + w.blocks["prologue"] + m.bounds + w.blocks["init0"]
    zeros = [f"zeros_s = gl.zeros([{ROWS}, {lb}], gl.float32, S_LAYOUT)",
             f"zeros_half = gl.zeros([{lb}, HALF], gl.float32, H_LAYOUT)",
             f"acc_rows = acc_smem.index(ME).reshape([{lb}, HALF])"]
    consumer = layouts + head + setup + zeros + ([] if w.tables else ["it = 0"]) + ["mbarrier.wait(row_bar, 0)"]
    body = step + m.body + m.acc_lines
    if m.split:
        states = [w.state[r].code for r in sched.in_pass(0)]
        consumer += [f"for start in range(lo + piece_lo * {lb}, lo + piece_hi * {lb}, {lb}):"] + \
            ["    " + x for x in body + ["it += 1"]] + tail.share_lines(states, ROWS, cols) + m.epilogue + \
            ["if piece_writes:"] + ["    " + x for x in m.stores]
    elif w.tables:   # the listed blocks
        consumer += [f"for it in range({m.blocks[0]}):", f"    start = {m.blocks[1]}"] + ["    " + x for x in body]
    else:   # (the loop form the bounded masks' kernels were measured in)
        consumer += [f"for start in range(lo, hi, {lb}):"] + ["    " + x for x in body + ["it += 1"]]
    consumer += ([] if m.split else m.epilogue + m.stores) + ["tma.store_wait(pendings=0)"]
    args = ", ".join(params + shared + consts)
    sig = ", ".join(params + shared + [f"{c}: gl.constexpr" for c in consts])
    top_sig = ", ".join(params + [f"{c}: gl.constexpr" for c in consts])
    acc_shape = "[" + ", ".join(m.acc_block) + "]"
    row_smem = [f"{p}_smem = gl.allocate_shared_memory({dt}, [{', '.join(w.row_operands[p][1])}], {p}.layout)"
                for p in row_ops]
    loop_smem = [f"{p}_smem = gl.allocate_shared_memory({dt}, [STAGES, {', '.join(w.loop_operands[p][1])}], "
                 f"{p}.layout)" for p in loop_ops]
    kernel = row_smem + loop_smem + [
        f"tile_smem = gl.allocate_shared_memory({dt}, [2, {rb}, {lb}], "
        f"gl.NVMMASharedLayout.get_default_for([{rb}, {lb}], {dt}))",
        f"acc_smem = gl.allocate_shared_memory(gl.float32, [2] + {acc_shape}, {ACC_DESC}.layout)",
        "row_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        "ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())",
        "empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())",
        "tile_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
        "done_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        "mbarrier.init(row_bar, count=1)",
        "mbarrier.init(done_bar, count=2)   # both consumers are past the loop",
        "for s in gl.static_range(STAGES):",
        "    mbarrier.init(ready.index(s), count=1)",
        "    mbarrier.init(empty.index(s), count=2)   # both consumers release a stage",
        "for s in gl.static_range(2):",
        "    mbarrier.init(tile_bar.index(s), count=2)   # both consumers' rows of the accumulated tile",
        "fence_async_shared()",
        *start_partitions(name, args)]
    src = (REDUCE_ADD + (tail.ARRIVALS_AWAITED if m.split else "") + f"\n\n@gluon.jit\ndef {name}_producer({sig}):\n" + textwrap.indent("\n".join(producer), "    ")
           + f"\n\n\n@gluon.jit\ndef {name}_consumer({sig}, ME: gl.constexpr):\n"
           + textwrap.indent("\n".join(consumer), "    ")
           + f"\n\n\n{jit_decorator('gluon', grid_sizes(w, params) + ['GROUP'] + (tail.SPLIT_PARAMS[3:] if m.split else []))}\ndef {name}_gluon_kernel({top_sig}):\n"
           + textwrap.indent("\n".join(kernel), "    ") + "\n")
    w.params, w.constexprs = params, consts
    return src, w


def gradient_launch(w: GradientWriter, m: GradientKernel, sched: Schedule, call_args: str) -> list[str]:
    """Launcher lines running the Gluon gradient kernel (its arguments `call_args`) when the config asks for it
    on a Hopper GPU and every descriptor can be built; they open an if whose else runs the Triton kernel."""
    sizes = {w.block(sched.row): str(ROW_BLOCK), w.block(sched.loop): str(LOOP_BLOCK)}
    lines = ["    gluon_descs = (None,)",
             "    if cfg.get('BACKEND') == 'gluon' and device.type == 'cuda' and _hopper(device):"]
    k = m.added
    for param, tensor, shape in list(w.descriptors.values()) + [(ACC_DESC, f"out{k + 1}", m.acc_block)] + \
            m.out_descs:
        lines.append(f"        {param} = _gluon_descriptor({tensor}, [{', '.join(sizes.get(b, b) for b in shape)}])")
    names = [p for p, _, _ in w.descriptors.values()] + [ACC_DESC] + [p for p, _, _ in m.out_descs]
    kernel = f"{w.name}_gluon_kernel"
    grid = " * ".join(w.ext(g) for g in sched.grid) or "1"
    tiles = f"-(-{w.ext(sched.row)} // {ROW_BLOCK}) * {grid}"
    blocks = f"{w.block(sched.row)!r}: {ROW_BLOCK}, {w.block(sched.loop)!r}: {LOOP_BLOCK}"
    split = tail.launch_lines(tiles, f"-(-{w.ext(sched.loop)} // {LOOP_BLOCK})", len(sched.in_pass(0)), ROWS,
                              next(iter(w.cols))) if m.split else []
    return lines + [
        f"        gluon_descs = ({', '.join(names)},)",
        "    use_gluon = None not in gluon_descs",
        "    if use_gluon:",
        f"        gluon_cfg = {{{blocks}, 'STAGES': cfg['WS_STAGES'], 'num_warps': 4, 'maxnreg': 168}}",
        f"        GROUP = _group_size(cfg['WS_ORDER'], -(-{w.ext(sched.row)} // {ROW_BLOCK}), {grid}, device)",
        f"        gluon_cfg['EVEN'] = int({w.ext(sched.row)} % {ROW_BLOCK} == 0 and "
        f"{w.ext(sched.loop)} % {LOOP_BLOCK} == 0)",
        *["    " + builder_call(t, w, "gluon_cfg") for t in w.tables.values()],
        *([f"        gluon_cfg['ORDER'] = 2 if {' or '.join(t.param + '_skewed' for t in w.tables.values())} else 0"]
          if w.tables else []),
        *split,
        f"        gluon_args = ({call_args},)",
        f"        gluon_consts = tuple(gluon_cfg[c] for c in {tuple(w.constexprs)!r})",
        f"        use_gluon = _gluon_ready({kernel}, gluon_args, gluon_cfg, gluon_consts, config)",
        "    if use_gluon:",
        f"        _launch(rec, {kernel}, ({'SPLIT_FIRST + TAIL' if m.split else tiles},), gluon_args, gluon_cfg, "
        "gluon_consts)"]
