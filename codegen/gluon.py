"""Term -> Gluon kernel for Hopper: the warp-specialized form of a rolled pass with two matrix products.

A schedule qualifies when its loop axis runs one pass whose reductions are row vectors plus one matrix
product over the loop axis (`out[row, col] = sum_loop P[row, loop] * V[loop, col]`, with P computed per block
from a matrix product over an inner axis `sum_inner A[row, inner] * B[loop, inner]`), its state repaired by a
row factor. The kernel then splits its warps into three partitions:

    producer     one warp: copies A once and B/V blocks into a ring of shared-memory stages (copy engine, mbarriers)
    consumer 0   rows 0-63 of the program's 128: per block, the product A B^T, the per-element work of the
                 term (emitted by the same writer as the Triton kernels), the row reductions, and P V
    consumer 1   rows 64-127: the same

A program runs one tile (128 rows at one index of the grid axes) or, with persistent programs, every tile whose
number is its own modulo the program count (in the grouped order, the tiles the launcher planned for it), copying
a tile's first blocks while the last tile's output still leaves through A. With O_BUF (the tunable WS_OUT_BUF,
where shared memory holds it) the output leaves through a buffer of its own instead, the next tile's A is copied
as soon as this tile's last A B^T is done, and B and V have barriers of their own: a B stage is free after its A
B^T, a block before its V, which is what lets 2 stages (the most that fit beside the buffer) keep the products
fed. (Choosing the buffer at run time between two of A instead made ptxas 12.8 reuse a descriptor computed in a
loop's preheader that a tile skipping that loop never ran: bench/experiments/2026-11-28-prefill-boundary.) Under a
causal mask the tiles are numbered longest first (see tile_order.py). The consumers take turns issuing their
matrix products (one computes exponentials while the other's products run), and within a consumer the product P V
of one block runs while the next block's per-element work is computed: the state is repaired after that product,
which is the same sum because the repair is a row factor, acc' = (acc + P_prev V_prev) * factor. This is how
FlashAttention-3 and cuDNN lay out Hopper attention; the Triton kernels of kernel.py cannot express it (Triton 3.6
specializes warps only on Blackwell).
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from neptune_eqsat.plan.schedule import Schedule

from .blocks import block_counts, kernel_lines, order_code
from .gluon_writer import (CONSUMERS, GLUON_DTYPE, ROWS, GluonWriter, NotEligible, matched_or_why,
                           start_partitions)
from .kernel import grid_sizes, jit_decorator
from .loops import grid_index_lines, mask_bounds, pass_bounds, pass_table
from .tile_order import slot_loop, tile_lines
from .values import Context, Val

# the consumers take turns issuing their products: consumer 0's turn t follows t turns of consumer 1, consumer
# 1's turn t follows t + 1 of consumer 0 (a fresh mbarrier passes a wait on parity 1)
TAKE_TURN = "mbarrier.wait(turns.index(ME), (turn & 1) ^ (1 - ME))"
PASS_TURN = ["mbarrier.arrive(turns.index(1 - ME), count=1)", "turn += 1"]


def _block_lines(w: GluonWriter, blk: str, masked: bool) -> list[str]:
    """One key block of a consumer: both products issued in its turn, the per-element work of this block while
    the previous block's P V runs, then the repair of the state."""
    loop = w.loop
    lines = ["stage = it % STAGES",
             "mbarrier.wait(kv_ready.index(stage), (it // STAGES) & 1)",
             "if O_BUF:   # V has barriers of its own: wait for the V that P V reads (the last block's; this",
             "    # block's in a tile's first, where P is 0)",
             "    mbarrier.wait(v_ready.index(prev_stage), (gl.maximum(it - 1, first) // STAGES) & 1)", TAKE_TURN,
        "qk = warpgroup_mma(a_tile, b_smem.index(stage).reshape([BLOCK_J, INNER]).permute((1, 0)), zeros_s, "
        "use_acc=False, is_async=True)",
        "acc = warpgroup_mma(p16, v_smem.index(prev_stage).reshape([BLOCK_J, COLS]), acc, is_async=True)"] + PASS_TURN + [
        "qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk,))",
        "if O_BUF:   # the stage holds B alone: the producer may copy the next B here",
        "    mbarrier.arrive(kv_empty.index(stage), count=1)",
        f"offs_{loop} = start + gl.arange(0, BLOCK_J, layout=S_COLS)"]
    if masked and not w.masked_wheres:   # no mask: a block is tested only where it passes the loop axis's end
        lines.append(f"valid_{loop} = offs_{loop} < {w.ext(loop)}")
    elif masked:   # EVEN: the loop axis's length is a multiple of the block, so no lane lies past its end and the
        # bound's tests fold away (a causal tile's diagonal block then tests the mask alone)
        lines += ["if EVEN:", f"    valid_{loop} = gl.full([BLOCK_J], 1, gl.int1, S_COLS)", "else:",
                  f"    valid_{loop} = offs_{loop} < {w.ext(loop)}"]
    lines += w.blocks[blk]
    lines += ["acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))",
              "mbarrier.arrive(v_free.index(prev_stage), count=1, pred=it > first)"]
    if w.factor[blk] is not None:
        lines.append(f"acc = acc * gl.convert_layout(gl.zeros([{ROWS}], gl.float32, S_ROWS) + {w.factor[blk]}, "
                     f"O_ROWS)[:, None]")
    lines += [f"p16 = gl.convert_layout({w.p_tile[blk]}, P_LAYOUT)", "prev_stage = stage", "it += 1"]
    return lines


def eligible(sched: Schedule) -> str | None:
    """None when the schedule has a warp-specialized Gluon form, else why not."""
    matched = match_warp_specialized(sched, "probe")
    return matched if isinstance(matched, str) else None


def _check_shape(sched: Schedule) -> None:
    spec = sched.spec
    if sched.loop is None or sched.row is None or sched.col is None or sched.split or sched.writes_loop:
        raise NotEligible("not a rolled pass over a loop axis writing row x column tiles")
    if sched.passes != 1:
        raise NotEligible(f"{sched.passes} passes over {sched.loop}: the reductions are not all rolled into one")
    if spec.output_index is not None or tuple(spec.output_axes[-2:]) != (sched.row, sched.col):
        raise NotEligible("the output is not written as [..., row, col]")
    if len(sched.inner) != 1:
        raise NotEligible(f"in-tile reduction axes {sched.inner}: the per-block product needs exactly one")
    for ax in (sched.col, sched.inner[0]):
        if spec.extent(ax) not in (64, 128):
            raise NotEligible(f"axis {ax} has extent {spec.extent(ax)}; the warpgroup products take 64 or 128")


@dataclass
class WarpSpecialized:
    """A schedule matched to the warp-specialized pattern. Its roles: a producer warp copies the row tile
    A once per tile and the key blocks B and V into a ring of stages; two consumer warpgroups, 64 rows each,
    take turns issuing S = A B^T and O += P V on the tensor cores, and between the two do the per-element
    work of a block (the writer's blocks, in S's layout) and repair O by a row factor."""
    writer: GluonWriter
    name: str
    head: list[str]        # the tile a program runs, its grid indices and row range
    rows: list[str]        # a consumer's rows
    bounds: list[str]      # the key range of the tile (mask bounds), or where its lists are (a listed mask)
    listed: tuple | None   # a listed mask's (count of key blocks, the block of copy k, partial loop, full loop)
    tiles: str             # how many tiles there are
    ordered: bool          # tiles are ordered by work (ORDER)
    out: Val               # the output tile, in the epilogue
    out_coords: list[str]
    extras: tuple = ()     # further outputs, row vectors: (pointer stem, value's code, axes)


def match_warp_specialized(sched: Schedule, name: str) -> WarpSpecialized | str:
    """The schedule's roles in the warp-specialized pattern, or why it has none."""
    return matched_or_why(_match, sched, name)


def _match(sched: Schedule, name: str) -> WarpSpecialized:

    _check_shape(sched)
    if sched.chunked:
        raise NotEligible(f"the long axes {', '.join(sched.chunked)} are reduced in loops of their own")
    if sched.accumulated:
        raise NotEligible("further outputs are accumulated across programs (atomic adds in the loop)")
    w = GluonWriter(sched, name)
    row, loop, col = sched.row, sched.loop, sched.col
    grows = mask_bounds(w, sched.reductions)
    # program p runs tiles p, p + programs, ...: one tile each where the launcher starts a program per tile, or
    # as many as fit on the GPU at once (persistent: a tile's first blocks load while the last one finishes)
    row_blocks = f"gl.cdiv({w.ext(row)}, BLOCK_I)"
    grid_tiles = " * ".join(w.ext(g) for g in sched.grid) or "1"
    tiles = f"{row_blocks} * {grid_tiles}"
    reds = sched.in_pass(0)
    table = pass_table(w, 0, reds)   # a mask whose key blocks are listed at run time (blocks.py)
    if table is not None and table.tensors:
        raise NotEligible("the mask's key blocks are listed from tensors at every call, whose table the launcher "
                          "cannot read without waiting for it (gluon.GLUON_PARTIAL_SHARE)")
    ordered = grows is not None and grows.work_grows and table is None
    if table is None:
        head = tile_lines(row_blocks, grid_tiles, tiles, ordered)
    else:   # row blocks in the table's order, most key blocks first, one grid index after another
        counts = tuple(_gluon_blocks(x, w) for x in block_counts(w))
        head = ["tile = slot", f"pid_grid = tile // {row_blocks}",
                f"pid_row = {order_code(table, w, f'tile % {row_blocks}', counts)}"]
    head += grid_index_lines(w, sched)
    head += ["i_lo = pid_row * BLOCK_I", f"i_hi = gl.minimum(i_lo + BLOCK_I, {w.ext(row)}) - 1"]
    rows = [f"offs_{row} = i_lo + ME * {ROWS} + gl.arange(0, {ROWS}, layout=S_ROWS)",
            f"valid_{row} = offs_{row} < {w.ext(row)}"]

    w.ctx = Context("body0", "pre0", complete=set(), running=set(reds))
    for r in reds:
        w.init_state(r, "init0")
    if w.product is None:
        raise NotEligible(f"no matrix product over {loop}")
    for masked in (True, False):
        blk = f"body0{'m' if masked else 'u'}"
        w.ctx.body, w.ctx.masked = blk, masked
        for r in reds:
            w.update(r)
        used = " ".join(w.blocks[blk])
        w.blocks[blk][:0] = [f"{w.state[r].code}_prev = {w.state[r].code}" for r in reds
                             if f"{w.state[r].code}_prev" in used]
    if set(w.operands) != {"a", "b", "v"}:
        raise NotEligible("the matrix products do not read two inputs per block and one once")
    listed = None
    if table is None:
        bounds = pass_bounds(w, 0, reds)
    else:   # the producer copies the partial blocks, then the full ones; the consumers take them in that order
        bounds, partial, full, _ = ([_gluon_blocks(x, w) for x in part] for part in kernel_lines(table, w))
        p = table.param
        copy_k = f"gl.load({p}_at + gl.where(blk < {p}_partial, 1 + blk, n_kb + 2 + blk - {p}_partial)) * BLOCK_J"
        listed = (f"{p}_partial + {p}_full", copy_k, partial, full)
    if w.blocks["pre0"]:
        raise NotEligible("values computed between passes")

    w.ctx = Context("epilogue", "epilogue", complete=set(reds), running=set())
    terms = sched.term.args if sched.term.op == "pack" else (sched.term,)
    out = w.emit(terms[0])
    extras = []
    for k, (t, o) in enumerate(zip(terms[1:], sched.spec.also)):
        v = w.emit(t)
        if v.axes != (row,) or any(a != row and a not in sched.grid for a in o.axes):
            raise NotEligible(f"output {o.name} is not a row vector of the tile (the warp-specialized kernel "
                              "writes further outputs of its rows only)")
        extras.append((f"out{k + 1}", v.code, o.axes))
    if out.axes != (row, col) or w.spec.output_dtype != w.dtype:
        raise NotEligible("the output is not a row x column tile of the operands' type (it leaves through A's buffer)")
    out_coords = [a if a in sched.grid else "0" for a in sched.spec.output_axes[:-2]] + [f"i_lo + ME * {ROWS}", "0"]
    return WarpSpecialized(w, name, head, rows, bounds, listed, tiles, ordered, out, out_coords, tuple(extras))


def _gluon_blocks(line: str, w: GluonWriter) -> str:
    """A line of the loop code shared with the Triton kernel, with the row and loop blocks under the names the
    Gluon kernel gives them (BLOCK_I, BLOCK_J)."""
    names = {f"BLOCK_{w.row.upper()}": "BLOCK_I", f"BLOCK_{w.loop.upper()}": "BLOCK_J"}
    # one pass: renaming one after the other would rename a row axis j's BLOCK_I again, to BLOCK_J
    return re.sub(r"\bBLOCK_\w+\b", lambda m: names.get(m.group(0), m.group(0)), line)


def render_warp_specialized(m: WarpSpecialized) -> tuple[str, GluonWriter]:
    """The Gluon kernel `{name}_gluon_kernel` of a matched schedule: producer, consumers and the kernel that
    allocates their shared memory and starts them."""
    w, name, head, rows, bounds, listed, tiles, ordered, out, out_coords = (
        m.writer, m.name, m.head, m.rows, m.bounds, m.listed, m.tiles, m.ordered, m.out, m.out_coords)
    sched = w.s
    col, inner = sched.col, sched.inner[0]
    (a_param, a_coords, a_blocks), (b_param, b_coords, b_blocks), (v_param, v_coords, v_blocks) = (
        w.operands[k] for k in ("a", "b", "v"))
    dims = w.dims
    pointers = []
    for n in w.pointer_inputs:
        pointers += [f"{n}_ptr"] + [f"{n}_s{k}" for k in range(len(w.spec.inputs[n].shape))]
    for stem, _, axes in m.extras:
        pointers += [f"{stem}_ptr"] + [f"{stem}_s{k}" for k in range(len(axes))]
    params = ([a_param, b_param, v_param, "out_desc"] + pointers + [f"{t.param}_ptr" for t in w.tables.values()] + dims
              + (["GROUP", "tile_plan_ptr"] if ordered else []))
    shared = ["a_smem", "b_smem", "v_smem", "o_smem", "a_bar", "a_free", "kv_ready", "kv_empty", "v_ready", "v_empty",
              "turns"]
    consts = ["BLOCK_I", "BLOCK_J", "STAGES", "O_BUF"] + (["EVEN"] if w.masked_wheres else []) + (
        ["ORDER"] if ordered else [])
    dt = GLUON_DTYPE[w.dtype]
    dims_of = (lambda blocks: "[" + ", ".join(blocks) + "]")
    out_block = ["1"] * (len(out_coords) - 2) + [str(ROWS), w.ext(col)]
    nbytes = f"{a_param}.block_type.nbytes"
    tile_body = head + bounds + [
        f"n = {listed[0]}" if listed else "n = gl.cdiv(hi - lo, BLOCK_J)",
        "# A goes first where the output leaves through a buffer of its own (A is free once the last tile's last",
        "# A B^T is done), and in a program's first tile; else later tiles copy it after their first blocks, which",
        "# go while the last tile's output still leaves through A",
        "a_after = 0 if O_BUF else gl.minimum(n, STAGES * gl.minimum(tiles_done, 1))",
        "for blk in range(n + 1):",
        "    if blk == a_after:",
        "        mbarrier.wait(a_free, (tiles_done & 1) ^ 1)   # a fresh barrier passes parity 1",
        f"        mbarrier.expect(a_bar, {nbytes})",
        f"        tma.async_copy_global_to_shared({a_param}, [{', '.join(a_coords)}], a_bar, a_smem)",
        "    if blk < n:",
        f"        start = {listed[1]}" if listed else "        start = lo + blk * BLOCK_J",
        "        stage = it % STAGES",
        "        phase = ((it // STAGES) & 1) ^ 1   # a fresh barrier passes parity 1",
        "        mbarrier.wait(kv_empty.index(stage), phase)",
        "        if O_BUF:   # B's stage is free once both consumers' A B^T of it is done, V's once their P V is",
        f"            mbarrier.expect(kv_ready.index(stage), {b_param}.block_type.nbytes)",
        "        else:   # a stage of B and V, free once both consumers' P V of it is done",
        f"            mbarrier.expect(kv_ready.index(stage), {b_param}.block_type.nbytes + "
        f"{v_param}.block_type.nbytes)",
        f"        tma.async_copy_global_to_shared({b_param}, [{', '.join(b_coords)}], kv_ready.index(stage), "
        "b_smem.index(stage))",
        "        if O_BUF:",
        "            mbarrier.wait(v_empty.index(stage), phase)",
        f"            mbarrier.expect(v_ready.index(stage), {v_param}.block_type.nbytes)",
        "            v_ready_at = v_ready",
        "        else:",
        "            v_ready_at = kv_ready",
        f"        tma.async_copy_global_to_shared({v_param}, [{', '.join(v_coords)}], v_ready_at.index(stage), "
        "v_smem.index(stage))",
        "        it += 1",
        "tiles_done += 1"]
    producer = ["it = 0   # key blocks copied, over all tiles (ring stage and phase)", "tiles_done = 0",
                *slot_loop(tiles, ordered)] + ["    " + x for x in tile_body]
    layouts = [
        f"INNER: gl.constexpr = {w.ext(inner)}",
        f"COLS: gl.constexpr = {w.ext(col)}",
        "S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
        "instr_shape=[16, BLOCK_J, 16])",
        "O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
        "instr_shape=[16, COLS, 16])",
        "P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)",
        "S_ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)",
        "S_COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)",
        "O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)"]
    tile_body = head + rows + w.blocks["prologue"] + bounds + [
        f"a_tile = a_smem.reshape([BLOCK_I, INNER]).slice(ME * {ROWS}, {ROWS})"] + [
        *w.blocks["init0"]] + [
        f"acc = gl.zeros([{ROWS}, COLS], gl.float32, O_LAYOUT)",
        f"p16 = gl.zeros([{ROWS}, BLOCK_J], {dt}, P_LAYOUT)   # the first block's P V adds nothing",
        f"zeros_s = gl.zeros([{ROWS}, BLOCK_J], gl.float32, S_LAYOUT)",
        "first = it",
        "prev_stage = it % STAGES",
        "mbarrier.wait(a_bar, tiles_done & 1)"]
    # (peeling the first block out of the loops, to skip its empty P V, ran slower on an H100: 0.75x cuDNN
    # instead of 0.84x at grouped-query S 1024, 0.95x instead of 1.00x at global S 4096)
    if listed:   # the partial blocks with the mask's test, then the full ones without it
        loops = ((listed[2], True), (listed[3], False))
    else:
        loops = (([f"for start in range({lo}, {hi}, BLOCK_J):"], masked) for lo, hi, masked in
                 (("lo", "full_lo", True), ("full_lo", "full_hi", False), ("full_hi", "hi", True)))
    for header, masked in loops:
        tile_body += header
        tile_body += ["    " + x for x in _block_lines(w, f"body0{'m' if masked else 'u'}", masked)]
    tile_body += ["if O_BUF:   # every A B^T of the tile is done: the producer may copy the next tile's A",
                  "    mbarrier.arrive(a_free, count=1)",
                  "# the last block's P V (a turn is taken even without blocks, so both consumers take as many)"]
    tile_body += [
        TAKE_TURN,
        "if it > first:",
        "    if O_BUF:",
        "        mbarrier.wait(v_ready.index(prev_stage), ((it - 1) // STAGES) & 1)",
        "    acc = warpgroup_mma(p16, v_smem.index(prev_stage).reshape([BLOCK_J, COLS]), acc, is_async=True)",
        "    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))"] + PASS_TURN + [
        "mbarrier.arrive(v_free.index(prev_stage), count=1, pred=it > first)",
        "# the output leaves through a buffer of its own where shared memory holds one (O_BUF), else through this",
        "# consumer's rows of A, which no product reads any more (storing it from registers instead, with A freed",
        "# after the last A B^T, ran slower on an H100: 0.85x cuDNN instead of 0.90x at global S 1024, 0.87x",
        "# instead of 0.93x at grouped-query S 1024)"]
    tile_body += w.blocks["epilogue"]
    for stem, code, axes in m.extras:   # a row vector of each consumer's rows (a row max, a row sum)
        ptr = " + ".join([f"{stem}_ptr"] + [f"{f'offs_{a}' if a == w.row else a} * {stem}_s{k}"
                                            for k, a in enumerate(axes)])
        tile_body.append(f"gl.store({ptr}, gl.convert_layout({code}, S_ROWS).to(gl.float32), mask=valid_{w.row})")
    out_value, where = f"{out.code}.to({GLUON_DTYPE[w.spec.output_dtype]})", ", ".join(out_coords)
    tile_body += [
        "if O_BUF:   # the last tile's output has left this buffer long since: the wait costs nothing",
        "    tma.store_wait(pendings=0)",
        f"    o_smem.index(ME).reshape([{ROWS}, COLS]).store({out_value})",
        "    fence_async_shared()",
        f"    tma.async_copy_shared_to_global(out_desc, [{where}], o_smem.index(ME))",
        "else:",
        f"    a_tile.store({out_value})",
        "    fence_async_shared()",
        f"    tma.async_copy_shared_to_global(out_desc, [{where}], a_smem.slice(ME * {ROWS}, {ROWS}, "
        f"dim={len(out_coords) - 2}))",
        "    tma.store_wait(pendings=0)",
        "    mbarrier.arrive(a_free, count=1)",
        "tiles_done += 1"]
    consumer = layouts + [
        "if O_BUF:   # V's stage has a barrier of its own (B's is released after its A B^T)",
        "    v_free = v_empty",
        "else:   # a stage of B and V, released once both consumers' P V of it is done",
        "    v_free = kv_empty",
        "it = 0   # key blocks used, over all tiles (ring stage and phase)", "turn = 0",
                          "tiles_done = 0", *slot_loop(tiles, ordered)] + [
        "    " + x for x in tile_body] + ["tma.store_wait(pendings=0)   # the last tile's output"]

    args = ", ".join(params + shared)
    sig = ", ".join(params + shared + [f"{c}: gl.constexpr" for c in consts])
    top_sig = ", ".join(params + [f"{c}: gl.constexpr" for c in consts])
    kernel = [
        f"a_smem = gl.allocate_shared_memory({dt}, {dims_of(a_blocks)}, {a_param}.layout)",
        f"b_smem = gl.allocate_shared_memory({dt}, [STAGES] + {dims_of(b_blocks)}, {b_param}.layout)",
        f"v_smem = gl.allocate_shared_memory({dt}, [STAGES] + {dims_of(v_blocks)}, {v_param}.layout)",
        "if O_BUF:",
        f"    o_smem = gl.allocate_shared_memory({GLUON_DTYPE[w.spec.output_dtype]}, [{CONSUMERS}] + "
        f"{dims_of(out_block)}, out_desc.layout)",
        "else:",
        "    o_smem = a_smem   # (not read: the output leaves through A)",
        "a_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        *[f"{ring}_{state} = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())"
          for ring in ("kv", "v") for state in ("ready", "empty")],
        f"turns = gl.allocate_shared_memory(gl.int64, [{CONSUMERS}, 1], mbarrier.MBarrierLayout())",
        "a_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())",
        "mbarrier.init(a_bar, count=1)",
        f"mbarrier.init(a_free, count={CONSUMERS})   # both consumers are done with A",
        "for s in gl.static_range(STAGES):",
        "    mbarrier.init(kv_ready.index(s), count=1)",
        "    mbarrier.init(v_ready.index(s), count=1)   # (V's own barriers: with O_BUF alone)",
        f"    mbarrier.init(kv_empty.index(s), count={CONSUMERS})   # both consumers release a stage",
        f"    mbarrier.init(v_empty.index(s), count={CONSUMERS})",
        f"for c in gl.static_range({CONSUMERS}):",
        "    mbarrier.init(turns.index(c), count=1)",
        "fence_async_shared()",
        *start_partitions(name, f"{args}, {', '.join(consts)}")]
    src = (f"@gluon.jit\ndef {name}_producer({sig}):\n" + textwrap.indent("\n".join(producer), "    ") +
           f"\n\n\n@gluon.jit\ndef {name}_consumer({sig}, ME: gl.constexpr):\n"
           + textwrap.indent("\n".join(consumer), "    ") +
           f"\n\n\n{jit_decorator('gluon', grid_sizes(w, params))}\ndef {name}_gluon_kernel({top_sig}):\n" + textwrap.indent("\n".join(kernel), "    ")
           + "\n")
    w.params, w.constexprs = params, consts
    w.out_block = out_block
    return src, w


# A listed mask runs the Gluon kernel where its table is of positions only, not skewed, and at most this share of
# its blocks is partial. On an H200 (bench/results/h200/2026-11-26-masks/gluon-for-every-listed-mask) it ran
# prefix-LM, block-causal, chunked and sliding-window masks 1.05-1.3x faster than the Triton kernel, but masks of
# mostly partial blocks (dilated windows, neighborhoods: the mask tested per element) 0.8-0.9x, global tokens
# (skewed) 0.7x, and document masks at 4096 0.6-0.8x; a table rebuilt from tensors per call cannot be read
# without a wait.
GLUON_PARTIAL_SHARE = 0.5


def lists_suit_gluon(w: GluonWriter) -> str:
    """The condition under which a listed mask's call takes the Gluon kernel (GLUON_PARTIAL_SHARE)."""
    return " and ".join(f"{t.param}_partial_share is not None and not {t.param}_skewed and "
                        f"{t.param}_partial_share <= {GLUON_PARTIAL_SHARE}" for t in w.tables.values())
