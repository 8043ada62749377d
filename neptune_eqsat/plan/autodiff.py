"""Reverse-mode differentiation of a spec: the backward pass as more specs, fused by the same e-graph.

For a spec `out[O] = T` and the gradient of a loss with respect to `out` (an input `d_out[O]`), every floating
input `x` read as `x[idx]` gets `dx[idx] += sum over the other axes of adj(x[idx])`, where the adjoint of each
sub-term is the sum over its parents of the parent's adjoint times the local derivative (`derivatives.py`),
summed over the parent's axes the child does not have. Nothing here knows about attention; for attention the
result is FlashAttention's backward, found rather than written:

* **Saved values.** A reduction of the forward whose free axes are among the output's (a row max, a row sum, the
  output itself) is a tensor no larger than the output: the backward reads it (`saved`) instead of recomputing
  it inside its own loops. Everything else (the scores, the probabilities) is recomputed from the inputs.
* **Shift-invariant maxima.** A max (or min) that the output does not depend on -- it only shifts values that a
  later division or subtraction removes, as the max of a stable softmax -- has adjoint exactly 0. That is proved
  with sympy (`shift_invariant`), not assumed; a max that is not proved invariant gets its subgradient.
* **Row statistics of the adjoint.** A reduction inside an adjoint whose free axes are among the output's (the
  `D_i = sum_e dO * O` term) is computed once by its own kernel (`stats`) and read by the gradient kernels.
* **Gradient kernels.** Each (input, index) pair is one spec whose output runs over the index's axes and whose
  loop reduces over one further axis (dK and dV loop over the queries, dQ over the keys); more axes to sum
  are summed on the host, and an index that is not a plain axis (a key head `h // G`, a bias table read at
  `clamp(i - j)`) is scattered with an accumulating index_put on the host. Parts with the same output axes
  and loop are one kernel with several outputs (dK and dV: the probabilities recomputed once for both).
* **Saved values from the forward kernel.** The saved values are also further outputs the forward kernel can
  write (`forward_spec`): a training step's forward computes the row max and row sum anyway.

This module builds specs only; `training.py` compiles and runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from neptune_eqsat import ir
from neptune_eqsat.plan.derivatives import local_adjoints, over_broadcast, plus, shift_invariant, total
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import is_large
from neptune_eqsat.frontend.spec import Output, Spec, SpecError
from neptune_eqsat.plan.stages import Stage, fresh_name, stage_dtype, tensor_of
from neptune_eqsat.plan.staging import Stager, sub_spec_in_products

FLOATS = ("f16", "bf16", "f32", "f64")


@dataclass(frozen=True)
class GradPart:
    """One gradient kernel: its spec's output, summed over `host_sum` (trailing output axes), is scattered into
    the gradient of `input` at `index` (terms of the output's remaining axes)."""
    input: str
    spec: Spec
    index: tuple[Term, ...]
    axes: tuple[str, ...]          # the index's axes; the output has those the gradient varies along
    host_sum: tuple[str, ...] = ()
    loop: str | None = None        # the axis its kernel's loop reduces over
    as_is: bool = False            # the input's whole gradient, in its dtype: the host takes the output as it is
    sole: bool = False             # the input's only part: what the host makes of it is the input's gradient
    added: bool = False            # added into by every program of another kernel's loop (`_accumulated`)
    added_sum: bool = False        # ... and a value per row of that loop, not a product's tile (a slope's gradient)

    @property
    def groups(self) -> tuple[tuple[int, int], ...] | None:
        """Where the index reads dimension k at `axis // c` (a query head's key head h // G) and every other
        dimension by its own axis, in order: the gradient is the output summed over groups of c along k, (k, c)
        for each such dimension; None where the index is anything else (scattered with index_put)."""
        if len(self.index) != len(self.axes):
            return None
        found = []
        for k, (t, ax) in enumerate(zip(self.index, self.axes)):
            if t == ir.axis(ax):
                continue
            if (t.op == "bin" and t.attrs[0] == "floordiv" and t.args[0] == ir.axis(ax) and t.args[1].op == "const"
                    and t.args[1].attrs[0] == int(t.args[1].attrs[0]) >= 1):
                found.append((k, int(t.args[1].attrs[0])))
                continue
            return None
        return tuple(found)

    @property
    def direct(self) -> bool:
        """The gradient is the output as it is (broadcast along axes it does not vary along): the index reads
        each input dimension by its own axis, in order."""
        return self.groups == ()

    @property
    def whole(self) -> bool:
        """The kernel's output is the gradient itself: direct, of the input's shape, with nothing to sum."""
        return self.direct and not self.host_sum and len(self.spec.output_axes) == len(self.axes)


@dataclass(frozen=True)
class GradKernel:
    """One gradient kernel: its spec's outputs are the parts' (in order), each scattered as its part says."""
    spec: Spec
    parts: tuple[GradPart, ...]

    @property
    def adds(self) -> bool:
        """Do its programs add an output across the loop (atomic adds: the sum's order varies)?"""
        return any(p.added for p in self.parts)

    @property
    def adds_sums(self) -> bool:
        """Is one of the outputs it adds a value per row of its loop (a sum over its own rows)?"""
        return any(p.added_sum for p in self.parts)


@dataclass
class Backward:
    forward: Spec
    grad_name: str                       # the input holding the output's gradient
    out_name: str = ""                   # the input holding the forward's output
    stages: list[Stage] = field(default_factory=list)   # in dependency order
    parts: list[GradPart] = field(default_factory=list)
    wrt: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)      # what the derivation decided, for --explain
    kernels: list[GradKernel] = field(default_factory=list)   # the parts, those sharing a loop in one kernel
    saved: dict[str, Term] = field(default_factory=dict)      # saved stage -> its value as the forward has it

    def reads(self, provided: frozenset[str] = frozenset(), wanted: set[str] | None = None) -> set[str]:
        """What computing `wanted` (default: what the gradient kernels read) needs with the tensors named in
        `provided` at hand: `wanted` itself, and what the stages among it that are not provided read."""
        need = {n for k in self.kernels for n in k.spec.inputs} if wanted is None else set(wanted)
        for s in reversed(self.stages):   # a stage reads only stages before it
            if s.name in need and s.name not in provided:
                need |= set(s.spec.inputs)
        return need

    def stages_to_run(self, provided: frozenset[str], wanted: set[str] | None = None) -> list[Stage]:
        """The stages to compute, in order, with the tensors named in `provided` at hand: those the gradient
        kernels need (or those named in `wanted`, and what they need), less the provided."""
        need = self.reads(provided, wanted)
        return [s for s in self.stages if s.name in need and s.name not in provided]

    def forward_spec(self) -> Spec:
        """The forward with the saved values as further outputs, in `saved`'s order: run by a training step's
        forward, it gives the backward what its stages would compute again."""
        return replace(self.forward, also=self.forward.also + tuple(
            Output(name, stage_dtype(self.forward), t, next(s.axes for s in self.stages if s.name == name))
            for name, t in self.saved.items()))

    def explain(self) -> list[str]:
        lines = [f"backward of {self.forward.name}: gradients of {', '.join(self.wrt)}"]
        lines += [f"  {n}" for n in self.notes]
        for s in self.stages:
            lines.append(f"  stage {s.name}[{', '.join(s.axes)}] = {ir.show(s.spec.output_term)}")
        for p in self.parts:
            index = ", ".join(ir.show(t) for t in p.index)
            where = "" if p.direct else f" summed in groups at [{index}]" if p.groups else f" scattered at [{index}]"
            summed = f", host sum over {', '.join(p.host_sum)}" if p.host_sum else ""
            lines.append(f"  d{p.input}{where}{summed}: {p.spec.name} = {ir.show(p.spec.output_term)}")
        for k in self.kernels:
            if len(k.parts) > 1:
                lines.append(f"  one kernel {k.spec.name} writes {', '.join('d' + p.input for p in k.parts)} "
                             f"(loop over {k.parts[0].loop})")
        lines += [f"  {n} is also an output of the forward kernel (forward_spec)" for n in self.saved]
        return lines


def differentiate(spec: Spec, wrt: tuple[str, ...] | None = None, accumulate: bool = False) -> Backward:
    """The backward pass of `spec` with respect to the inputs `wrt` (default: every floating input). With
    `accumulate`, a kernel whose loop runs over another kernel's rows and whose rows are that kernel's loop (dQ
    beside dK and dV) becomes further outputs of the other, each program adding its share atomically: the
    values both recompute (the probabilities, dS) are computed once, and the sums come out in an order that
    varies from run to run (not deterministic)."""
    spec.validate()
    out_axes = spec.output_axes
    as_value = _read_as_value(spec.output_term)
    floats = tuple(n for n, t in spec.inputs.items() if t.dtype in FLOATS and n in as_value)
    wrt = floats if wrt is None else tuple(wrt)
    for n in wrt:
        if n not in spec.inputs:
            raise SpecError(f"spec {spec.name}: no input {n} to differentiate with respect to")
        if spec.inputs[n].dtype not in FLOATS:
            raise SpecError(f"spec {spec.name}: input {n} is {spec.inputs[n].dtype}, not differentiable")
    bw = Backward(spec, fresh_name(spec, f"d_{spec.output_name}"), wrt=wrt)
    if spec.also:
        bw.notes.append(f"the gradient of the first output, {spec.output_name}; the further outputs "
                        f"({', '.join(o.name for o in spec.also)}) are differentiated as specs of their own "
                        "(training.Differentiable adds every output's)")
    T = spec.output_term
    grad = ir.load(bw.grad_name, *(ir.axis(a) for a in out_axes))
    extra = {bw.grad_name: tensor_of(spec, out_axes, spec.output_dtype or "f32")}

    # the output itself is read, never recomputed (a quotient's derivative is written with the quotient)
    out_name = fresh_name(spec, f"out_{spec.output_name}", extra)
    extra[out_name] = tensor_of(spec, out_axes, spec.output_dtype or "f32")
    bw.out_name = out_name
    saved = {T: ir.load(out_name, *(ir.axis(a) for a in out_axes))}
    invariant = {r for r in ir.walk(T) if r.op == "red" and r.attrs[0] in ("max", "min") and shift_invariant(T, r)}
    for r in invariant:
        bw.notes.append(f"{ir.show(r)[:80]}: the output is invariant under a shift of it (proved): adjoint 0")
    reads = _adjoints(spec, T, grad, invariant)
    sites = [(t, cs) for t, cs in reads.items() if t.attrs[0] in wrt]
    if not sites:
        bw.notes.append("the output does not depend on the inputs differentiated")
    stager = Stager(spec, bw, extra, grad_name=bw.grad_name)
    reduced = {t.attrs[1] for t in ir.walk(T) if ir.is_reduction(t)}
    for load, contributions in sites:
        for a in _by_axes(contributions):
            a = stager.replace(ir.substitute(a, saved))
            bw.parts.append(_grad_part(spec, load, a, extra, len(bw.parts), reduced, stager.out_of_loop))
    bw.parts = [_in_input_dtype(spec, replace(p, sole=True)) if [q.input for q in bw.parts].count(p.input) == 1
                else p for p in bw.parts]
    groups = _sharing_loops(spec, bw.parts)
    if accumulate:
        groups = _accumulated(spec, groups)
    bw.kernels = [_one_kernel(spec, group, k) for k, group in enumerate(groups)]
    # the stages the kernels need, and of the forward's values those they read where the forward writes them
    needed = bw.reads()
    bw.stages = [s for s in bw.stages if s.name in needed]
    saved = {name: t for name, t in stager.saved.items() if name in needed
             and {x.attrs[0] for x in ir.walk(t) if x.op == "load"} <= set(spec.inputs)}
    read = bw.reads(frozenset(saved))
    bw.saved = {name: t for name, t in saved.items() if name in read}
    return bw


def _in_input_dtype(spec: Spec, part: GradPart) -> GradPart:
    """The only part of an input's gradient that is the kernel's output as it is: written in the input's dtype
    (accumulated in fp32 in the kernel, rounded once), so the host neither adds it into a zeroed fp32 buffer nor
    converts it."""
    if not part.whole:
        return part
    return replace(part, spec=replace(part.spec, output_dtype=spec.inputs[part.input].dtype), as_is=True)


def _sharing_loops(spec: Spec, parts: list[GradPart]) -> list[list[GradPart]]:
    """The parts grouped into kernels, in order: those with the same loop axis, host axes and output axes up to
    renaming short ones of the same extent (dK over [b, h, j, d] and dV over [b, h, j, e]: one kernel holds d
    and e whole in its tiles); then a part whose output axes are among a group's first output's and which loops
    over the same axis joins that group (an ALiBi slope's gradient per [h, b, i], summed over the keys, beside
    dQ over [b, h, i, d])."""
    groups: dict[tuple, list[GradPart]] = {}
    for p in parts:
        key = (p.spec.output_axes, id(p))
        if p.loop is not None:
            shape = tuple(a if _is_long(spec, a) or a in p.spec.output_axes[:-1] else spec.axes_[a]
                          for a in p.spec.output_axes)
            key = (shape, p.host_sum, p.loop)
        groups.setdefault(key, []).append(p)
    out = list(groups.values())
    for g in [g for g in out if len(g) == 1 and g[0].loop is not None]:
        if len(g) > 1:   # it took in a part itself: it stays a kernel of its own, with all its parts
            continue
        p = g[0]
        host = next((h for h in out if h is not g and h[0].loop == p.loop
                     and set(p.spec.output_axes) < set(h[0].spec.output_axes)), None)
        if host is not None:
            host.append(p)
            out.remove(g)
    return out


def _accumulated(spec: Spec, groups: list[list[GradPart]]) -> list[list[GradPart]]:
    """Groups whose loop runs along another group's long output axis, and whose own long output axis is that
    group's loop, joined to it as outputs it accumulates (written in fp32): the dQ kernel's parts into the dK
    and dV kernel's, when the two loops cover the same pairs (i, j) and the outputs meet only there."""
    out = [list(g) for g in groups]
    hosts: list[list[GradPart]] = []
    for g in sorted(out, key=len):   # the group with fewer outputs is the one added atomically
        if any(g is h for h in hosts):
            continue
        host = next((h for h in out if h is not g and h[0].loop not in (None, g[0].loop)
                     and _accumulable(spec, g, h)), None)
        if host is not None:
            host += [replace(p, spec=replace(p.spec, output_dtype="f32"), added=True,
                             added_sum=_value_per_row(p, host)) for p in g]
            hosts.append(host)
            out = [h for h in out if h is not g]
    return out


def _value_per_row(part: GradPart, host: list[GradPart]) -> bool:
    """Does `part`, added into by the programs of `host`'s loop, hold a value per row of that loop (a sum over
    the host's rows, as a slope's gradient) rather than a product's tile (dQ)? Its axes are then all grid axes
    of the host (the host outputs' axes but their columns, the last, and their rows, the part's own loop) or the
    host's loop axis: the test the Gluon gradient kernel matches by (codegen/gluon_gradients.py), so that the
    backward chosen for a device (training.backward_for_device) reads the same split."""
    grid = {a for q in host if not q.added for a in q.spec.output_axes[:-1]} - {part.loop}
    return set(part.spec.output_axes) <= grid | {host[0].loop}


def _accumulable(spec: Spec, group: list[GradPart], host: list[GradPart]) -> bool:
    host_axes, loop = {a for p in host for a in p.spec.output_axes}, host[0].loop
    return all(p.loop is not None and p.loop in host_axes and loop in p.spec.output_axes and _is_long(spec, p.loop)
               and set(p.spec.output_axes) - {loop} <= host_axes for p in group) and not host[0].host_sum


def _one_kernel(spec: Spec, group: list[GradPart], k: int) -> GradKernel:
    """The kernel of parts that share their output axes and loop: the first part's spec with the others'
    outputs as further outputs, reading every input any of them reads."""
    first = group[0].spec
    if len(group) == 1:
        return GradKernel(first, tuple(group))
    specs = [p.spec for p in group]
    inputs = {n: t for s in specs for n, t in s.inputs.items()}
    merged = replace(first, name=f"{spec.name}_{'_'.join('d' + p.input for p in group)}{k}",
                     inputs={n: inputs[n] for n in [*spec.inputs, *inputs] if n in inputs},
                     axes_={a: e for s in specs for a, e in s.axes_.items()},
                     dims_={n: d for s in specs for n, d in s.dims_.items()},
                     typical={n: v for s in specs for n, v in s.typical.items()},
                     also=tuple(Output(s.output_name, s.output_dtype, s.output_term, s.output_axes) for s in specs[1:]),
                     doc=f"gradients {', '.join('d' + p.input for p in group)} of {spec.name}, one kernel")
    return GradKernel(merged, tuple(group))


def _by_axes(contributions: list[Term]) -> list[Term]:
    """Contributions with the same free axes added into one (one kernel each set of axes)."""
    groups: dict[frozenset, Term] = {}
    for c in contributions:
        groups[c.free] = plus(groups[c.free], c) if c.free in groups else c
    return list(groups.values())


def _read_as_value(T: Term) -> set[str]:
    """Inputs read somewhere other than inside an index (a label read only to index a row is not a value)."""
    found: set[str] = set()

    def go(x: Term) -> None:
        if x.op == "load":
            found.add(x.attrs[0])
            return   # its index is not a value
        for a in x.args:
            go(a)
    go(T)
    return found


def _adjoints(spec: Spec, T: Term, seed: Term, zero: set[Term]) -> dict[Term, list[Term]]:
    """The contributions to the adjoint of every read of an input in T.

    Parents are visited before their children (reverse post-order), so a term's adjoint is complete before it
    is passed on. A contribution is summed down to the axes of the term it reaches -- over short axes at once
    (dP = sum_e dO * V is a small contraction), while a long axis (a run-time size) stays an axis of the
    contribution, to be summed by the loop of a gradient kernel or on the host: one kernel loops over one long
    axis, so a slope's gradient (summed over the batch, the queries and the keys) cannot nest the batch's sum
    inside the queries' loop. A term's adjoint is therefore kept as a sum of groups, one per set of long axes
    still to sum, each passed on by linearity on its own."""
    adj: dict[Term, dict[frozenset, Term]] = {T: {frozenset(): seed}}
    reads: dict[Term, list[Term]] = {}
    for t in reversed(ir.walk(T)):
        groups = adj.get(t)
        if not groups or t in zero or t.op == "load":
            continue
        bound = {x.attrs[1] for x in ir.walk(t) if ir.is_reduction(x)}
        for pending, a in groups.items():
            if pending & bound:   # an axis t reduces over cannot also be one still to sum: sum it now
                a = total(a, t.free | (pending - bound))
            for child, contribution in local_adjoints(t, a):
                if contribution == ZERO:
                    continue
                contribution = over_broadcast(spec.axes_, t, child, contribution)
                if child.op == "load":
                    reads.setdefault(child, []).append(contribution)
                    continue
                short = {x for x in contribution.free - child.free if not _is_long(spec, x)}
                contribution = total(contribution, contribution.free - short)
                key = frozenset(contribution.free - child.free)
                into = adj.setdefault(child, {})
                into[key] = plus(into[key], contribution) if key in into else contribution
    return reads


def _is_long(spec: Spec, ax: str) -> bool:
    return is_large(spec.axes_[ax])


ZERO = ir.const(0.0)


def _grad_part(spec: Spec, load: Term, a: Term, extra: dict, k: int, reduced: set[str], out_of_loop) -> GradPart:
    """The kernel of one read of an input: output over the axes of its index, reducing over the rest (first
    over an axis in `reduced`, the forward's reduction axes); `out_of_loop(term, axis)` moves per-row work out
    of the kernel's loop (staging.Stager.out_of_loop)."""
    name = load.attrs[0]
    index = tuple(_plain(t) for t in load.args)
    keep: list[str] = []
    for t in index:
        keep += [x for x in _axes_in_order(t) if x not in keep]
    a = total(a, frozenset(x for x in a.free if x in keep or _is_long(spec, x)))   # short axes: inside
    # the loop: an axis the forward reduces over where there is one (the keys for a slope's gradient, as the
    # forward's own loop), else the longest; the others are summed on the host
    rest = sorted(a.free - set(keep), key=lambda x: (x not in reduced, -_typical(spec, x)))
    if rest:
        a = ir.red("sum", rest[0], out_of_loop(a, rest[0]))
    # the host's axes in the forward output's order, so the gradient kernel's rows are the forward's rows
    host = tuple(sorted(rest[1:], key=lambda x: (spec.output_axes.index(x) if x in spec.output_axes else 99, x)))
    # an axis the gradient does not vary along is not an output axis (no input might carry its size): the
    # host broadcasts along it
    out_axes = tuple(x for x in keep if x in a.free) + host
    part_name = f"{spec.name}_d{name}{k}"
    sub = sub_spec_in_products(spec, part_name, a, out_axes, extra)
    return GradPart(name, sub, tuple(index), tuple(keep), host, rest[0] if rest else None)


def _plain(t: Term) -> Term:
    """An index without the identities that hide a plain axis: `h // 1`, `i + 0`, `j * 1`."""
    while t.op == "bin" and t.args[1].op == "const" and (t.attrs[0], t.args[1].attrs[0]) in (
            ("floordiv", 1.0), ("add", 0.0), ("sub", 0.0), ("mul", 1.0)):
        t = t.args[0]
    return t


def _axes_in_order(t: Term) -> list[str]:
    out: list[str] = []
    for x in ir.walk(t):
        if x.op == "axis" and x.attrs[0] not in out:
            out.append(x.attrs[0])
    return [x for x in out if x in t.free]


def _typical(spec: Spec, ax: str) -> int:
    ext = spec.axes_[ax]
    return ext if isinstance(ext, int) else spec.typical.get(ext.name, 1024)
