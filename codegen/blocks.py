"""Block classification derived from a mask predicate: which key blocks each row block must visit.

For a predicate that is not a conjunction of linear bounds (masks.py gives those closed-form loop bounds),
the generated module evaluates the predicate in interval arithmetic (intervals.py) over every (row block,
key block) pair, with the grid axes the predicate reads taken one value at a time, and classifies each pair
empty (no element kept: skipped), full (every element kept: run without the per-element test) or partial.
The kernel then walks a per-row-block list of partial key blocks and one of full key blocks. A predicate
that reads only positions is classified once per sizes and block sizes; one that reads tensors (a document
id per position) again whenever those tensors change (runtime/tables.py's _derived_table).

Nothing here knows what the predicate means: it is whatever the spec's `where` tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from neptune_eqsat import ir
from neptune_eqsat.ir import Term

from . import block_kernel, masks, row_order


@dataclass(frozen=True)
class BlockTable:
    """A pass's classified predicate: kernel parameter `param`, built by generated function `builder`."""
    pred: Term
    param: str
    builder: str
    grid_axes: tuple[str, ...]   # grid axes the predicate reads (dimensions of the table, in this order)

    @property
    def tensors(self) -> list[str]:
        """Inputs the predicate reads (their values change the table)."""
        return list(dict.fromkeys(t.attrs[0] for t in ir.walk(self.pred) if t.op == "load"))


def table_predicate(w, reds: list[Term]) -> Term | None:
    """The mask predicate of a pass to classify in blocks (the conjunction of its masks), or None: no mask, a
    mask of closed-form linear bounds, masked elements that do not give every reduction its identity (so an
    empty block could not be skipped), a predicate over axes that are neither rows, keys nor program indices,
    or one that reads an input per (row, key) element."""
    if w.row is None or w.loop is None:
        return None
    used = {m for r in reds for m in masks.mask_wheres(r, w.loop)}
    preds = sorted({m.args[0] for m in used}, key=ir.show)
    if not preds:
        return None
    # several masks (a mask_mod and a score_mod sending scores to -inf): an element is kept where all hold, and
    # a block may be skipped where some fails for each element, when any one of them alone gives every
    # reduction its identity
    if len(preds) > 1 and not all(masks.skippable(reds, [m], w.loop) for m in used):
        return None
    pred = preds[0]
    for extra in preds[1:]:
        pred = ir.bin("and", pred, extra)
    closed_form = masks.key_bounds(pred, w.row, w.loop, lambda k: "x", "i_lo", "i_hi", "n") is not None
    if closed_form or not pred.free <= {w.row, w.loop, *w.s.grid}:
        return None
    # a value read per (row, key) element (a dense mask): its blocks would be classified at every call at the
    # cost of reading it whole, only to be found partial (a block's hull of it is the whole tensor's)
    if any(t.op == "load" and {w.row, w.loop} <= t.free for t in ir.walk(pred)):
        return None
    return pred if masks.skippable(reds, list(used), w.loop) else None


def builder_source(table: BlockTable, w) -> str:
    """def <builder>(BLOCK_ROW, BLOCK_LOOP, device, <sizes>, <tensors>) -> int32 block lists."""
    return _builder(table, w)[0]


def builder_sizes(table: BlockTable, w) -> list[str]:
    """The run-time sizes the builder takes, in order, after BLOCK_ROW, BLOCK_LOOP and device."""
    return _builder(table, w)[1]


def _builder(table: BlockTable, w) -> tuple[str, list[str]]:
    order = list(table.grid_axes) + [w.row, w.loop]
    ndim = len(order)
    lines: list[str] = []
    names: dict[Term, str] = {}
    sizes: list[str] = []

    def size(ax: str) -> str:
        e = w.ext(ax)
        if not e.isdigit() and e not in sizes:
            sizes.append(e)
        return e

    blocks = {w.row: "BLOCK_ROW", w.loop: "BLOCK_LOOP"}
    points: dict[str, dict[Term, str]] = {a: {} for a in blocks}   # per axis: terms evaluated at each position
    for pos, ax in enumerate(order):
        if ax in blocks:
            code = f"_iv_axis_blocks({size(ax)}, {blocks[ax]}, {pos}, {ndim}, device)"
            lines.append(f"pt_{ax} = _iv_axis_points({size(ax)}, {pos}, {ndim}, device)")
            points[ax][ir.axis(ax)] = f"pt_{ax}"
        else:
            code = f"_iv_axis_points({size(ax)}, {pos}, {ndim}, device)"
            for at_axis in points.values():
                at_axis[ir.axis(ax)] = f"ax_{ax}"
        names[ir.axis(ax)] = f"ax_{ax}"
        lines.append(f"ax_{ax} = {code}")
    ranged = set(blocks)

    def emit(t: Term, at_points: str | None = None) -> str:
        """t's interval over each block pair, or at each position of axis `at_points` (exact there)."""
        memo = names if at_points is None else points[at_points]
        if t in memo:
            return memo[t]
        op, at, ar = t.op, t.attrs, t.args
        one = t.free & ranged
        if at_points is None and len(one) == 1 and op not in ("axis", "dim", "const"):
            # a value of one axis (a document id per row): computed at every position and summarized per block,
            # exact where intervals of its parts would widen (doc[i] over a block is its least to greatest id)
            ax = next(iter(one))
            return record(t, f"_iv_blockwise({emit(t, ax)}, {order.index(ax)}, {blocks[ax]})", names)

        def sub(x: Term) -> str:   # a child, in the same mode
            return emit(x, at_points)
        if op == "dim":
            if at[0] not in sizes:
                sizes.append(at[0])
            code = f"_iv_const({at[0]}, device)"
        elif op == "const":
            code = f"_iv_const({at[0]!r}, device)" if at[0] == at[0] and abs(at[0]) != float("inf") else \
                f"_iv_const(float({str(at[0])!r}), device)"
        elif op == "load":
            spans = () if at_points else tuple(k for k, x in enumerate(ar) if x.free & ranged)
            code = f"_iv_load({at[0]}, ({''.join(sub(x) + ', ' for x in ar)}), {spans!r})"
        elif op == "un":
            code = f"_iv_un({at[0]!r}, {sub(ar[0])})"
        elif op == "bin":
            code = f"_iv_bin({at[0]!r}, {sub(ar[0])}, {sub(ar[1])})"
        elif op == "where":
            code = f"_iv_where({sub(ar[0])}, {sub(ar[1])}, {sub(ar[2])})"
        elif op == "cast":
            code = f"_iv_cast({at[0]!r}, {sub(ar[0])})"
        else:
            raise ValueError(f"cannot classify blocks of {op}")
        return record(t, code, memo)

    def record(t: Term, code: str, memo: dict) -> str:
        var = f"v{len(lines)}"
        lines.append(f"{var} = {code}")
        memo[t] = var
        return var

    result = emit(table.pred)
    shape = [size(a) for a in table.grid_axes] + [f"-(-{size(w.row)} // BLOCK_ROW)",
                                                   f"-(-{size(w.loop)} // BLOCK_LOOP)"]
    lines.append(f"return _block_lists(_iv_classes({result}, ({', '.join(shape)},), {size(w.loop)}, BLOCK_LOOP, "
                 f"{ndim - 1}))")
    args = ", ".join(["BLOCK_ROW", "BLOCK_LOOP", "device"] + sizes + table.tensors)
    doc = f'    """Key blocks to visit per row block where {ir.show(table.pred)[:80]} may hold."""'
    return f"def {table.builder}({args}):\n{doc}\n" + "\n".join("    " + x for x in lines) + "\n", sizes


def builder_call(table: BlockTable, w, cfg: str, blocks: tuple[str, str] | None = None) -> str:
    """The launcher line building (or fetching) the table, for the kernel's row and loop blocks (`blocks`:
    their names in `cfg` where they are not BLOCK_<axis>)."""
    sizes = builder_sizes(table, w)
    row_block, loop_block = blocks or ("BLOCK_" + w.row.upper(), "BLOCK_" + w.loop.upper())
    consts = f"({cfg}[{row_block!r}], {cfg}[{loop_block!r}], device, " + "".join(f"{s}, " for s in sizes) + ")"
    tensors = "(" + "".join(f"{t}, " for t in table.tensors) + ")"
    p = table.param
    return f"    {p}, {p}_skewed, {p}_partial_share = _block_table(rec, {table.builder}, {consts}, {tensors})"


def kernel_lines(table: BlockTable, w) -> tuple[list[str], list[str], list[str], list[str]]:
    """(lines locating the program's lists, the partial loop header, the full loop header, the header of one
    loop over both lists, partial blocks first: a first call's quick kernel runs the masked body over it)."""
    flat = "0"
    for g in table.grid_axes:
        flat = g if flat == "0" else f"({flat}) * {w.ext(g)} + {g}"
    n_kb, n_rb = block_counts(w)
    bj, p, L = w.block(w.loop), table.param, w.lang
    lines = [f"n_kb = {n_kb}",
             f"{p}_row = ({flat}) * {n_rb} + pid_row",
             f"{p}_at = {p}_ptr + {p}_row.to({L}.int64) * (2 * n_kb + 2)",
             f"{p}_partial = {L}.load({p}_at)", f"{p}_full = {L}.load({p}_at + n_kb + 1)"]
    ranges = {"partial": ("0", f"{p}_partial"), "full": ("0", f"{p}_full")}
    if w.s.split:   # split over the key axis: each chunk program takes its share of each list
        for kind in ranges:
            lines += [f"{p}_{kind}_share = ({p}_{kind} + {L}.num_programs(2) - 1) // {L}.num_programs(2)",
                      f"{p}_{kind}_lo = {L}.minimum(pid_chunk * {p}_{kind}_share, {p}_{kind})",
                      f"{p}_{kind}_hi = {L}.minimum({p}_{kind}_lo + {p}_{kind}_share, {p}_{kind})"]
            ranges[kind] = (f"{p}_{kind}_lo", f"{p}_{kind}_hi")
    partial = [f"for blk in range({', '.join(ranges['partial'])}):", f"    start = {L}.load({p}_at + 1 + blk) * {bj}"]
    full = [f"for blk in range({', '.join(ranges['full'])}):", f"    start = {L}.load({p}_at + n_kb + 2 + blk) * {bj}"]
    count, start = listed_blocks(table, w, ranges, "blk")
    return lines, partial, full, [f"for blk in range(0, {count}):", f"    start = {start}"]


def listed_blocks(table: BlockTable, w, ranges: dict | None = None, index: str = "blk") -> tuple[str, str]:
    """Kernel code for the number of loop blocks a program visits over both lists (partial blocks first) and for
    the first loop index of its block number `index` (kernel_lines' names; `ranges`: each list's share)."""
    p, L, bj = table.param, w.lang, w.block(w.loop)
    (p_lo, p_hi), (f_lo, f_hi) = (ranges or {}).get("partial", ("0", f"{p}_partial")), \
        (ranges or {}).get("full", ("0", f"{p}_full"))
    count = f"({p_hi}) - ({p_lo}) + ({f_hi}) - ({f_lo})"
    start = (f"{L}.load({L}.where({index} < ({p_hi}) - ({p_lo}), {p}_at + 1 + ({p_lo}) + {index}, "
             f"{p}_at + n_kb + 2 + ({f_lo}) + {index} - (({p_hi}) - ({p_lo})))) * {bj}")
    return count, start


def block_counts(w) -> tuple[str, str]:
    """Kernel code for the numbers of key blocks and of row blocks."""
    return tuple(f"(({w.ext(a)} + {w.block(a)} - 1) // {w.block(a)})" for a in (w.loop, w.row))


def order_code(table: BlockTable, w, rank: str | None = None, counts: tuple[str, str] | None = None) -> str:
    """The row block of rank `rank` (default: program axis {0}'s id, a format field) in the order after the
    lists (see intervals._block_lists): after one list pair per row block of each grid value the predicate
    reads. `counts`: block_counts(w) as the kernel names its blocks, where it renames them."""
    n_kb, n_rb = counts or block_counts(w)
    entries = " * ".join([w.ext(g) for g in table.grid_axes] + [n_rb])
    rank = rank or f"{w.lang}.program_id({{}})"
    return f"{w.lang}.load({table.param}_ptr + ({entries}) * (2 * {n_kb} + 2) + {rank})"


def helpers_source(w) -> str:
    """The builders of the kernel's tables, for the generated module ("" if none): a mask of positions only in
    torch operations over the interval runtime (built once per sizes), a mask that reads tensors as one
    classifying kernel (built again whenever they change)."""
    positions = [t for t in w.tables.values() if not t.tensors]
    reading = [t for t in w.tables.values() if t.tensors]
    parts = ([runtime_source()] if positions else []) + ([row_order.ORDER_SOURCE] if reading else [])
    parts += [builder_source(t, w) for t in positions]
    parts += [block_kernel.kernel_source(t, w, builder_sizes(t, w)) for t in reading]
    return "\n\n".join(parts) + "\n\n" if parts else ""


def runtime_source() -> str:
    """The interval runtime (intervals.py) without its module header and imports."""
    text = (Path(__file__).parent / "intervals.py").read_text()
    marker = "# ---- copied into every generated module from here on\n"
    return text[text.index(marker) + len(marker):].rstrip() + "\n"
