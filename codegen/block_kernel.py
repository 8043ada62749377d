"""Block classification as one Triton kernel: the tables of masks that read tensors, built at every call whose
tensors changed (a document id per position), in one launch.

The interval arithmetic of block_emitter.py (the same as intervals.py, which builds the tables of masks of
positions only, once per sizes). One program per (grid value the predicate reads, row block):
* values of the row axis alone (doc[i]) are computed at each row of the block and summarized by their least
  and greatest value, before the key loop;
* the key blocks are taken KB_CHUNK at a time: values of the key axis alone (doc[j]) at each key, summarized
  per key block, then the predicate's interval per key block, its class (empty, partial, full) and the
  block's place in its list (a prefix sum over the chunk);
* the last program to finish (a ticket, as a split kernel's combine) sums the work of each row block over the
  grid values and writes the row blocks in order of decreasing work, and whether that work is skewed.
Where both axes are short, the launcher runs block_pairs.py's kernel instead: every block pair of a grid value
in one program.
"""
from __future__ import annotations

from neptune_eqsat import ir

from . import block_pairs
from .block_emitter import DEPENDENT_HEAD, _Emitter, _ranks, class_lines, kernel_params

KB_CHUNK_ELEMENTS = 2048   # keys a program summarizes at once (KB_CHUNK key blocks of BLOCK_LOOP keys)
ORDER_CHUNK = 64           # row blocks ranked at once by the last program
WARPS = 4                  # per program


def kernel_source(table, w, sizes: list[str]) -> str:
    """The classifying kernel of `table` and its launcher, def <builder>(BLOCK_ROW, BLOCK_LOOP, device, <sizes>,
    <tensors>) -> int32 block lists, laid out as intervals._block_lists lays them out."""
    e = _Emitter(w, table.grid_axes, _ranks(table.pred))
    always, maybe = e.truth(e.emit(table.pred), lambda code: e.new(code, True))
    kernel = f"{table.builder}_kernel"
    tensor_params, ints = kernel_params(table, sizes)
    row_n, key_n = w.ext(w.row), w.ext(w.loop)
    grid = []
    stride = "1"
    for ax in reversed(table.grid_axes):   # the entry is the grid values flattened, the last fastest
        grid.append(f"g_{ax} = ((entry // {stride}) % {w.ext(ax)}).to(tl.float64)")
        stride = f"({stride} * {w.ext(ax)})"   # parenthesized: entry // (1 * H), not (entry // 1) * H
    lines = [
        *DEPENDENT_HEAD,
        f"n_rb = ({row_n} + BLOCK_ROW - 1) // BLOCK_ROW",
        f"n_kb = ({key_n} + BLOCK_LOOP - 1) // BLOCK_LOOP",
        "pid = tl.program_id(0)",
        "entry = pid // n_rb",
        "rb = pid % n_rb",
        *grid,
        "pi_at = rb * BLOCK_ROW + tl.arange(0, BLOCK_ROW)",
        f"ok_i = pi_at < {row_n}",
        "pi = pi_at.to(tl.float64)",
        "ai_lo = (rb * BLOCK_ROW).to(tl.float64)",
        f"ai_hi = tl.minimum(rb * BLOCK_ROW + BLOCK_ROW - 1, {row_n} - 1).to(tl.float64)",
        "inexact = tl.full([], 0, tl.int32)",
        *e.pre,
        "lists = out_ptr + pid.to(tl.int64) * (2 * n_kb + 2)",
        "n_partial = tl.full([], 0, tl.int32)",
        "n_full = tl.full([], 0, tl.int32)",
        "for kc in range(0, n_kb, KB_CHUNK):",
        *["    " + x for x in [
            "kbs = kc + tl.arange(0, KB_CHUNK)",
            "pj_at = kbs[:, None] * BLOCK_LOOP + tl.arange(0, BLOCK_LOOP)[None, :]",
            f"ok_j = pj_at < {key_n}",
            "pj = pj_at.to(tl.float64)",
            "aj_lo = (kbs * BLOCK_LOOP).to(tl.float64)",
            f"aj_hi = tl.minimum(kbs * BLOCK_LOOP + BLOCK_LOOP - 1, {key_n} - 1).to(tl.float64)",
            *e.body,
            *class_lines("kbs < n_kb", always, maybe, key_n),
            "hit = is_partial.to(tl.int32)",
            "tl.store(lists + 1 + n_partial + tl.cumsum(hit, axis=0) - hit, kbs, mask=is_partial)",
            "n_partial += tl.sum(hit, axis=0)",
            "hit = is_full.to(tl.int32)",
            "tl.store(lists + n_kb + 2 + n_full + tl.cumsum(hit, axis=0) - hit, kbs, mask=is_full)",
            "n_full += tl.sum(hit, axis=0)"]],
        "tl.store(lists, n_partial)",
        "tl.store(lists + n_kb + 1, n_full)",
        # the last program to finish orders the row blocks (its ticket: acquire-release at GPU scope, after a
        # barrier so every thread's stores come first; it resets the ticket for the next call)
        "tl.debug_barrier()",
        "if tl.atomic_add(tickets_ptr, 1) == tl.num_programs(0) - 1:",
        "    tl.store(tickets_ptr, 0)",
        "    _order_row_blocks(out_ptr, tl.num_programs(0) // n_rb, n_rb, n_kb, ORDER_CHUNK)",
    ]
    constexprs = ["BLOCK_ROW", "BLOCK_LOOP", "KB_CHUNK", "ORDER_CHUNK", "DEPENDENT"]
    params = ["out_ptr", "tickets_ptr"] + sizes + tensor_params
    head = (f"@triton.jit(do_not_specialize={ints!r})\n"
            f"def {kernel}({', '.join(params + [c + ': tl.constexpr' for c in constexprs])}):\n"
            f'    """Classify the key blocks of each row block where {ir.show(table.pred)[:70]} may hold."""\n')
    entries = " * ".join(["1"] + [w.ext(a) for a in table.grid_axes])
    args = ", ".join(["out", "_tickets(rec, device, 1)"] + sizes +
                     [f"{t}, *{t}.shape, *{t}.stride()" for t in table.tensors])
    unspecialized = "unspecialized=frozenset(n for n, a in enumerate(args) if isinstance(a, int))"
    launcher = [
        f"def {table.builder}({', '.join(['BLOCK_ROW', 'BLOCK_LOOP', 'device'] + sizes + table.tensors)}, rec=None, "
        "one_program=None):",
        f'    """Key blocks to visit per row block where {ir.show(table.pred)[:80]} may hold (one launch,',
        '    recorded in `rec` for replay): one program per grid value where both axes are short (block_pairs.py;',
        '    `one_program` forces the choice), else one per row block."""',
        f"    n_rb, n_kb, entries = -(-{row_n} // BLOCK_ROW), -(-{key_n} // BLOCK_LOOP), {entries}",
        "    out = _empty(rec, (entries * n_rb * (2 * n_kb + 2) + 2 * n_rb + 1,), torch.int32, device)",
        "    if entries * n_rb == 0:",
        "        return out.zero_()",
        f"    args = ({args},)",
        "    dependent = _dependent_launch(device)",
        "    rb_pad, kb_pad = triton.next_power_of_2(max(n_rb, 1)), triton.next_power_of_2(max(n_kb, 1))",
        # (no keys: no key block to classify, nor a key's value to read, which one program would read regardless)
        f"    if n_kb and (one_program if one_program is not None else max(rb_pad * BLOCK_ROW, kb_pad * BLOCK_LOOP) "
        f"<= {block_pairs.ONE_PROGRAM_POSITIONS}):",
        "        cfg = {'BLOCK_ROW': BLOCK_ROW, 'BLOCK_LOOP': BLOCK_LOOP, 'RB_PAD': rb_pad, 'KB_PAD': kb_pad, "
        f"'ORDER_CHUNK': {ORDER_CHUNK}, 'DEPENDENT': dependent, 'num_warps': {block_pairs.WARPS}, 'num_stages': 1, "
        "'launch_pdl': dependent}",
        f"        _launch(rec, {table.builder}_pairs_kernel, (entries,), args, cfg, (BLOCK_ROW, BLOCK_LOOP, rb_pad, "
        f"kb_pad, {ORDER_CHUNK}, dependent), {unspecialized})",
        "        return out",
        f"    chunk = max(1, {KB_CHUNK_ELEMENTS} // BLOCK_LOOP)",
        "    cfg = {'BLOCK_ROW': BLOCK_ROW, 'BLOCK_LOOP': BLOCK_LOOP, 'KB_CHUNK': chunk, "
        f"'ORDER_CHUNK': {ORDER_CHUNK}, 'DEPENDENT': dependent, 'num_warps': {WARPS}, 'num_stages': 1, "
        "'launch_pdl': dependent}",
        f"    _launch(rec, {kernel}, (entries * n_rb,), args, cfg, (BLOCK_ROW, BLOCK_LOOP, chunk, {ORDER_CHUNK}, "
        f"dependent), {unspecialized})",
        "    return out",
    ]
    return (head + "\n".join("    " + x for x in lines) + "\n\n\n" +
            block_pairs.kernel_source(table, w, sizes, grid) + "\n\n" + "\n".join(launcher) + "\n")
