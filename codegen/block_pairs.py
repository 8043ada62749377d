"""The classifying kernel for short axes: every (row block, key block) pair of one grid value in one program.

block_kernel.py's kernel runs a program per row block, chains its loads over chunks of key blocks, and leaves
the ordering of the row blocks to the last program to finish (a ticket and a second round of loads). Where both
axes fit one tile of positions (a few thousand), one program can hold the whole problem: the values of the row
axis summarized per row block as a column [RB_PAD, 1], those of the key axis per key block as a row [1, KB_PAD],
the predicate's interval over every pair at once by broadcasting, the lists compacted by a prefix sum along each
row, and the row blocks ranked in registers. That is one round of loads and one of stores, against several.

The interval arithmetic is block_kernel.py's emitter, unchanged but for the shapes of the block summaries; its
lines are the same, so both kernels give the same classes (tests/test_block_classes.py checks they agree).
"""
from __future__ import annotations

from neptune_eqsat import ir

from .block_emitter import DEPENDENT_HEAD, _Emitter, _ranks, class_lines, kernel_params

# positions a program summarizes at once along each axis (pads of the block counts times the block)
ONE_PROGRAM_POSITIONS = 8192
WARPS = 8


class _PairsEmitter(_Emitter):
    """The emitter with block summaries shaped for broadcasting: row blocks down, key blocks across."""

    def summary(self, ax) -> tuple[int, str]:   # positions of a block along axis 1 of a [blocks, BLOCK] tile
        return 1, "[:, None]" if ax == self.row else "[None, :]"


def kernel_source(table, w, sizes: list[str], grid_lines: list[str]) -> str:
    """`{builder}_pairs_kernel`: one program per grid value (entry), writing the same lists and order as
    block_kernel's kernel (the launcher in block_kernel.py picks it where the axes are short)."""
    e = _PairsEmitter(w, table.grid_axes, _ranks(table.pred))
    always, maybe = e.truth(e.emit(table.pred), lambda code: e.new(code, True))
    tensor_params, ints = kernel_params(table, sizes)
    row_n, key_n = w.ext(w.row), w.ext(w.loop)
    lines = [
        *DEPENDENT_HEAD,
        f"n_rb = ({row_n} + BLOCK_ROW - 1) // BLOCK_ROW",
        f"n_kb = ({key_n} + BLOCK_LOOP - 1) // BLOCK_LOOP",
        "entry = tl.program_id(0)",
        *grid_lines,
        "rows = tl.arange(0, RB_PAD)",
        "rbs = rows[:, None]",
        "kbs = tl.arange(0, KB_PAD)[None, :]",
        "pi_at = rbs * BLOCK_ROW + tl.arange(0, BLOCK_ROW)[None, :]",
        f"ok_i = pi_at < {row_n}",
        "pi = pi_at.to(tl.float64)",
        "ai_lo = (rbs * BLOCK_ROW).to(tl.float64)",
        f"ai_hi = tl.minimum(rbs * BLOCK_ROW + BLOCK_ROW - 1, {row_n} - 1).to(tl.float64)",
        "pj_at = tl.arange(0, KB_PAD)[:, None] * BLOCK_LOOP + tl.arange(0, BLOCK_LOOP)[None, :]",
        f"ok_j = pj_at < {key_n}",
        "pj = pj_at.to(tl.float64)",
        "aj_lo = (kbs * BLOCK_LOOP).to(tl.float64)",
        f"aj_hi = tl.minimum(kbs * BLOCK_LOOP + BLOCK_LOOP - 1, {key_n} - 1).to(tl.float64)",
        "inexact = tl.full([], 0, tl.int32)",
        *e.pre, *e.body,   # the row side never reads the key side, so this order is their dependencies'
        "live = tl.where(rbs < n_rb, kbs < n_kb, False)",
        *class_lines("live", always, maybe, key_n),
        "lists = out_ptr + (entry * n_rb + rbs).to(tl.int64) * (2 * n_kb + 2)",
        "heads = out_ptr + (entry * n_rb + rows).to(tl.int64) * (2 * n_kb + 2)",
        "listed = kbs + tl.zeros([RB_PAD, KB_PAD], tl.int32)",
        "hit = is_partial.to(tl.int32)",
        "tl.store(lists + 1 + tl.cumsum(hit, axis=1) - hit, listed, mask=is_partial)",
        "n_partial = tl.sum(hit, axis=1)",
        "hit = is_full.to(tl.int32)",
        "tl.store(lists + n_kb + 2 + tl.cumsum(hit, axis=1) - hit, listed, mask=is_full)",
        "n_full = tl.sum(hit, axis=1)",
        "tl.store(heads, n_partial, mask=rows < n_rb)",
        "tl.store(heads + n_kb + 1, n_full, mask=rows < n_rb)",
        "if tl.num_programs(0) == 1:",   # the one entry's work is in registers: rank it there
        "    _rank_row_blocks(out_ptr + n_rb.to(tl.int64) * (2 * n_kb + 2), n_partial + n_full, rows, n_rb)",
        "else:",   # the work sums over entries: the last program to finish ranks (row_order.py)
        "    tl.debug_barrier()",
        "    if tl.atomic_add(tickets_ptr, 1) == tl.num_programs(0) - 1:",
        "        tl.store(tickets_ptr, 0)",
        "        _order_row_blocks(out_ptr, tl.num_programs(0), n_rb, n_kb, ORDER_CHUNK)",
    ]
    constexprs = ["BLOCK_ROW", "BLOCK_LOOP", "RB_PAD", "KB_PAD", "ORDER_CHUNK", "DEPENDENT"]
    params = ["out_ptr", "tickets_ptr"] + sizes + tensor_params
    return (f"@triton.jit(do_not_specialize={ints!r})\n"
            f"def {table.builder}_pairs_kernel({', '.join(params + [c + ': tl.constexpr' for c in constexprs])}):\n"
            f'    """Classify every block pair of one grid value where {ir.show(table.pred)[:60]} may hold."""\n' +
            "\n".join("    " + x for x in lines) + "\n")
