"""Stages: a reduction computed once by a spec of its own, its result read back by later kernels as a tensor.

The backward pass saves the forward's row statistics this way (`autodiff.py`). A forward that no one kernel
runs -- reductions over several long axes at once, as a softmax over (i, j) jointly, where a kernel loops over
one axis -- is planned the same way (`staged`): the innermost reductions over long axes become stages, round
after round, until what is left schedules as one kernel; each stage is a spec that the compiler fuses on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import is_large, schedule
from neptune_eqsat.frontend.spec import Extent, Spec, SpecError, Tensor
from neptune_eqsat.rules.statistics import log_normalized


@dataclass(frozen=True)
class Stage:
    """A tensor computed by its own spec before the kernels that read it (as `load(name, *axes)`): a saved value
    of the forward, a row statistic of the adjoint, a reduction of a staged forward."""
    name: str
    spec: Spec
    axes: tuple[str, ...]


def fresh_name(spec: Spec, base: str, extra: dict | None = None) -> str:
    name, k = base, 0
    while name in spec.inputs or name in (extra or {}) or name in spec.axes_ or name in spec.dims_:
        k += 1
        name = f"{base}{k}"
    return name


def stage_dtype(spec: Spec) -> str:
    """The dtype a stage's values (a row statistic, a saved value) keep: fp32, or fp64 in a spec of fp64."""
    return "f64" if "f64" in {t.dtype for t in spec.inputs.values()} | {spec.output_dtype} else "f32"


def tensor_of(spec: Spec, axes: tuple[str, ...], dtype: str) -> tuple[str, tuple[Extent, ...]]:
    return dtype, tuple(spec.axes_[a] for a in axes)


def sub_spec(spec: Spec, name: str, term: Term, axes: tuple[str, ...], extra: dict, doc: str) -> Spec:
    """A spec over the same dims and axes reading the inputs `term` reads (the spec's, in their order, then the
    `extra` tensors: name -> (dtype, shape)), with output `term` over `axes` in fp32."""
    sub = Spec(f"{spec.name}_{name}" if not name.startswith(spec.name) else name)
    read = {t.attrs[0] for t in ir.walk(term) if t.op == "load"}
    for n, t in spec.inputs.items():
        if n in read:
            sub.inputs[n] = Tensor(sub, n, t.dtype, t.shape, t.positive, t.source)
    for n, (dtype, shape) in extra.items():
        if n in read:
            sub.inputs[n] = Tensor(sub, n, dtype, shape, False, f"stage {n}")
    missing = read - set(sub.inputs)
    if missing:
        raise SpecError(f"spec {spec.name}: a stage reads unknown tensors {sorted(missing)}")
    # a size the term or its output runs over that no input read carries (a gradient spread evenly over a row,
    # g / N; a row max of scores made from positions alone): an input of the spec that has it comes along,
    # unread, so that a call takes the size from its shape
    carried = {e.name for t in sub.inputs.values() for e in t.shape if not isinstance(e, int)}
    reduced = [x.attrs[1] for x in ir.walk(term) if ir.is_reduction(x)]   # (a max over keys no key tensor feeds)
    needed = [e.name for a in [*axes, *reduced] if not isinstance(e := spec.extent(a), int)] + \
        [x.attrs[0] for x in ir.walk(term) if x.op == "dim"]
    for size in dict.fromkeys(needed):
        holder = next(((n, t) for n, t in spec.inputs.items() if size in {getattr(e, "name", None) for e in t.shape}),
                      None)
        if size not in carried and holder is not None:
            n, t = holder
            sub.inputs[n] = Tensor(sub, n, t.dtype, t.shape, t.positive, t.source)
            carried |= {e.name for e in t.shape if not isinstance(e, int)}
    # only the axes and sizes this spec uses: a size no input carries could not be bound at run time
    used = {x.attrs[0] for x in ir.walk(term) if x.op == "axis"} | set(axes) | \
        {x.attrs[1] for x in ir.walk(term) if ir.is_reduction(x)}
    sub.axes_ = {a: e for a, e in spec.axes_.items() if a in used}
    sized = {e.name for e in sub.axes_.values() if not isinstance(e, int)} | \
        {x.attrs[0] for x in ir.walk(term) if x.op == "dim"} | \
        {e.name for t in sub.inputs.values() for e in t.shape if not isinstance(e, int)}
    sub.dims_ = {n: d for n, d in spec.dims_.items() if n in sized}
    sub.typical = {n: v for n, v in spec.typical.items() if n in sized}
    sub.output_name, sub.output_dtype, sub.output_term, sub.output_axes = name, stage_dtype(spec), term, tuple(axes)
    sub.doc = doc
    sub.validate()
    return sub


def _innermost_long(spec: Spec, term: Term) -> list[Term]:
    """Reductions over a long axis whose bodies reduce over no long axis, outermost occurrences first."""
    found: list[Term] = []
    for t in ir.walk(term):
        if ir.is_reduction(t) and is_large(spec.axes_[t.attrs[1]]) and t not in found and not any(
                ir.is_reduction(x) and is_large(spec.axes_[x.attrs[1]]) for x in ir.walk(t.args[0])):
            found.append(t)
    return found


def _statistics(spec: Spec, term: Term, extra: dict) -> list[Term]:
    """The terms to stage this round: each innermost reduction over a long axis, widened to the largest term
    around it with the same free axes that reduces over that axis alone (a mean sum / N; m + log(sum_j exp(x -
    m)), which one stage computes in one pass) and reads no size its tensors do not carry (a stage binds its
    sizes from them), outermost first; none inside another."""
    parents: dict[Term, list[Term]] = {}
    for t in ir.walk(term):
        for a in t.args:
            parents.setdefault(a, []).append(t)
    shapes = {n: t.shape for n, t in spec.inputs.items()} | {n: shape for n, (_, shape) in extra.items()}

    def over(t: Term, ax: str) -> bool:
        if any(ir.is_reduction(x) and is_large(spec.axes_[x.attrs[1]]) and x.attrs[1] != ax for x in ir.walk(t)):
            return False
        carried = {e.name for x in ir.walk(t) if x.op == "load" for e in shapes[x.attrs[0]] if not isinstance(e, int)}
        return {x.attrs[0] for x in ir.walk(t) if x.op == "dim"} <= carried

    tops: list[Term] = []
    for r in _innermost_long(spec, term):
        top = r
        while True:
            up = next((p for p in parents.get(top, []) if p.free == r.free and over(p, r.attrs[1])), None)
            if up is None:
                break
            top = up
        if top not in tops:
            tops.append(top)
    return [t for t in tops if not any(t is not u and t in set(ir.walk(u)) for u in tops)]


def staged(spec: Spec, max_rounds: int = 8, every: bool = False) -> tuple[list[Stage], Spec]:
    """The stages (in the order they run) and the last spec, which reads them and writes the output. By default
    only what no one kernel runs is staged (raising the scheduling error when staging does not help); `every`
    stages every reduction over a long axis, so that the last kernel reduces over none: an output that runs
    along a long reduced axis (a softmax over a few very long rows) is then written by a kernel parallel over
    all of it, and each stage may be split into chunks."""
    stages: list[Stage] = []
    extra: dict = {}
    term = log_normalized(spec.output_term)
    for _ in range(max_rounds):
        last = sub_spec(spec, spec.output_name, term, spec.output_axes, extra, spec.doc)
        last.name, last.output_dtype = f"{spec.name}_last", spec.output_dtype
        inner = _statistics(spec, term, extra)
        try:
            schedule(last, last.output_term)
            # a reduction over a long axis of stages alone (the sum of the rows' sums) is a small kernel of its
            # own; left in the last kernel, every program of it would reduce it again along its loop
            if not every:
                inner = [r for r in inner if {x.attrs[0] for x in ir.walk(r) if x.op == "load"} <= set(extra)]
            if not inner or not (stages or every):
                return stages, last
        except SpecError:
            if not inner or inner == [term]:   # nothing to stage but the whole term
                raise
        done: dict[Term, Term] = {}
        for r in inner:
            axes = tuple(a for a in spec.axes_ if a in r.free)
            name = fresh_name(spec, f"stage{len(stages)}", extra)
            stages.append(Stage(name, sub_spec(spec, name, r, axes, extra, f"a stage of {spec.name}"), axes))
            extra[name] = tensor_of(spec, axes, stage_dtype(spec))
            done[r] = ir.load(name, *(ir.axis(a) for a in axes))
        term = ir.substitute(term, done)
    raise SpecError(f"spec {spec.name}: still no one kernel runs it after {max_rounds} rounds of stages")
