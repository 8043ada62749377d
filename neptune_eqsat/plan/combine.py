"""The combine step of a split-K plan, as an ordinary spec and term.

A split plan runs in two kernels. The first runs the rolled loop over one chunk of the loop axis per program
and writes every split reduction's partial result to a workspace, indexed by the chunk. The second reduces
over the chunk axis: for each split reduction r, in dependency order,
    global(r) = red_f(chunk, repair_r[acc := partial_r[chunk], prev(y) := y from the chunk's partials,
                                       other reductions := their global values])
and then evaluates the rest of the term on the global values. That second computation is a term in the same
IR, so the same scheduler and code generator emit it.

The chunk partials are combined rolled, in one pass over the chunks: the reduction over chunks above is the
reduction the split rule proved, over fewer and coarser elements, so its repair serves again. Rolled over
chunk blocks, global(r) becomes
    roll_f(chunk, repair_r[acc := partial_r[chunk], prev(y) := y from the chunk's partials, y := running y],
           repair = repair_r[prev(y) := running y as the block began, y := running y])
(the running values are the other reductions, rolled the same way). One pass reads every partial once, so the
combine waits for one round of loads per block of chunks rather than one per pass.
"""
from __future__ import annotations

from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import Schedule, schedule
from neptune_eqsat.frontend.spec import Dim, Spec, Tensor


@dataclass
class Partial:
    name: str          # the workspace tensor
    reduction: Term    # the split reduction whose partials it holds
    axes: tuple[str, ...]   # its index axes after the chunk axis (the reduction's free axes, in spec order)


@dataclass
class Combine:
    spec: Spec
    sched: Schedule
    partials: list[Partial]
    chunk_axis: str
    chunk_dim: str


def combine_plan(sched: Schedule) -> Combine:
    spec, loop = sched.spec, sched.loop
    chunk_axis, chunk_dim = f"{loop}_chunk", f"N_{loop.upper()}_CHUNKS"
    partials = [Partial(f"part{k}", r, tuple(a for a in spec.axes_ if a in r.free))
                for k, r in enumerate(sched.reductions)]
    by_red = {p.reduction: p for p in partials}
    chunk = ir.axis(chunk_axis)
    glob: dict[Term, Term] = {}

    def local(r: Term) -> Term:
        p = by_red[r]
        return ir.load(p.name, chunk, *(ir.axis(a) for a in p.axes))

    def rebuild(t: Term, acc: Term, in_repair: bool, in_prev: bool = False) -> Term:
        """t with acc replaced and each split reduction by its running global value; under prev, by the chunk's
        partial (in a body) or by the running value as the block began (in a repair)."""
        if t.op == "acc":
            return acc
        if t.op == "prev":
            inner = rebuild(t.args[0], acc, in_repair, not in_repair)
            return ir.prev(chunk_axis, inner) if in_repair else inner
        if t.op == "split" and t.attrs[1] == loop:
            return local(t) if in_prev else global_(t)
        if not t.args:
            return t
        return Term(t.op, t.attrs, tuple(rebuild(a, acc, in_repair, in_prev) for a in t.args), t.origin)

    def global_(r: Term) -> Term:
        if r not in glob:
            repair = r.args[1]
            glob[r] = ir.roll(r.attrs[0], chunk_axis, rebuild(repair, local(r), False), rebuild(repair, ir.ACC, True))
        return glob[r]

    term = rebuild(sched.term, ir.ACC, False)
    cdim = Dim(chunk_dim)
    cspec = Spec(f"{spec.name}_combine", dims_={**spec.dims_, chunk_dim: cdim}, typical={**spec.typical, chunk_dim: 8},
                 axes_={**spec.axes_, chunk_axis: cdim}, output_name=spec.output_name,
                 output_dtype=spec.output_dtype, output_term=term, output_axes=spec.output_axes, doc=spec.doc,
                 output_index=spec.output_index, output_shape=spec.output_shape, derived=spec.derived)
    used = {t.attrs[0] for t in ir.walk(term) if t.op == "load"}
    cspec.inputs = {n: t for n, t in spec.inputs.items() if n in used}
    for p in partials:
        shape = (cdim,) + tuple(spec.extent(a) for a in p.axes)
        cspec.inputs[p.name] = Tensor(cspec, p.name, "f32", shape, False)
    return Combine(cspec, schedule(cspec, term), partials, chunk_axis, chunk_dim)
