"""What the Triton and Gluon kernels share about their loops: the key range each pass visits (from the mask
predicates, masks.py), the block table of a mask classified per block (blocks.py), and the grid axes' indices."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.plan.schedule import Schedule

from . import blocks, masks
from .kernel import KernelWriter


def mask_bounds(w: KernelWriter, reds: list[ir.Term]):
    """Key-range bounds from the mask predicates the reductions use, or None."""
    used = {m for r in reds for m in masks.mask_wheres(r, w.loop)}
    preds = sorted({m.args[0] for m in used}, key=ir.show)
    if not preds or w.row is None:
        return None
    both = preds[0]
    for extra in preds[1:]:
        both = ir.bin("and", both, extra)
    name = (lambda k: k[1] if k[0] == "dim" or k[1] in w.s.grid else f"offs_{k[1]}")
    bounds = masks.key_bounds(both, w.row, w.loop, name, "i_lo", "i_hi", w.ext(w.loop), w.lang)
    if bounds is not None and not (len(preds) == 1 and masks.skippable(reds, list(used), w.loop)):
        bounds.lo_any, bounds.hi_any, bounds.work_grows = "0", w.ext(w.loop), False
    return bounds


def pass_table(w: KernelWriter, p: int, reds: list[ir.Term]) -> blocks.BlockTable | None:
    """Pass p's classified mask (one table per predicate, shared by the passes that test it), or None."""
    pred = blocks.table_predicate(w, reds)
    if pred is None:
        return None
    if pred not in w.tables:
        n = len(w.tables)
        w.tables[pred] = blocks.BlockTable(pred, f"blocks{n}", f"_{w.name}_blocks{n}",
                                           tuple(g for g in w.s.grid if g in pred.free))
    return w.tables[pred]


def pass_bounds(w: KernelWriter, p: int, reds: list[ir.Term]) -> list[str]:
    """Lines computing lo, full_lo, full_hi, hi for pass p (see masks.py)."""
    bj, n, L = w.block(w.loop), w.ext(w.loop), w.lang
    bounds = mask_bounds(w, reds)
    lines = []
    if bounds is None and any(masks.mask_wheres(r, w.loop) for r in reds):
        # a mask the bounds analysis cannot read (not linear in the row and loop axes): test it in every block
        lines += ["lo = 0", f"hi = {n}", "full_lo = 0", "full_hi = 0"]
    elif bounds is None:
        lines += ["lo = 0", f"hi = {n}", "full_lo = 0", f"full_hi = ({n} // {bj}) * {bj}"]
    else:
        lines += [f"lo = ({bounds.lo_any} // {bj}) * {bj}", f"hi = {bounds.hi_any}",
                  f"full_lo = {L}.minimum({L}.maximum((({bounds.lo_all} + {bj} - 1) // {bj}) * {bj}, lo), hi)",
                  f"full_hi = {L}.maximum({L}.minimum(({bounds.hi_all} // {bj}) * {bj}, hi), full_lo)"]
    if w.s.split:   # this program's chunk of the loop axis
        lines += [f"lo = {L}.maximum(lo, chunk_lo)", f"hi = {L}.minimum(hi, chunk_hi)",
                  f"full_lo = {L}.minimum({L}.maximum(full_lo, lo), hi)",
                  f"full_hi = {L}.maximum({L}.minimum(full_hi, hi), full_lo)"]
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
