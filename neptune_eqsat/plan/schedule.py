"""From an extracted term to the shape of its kernel: which axis is looped over, which are tiles, which are
program ids, and in how many passes over the loop axis the reductions run.

Reductions over the loop axis form passes: a plain reduction runs one pass after the reductions its body
reads (it needs them finished); a rolled one runs in the same pass as the reductions it reads (its repair
term fixes the partial result as they grow).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.spec import Spec, SpecError

TILE_LIMIT = 256  # constant extents up to this are held whole in a tile


@dataclass
class Schedule:
    spec: Spec
    term: Term
    loop: str | None                 # the axis the kernel loops over in blocks
    row: str | None                  # output axis tiled across programs (BLOCK rows)
    col: str | None                  # output axis held whole in a tile
    grid: tuple[str, ...]            # output axes that are program ids
    inner: tuple[str, ...]           # axes of in-tile reductions (whole in a tile)
    reductions: list[Term] = field(default_factory=list)   # over the loop axis, dependencies first
    pass_of: dict[Term, int] = field(default_factory=dict)
    writes_loop: bool = False        # the output varies along the loop axis: written in a last pass
    chunked: tuple[str, ...] = ()    # long axes of in-tile sums, each reduced in a loop of blocks of its own
    accumulated: tuple[int, ...] = ()   # further outputs (positions in spec.also) that run along the loop axis,
    # each program adding its rows' share to them at every block (`_check_accumulated`)

    @property
    def split(self) -> bool:
        """The loop axis is split into chunks run by separate programs (split-K), then combined."""
        return any(r.op == "split" for r in self.reductions)

    @property
    def passes(self) -> int:
        return 1 + max(self.pass_of.values()) if self.pass_of else 0

    @property
    def streams_rows(self) -> bool:
        """Tiles hold only rows and a block of the loop axis (softmax, a norm, cross-entropy: no matrix product):
        the kernel streams one row per program."""
        return bool(self.row) and bool(self.loop) and not self.inner and self.col is None

    def in_pass(self, p: int) -> list[Term]:
        return [r for r in self.reductions if self.pass_of[r] == p]

    def extent(self, ax: str):
        return self.spec.extent(ax)


def is_large(ext) -> bool:
    return not isinstance(ext, int) or ext > TILE_LIMIT


def _top_refs(r: Term, loop: str) -> list[Term]:
    """The reductions over `loop` r's arguments read, not looking inside them; each shared sub-term visited once
    (a value reused at every level of a deep expression has a tree exponential in its depth)."""
    out: list[Term] = []
    seen: set[Term] = set()
    for a in r.args:
        stack = [a]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if ir.is_reduction(x) and x.attrs[1] == loop:
                if x not in out:
                    out.append(x)
                continue
            stack.extend(x.args)
    return out


def _apart(spec: Spec, term: Term, axes: set[str]) -> tuple[Spec, Term]:
    """The term with each reduction over one of `axes` (output axes reduced within a tile, as in
    `o / sqrt(sum(e, o * o))` over output axis e) reducing over a copy of its axis, and a copy of the spec that
    has those axes: the kernel holds the free e and the bound e as two tiles, which need two names. The user's
    spec is left as it is."""
    copies = {ax: next(f"{ax}{n}" for n in range(2, 1 << 20) if f"{ax}{n}" not in spec.axes_) for ax in sorted(axes)}
    spec = replace(spec, axes_={**spec.axes_, **{copy: spec.axes_[ax] for ax, copy in copies.items()}})

    def relabel(x: Term, ax: str, copy: str, seen: dict[Term, Term]) -> Term:
        """x with axis ax read as its copy. A reduction over a long axis (the loop's state, a whole loop of
        work) is not computed again under the new name: it is the same tile, renamed (`rename`)."""
        if x not in seen:
            if ax not in x.free:
                seen[x] = x
            elif x.op == "axis":
                seen[x] = ir.axis(copy)
            elif ir.is_reduction(x) and is_large(spec.extent(x.attrs[1])):
                seen[x] = ir.Term("rename", (ax, copy), (x,))
            else:
                seen[x] = ir.Term(x.op, x.attrs, tuple(relabel(a, ax, copy, seen) for a in x.args), x.origin)
        return seen[x]

    def apart(y: Term) -> Term:
        if not (ir.is_reduction(y) and y.attrs[1] in axes):
            return y
        ax, copy = y.attrs[1], copies[y.attrs[1]]
        renamed: dict[Term, Term] = {}
        return ir.Term(y.op, (y.attrs[0], copy) + y.attrs[2:], tuple(relabel(a, ax, copy, renamed) for a in y.args),
                       y.origin)

    return spec, ir.bottom_up(term, apart)


def _loop_axis(spec: Spec, reds: list[Term]) -> tuple[str | None, tuple[str, ...]]:
    """The long axis the kernel loops over, and the other long axes, each reduced inside the loop in blocks of
    its own (the hidden dim of a linear layer whose outputs a log-sum-exp over the vocabulary reads). An axis
    is reduced that way when its reductions are plain sums, maxima or minima that read no reduction over the
    loop axis; exactly one long axis must leave all the others so."""
    long_axes = sorted({t.attrs[1] for t in reds if is_large(spec.extent(t.attrs[1]))})
    if len(long_axes) <= 1:
        return (long_axes[0] if long_axes else None), ()

    def nested(ax: str, loop: str) -> bool:
        return all(r.op == "red" and not any(ir.is_reduction(x) and x.attrs[1] == loop for x in ir.walk(r.args[0]))
                   for r in reds if r.attrs[1] == ax)
    # an axis the output runs along is a tile's axis, not one to reduce in blocks of its own
    loops = [a for a in long_axes if all(nested(b, a) and b not in spec.output_axes for b in long_axes if b != a)]
    if len(loops) != 1:
        raise SpecError(f"spec {spec.name}: reductions over several long axes {long_axes}; one kernel loops over "
                        f"one axis, and no one of them holds the others' reductions inside its loop (over an axis "
                        f"the output does not run along)")
    return loops[0], tuple(a for a in long_axes if a != loops[0])


def _running_along(spec: Spec) -> tuple[int, ...]:
    """Further outputs that run along a long axis the first output lacks (dQ over the queries beside dK over
    the keys): candidates for accumulation across programs, along the loop axis."""
    return tuple(k for k, o in enumerate(spec.also)
                 if any(a not in spec.output_axes and is_large(spec.extent(a)) for a in o.axes))


def _further_axes(spec: Spec, loop: str | None, accumulated: tuple[int, ...]) -> set[str]:
    """Axes of further outputs that the first output lacks: held whole in a tile (dV's e beside dK's d), or
    the loop axis of an output accumulated along it."""
    extra = {a for k, o in enumerate(spec.also) for a in o.axes if a not in spec.output_axes
             and not (k in accumulated and a == loop)}
    for a in sorted(extra):
        if a == loop or is_large(spec.extent(a)):
            o = next(o for o in spec.also if a in o.axes)
            raise SpecError(f"spec {spec.name}: output {o.name} runs along {a}, which the first output "
                            f"{spec.output_name} does not; one kernel writes both only where such an axis fits in "
                            f"a tile (a constant extent up to {TILE_LIMIT})")
    return extra


def _check_further_outputs(sched: Schedule) -> None:
    """Each program writes its tile of every output, so a further output may reduce over the loop axis or
    in-tile axes, never over an axis the programs divide among themselves (the rows, the grid); one that is
    accumulated across programs is checked by `_check_accumulated`."""
    if sched.term.op != "pack":
        return
    for k, (o, t) in enumerate(zip(sched.spec.also, sched.term.args[1:])):
        if k in sched.accumulated:
            _check_accumulated(sched, o, t)
            continue
        across = sorted({x.attrs[1] for x in ir.walk(t) if ir.is_reduction(x)} & ({sched.row} | set(sched.grid)))
        if across:
            raise SpecError(f"spec {sched.spec.name}: output {o.name} reduces over {', '.join(across)}, which the "
                            f"kernel of {sched.spec.output_name} divides among its programs")


def _check_accumulated(sched: Schedule, o, t: Term) -> None:
    """An output along the loop axis that each program adds its share to at every block: it must reduce over
    the programs' rows in sums it is linear in (dQ = sum_j dS K: the share of a block of keys j), over no grid
    axis, and run along no long axis but the loop's."""
    spec, row, loop = sched.spec, sched.row, sched.loop
    name = f"spec {spec.name}: output {o.name}"
    # the first output declared shapes the kernel; one declared later with more axes may fit as the first
    hint = (f" (outputs are declared first to last with the kernel's shape taken from the first: declare "
            f"{o.name}, which has more axes than {spec.output_name}, first)") if len(o.axes) > len(spec.output_axes) else ""
    if loop is None or sched.writes_loop or row is None or loop not in o.axes:
        raise SpecError(f"{name} runs along {', '.join(a for a in o.axes if a not in spec.output_axes)}, which the "
                        f"kernel of {spec.output_name} neither loops over nor holds whole in a tile{hint}")
    others = [a for a in o.axes if a not in spec.output_axes and a != loop and is_large(spec.extent(a))]
    across = {x.attrs[1] for x in ir.walk(t) if ir.is_reduction(x)} & set(sched.grid)
    if others or across:
        raise SpecError(f"{name} runs along or reduces over {', '.join(sorted(set(others) | across))}, which "
                        f"one kernel of {spec.output_name} cannot accumulate")
    if linear_in_sums(t, row) != "linear":
        raise SpecError(f"{name} runs along {loop}, which the kernel of {spec.output_name} loops over: written at "
                        f"every block, each program adding its share, it must be linear in sums over {row} (the "
                        f"rows the programs divide), with nothing added outside them{hint}")
    if o.dtype not in ("f32", "f16", "bf16"):   # a 16-bit one is summed in an fp32 workspace, rounded once
        raise SpecError(f"{name} is accumulated across programs in fp32 (and may be rounded to 16 bits once), "
                        f"not in {o.dtype}")


def _check_accumulated_passes(sched: Schedule) -> None:
    """An accumulated output is added to in the last pass's loop: the loop's states it reads must be finished
    by then (computed in earlier passes)."""
    last = sched.passes - 1
    for k in sched.accumulated:
        t = sched.term.args[k + 1]
        unfinished = [r for r in ir.walk(t) if r in sched.pass_of and sched.pass_of[r] == last]
        if unfinished:
            raise SpecError(f"spec {sched.spec.name}: output {sched.spec.also[k].name} reads "
                            f"{ir.show(unfinished[0])[:80]}, which is not finished before the last pass over "
                            f"{sched.loop}")


def linear_in_sums(t: Term, ax: str) -> str | None:
    """"linear" where t is a linear combination of sums over `ax` (coefficients free of reductions over ax, no
    term without such a sum), "free" where t reduces over ax nowhere, else None: the forms whose value over
    all of ax is the sum of their values over the parts of ax."""
    if not any(ir.is_reduction(x) and x.attrs[1] == ax for x in ir.walk(t)):
        return "free"
    if t.op == "red" and t.attrs[:2] == ("sum", ax):
        return "linear" if linear_in_sums(t.args[0], ax) == "free" else None
    if t.op == "un" and t.attrs[0] == "neg":
        return linear_in_sums(t.args[0], ax)
    if t.op == "cast" and t.attrs[0] in ("f32", "f64"):
        return linear_in_sums(t.args[0], ax)
    if t.op == "bin" and t.attrs[0] in ("add", "sub", "mul", "div"):
        kinds = [linear_in_sums(a, ax) for a in t.args]
        if t.attrs[0] in ("add", "sub"):
            return "linear" if kinds == ["linear", "linear"] else None
        if t.attrs[0] == "mul" and sorted(kinds, key=str) == ["free", "linear"]:
            return "linear"
        if t.attrs[0] == "div" and kinds == ["linear", "free"]:
            return "linear"
    return None


def schedule(spec: Spec, term: Term) -> Schedule:
    reds = [t for t in ir.walk(term) if ir.is_reduction(t)]
    shadowed = {t.attrs[1] for t in reds if t.attrs[1] in spec.output_axes and not is_large(spec.extent(t.attrs[1]))}
    if shadowed:
        spec, term = _apart(spec, term, shadowed)
        reds = [t for t in ir.walk(term) if ir.is_reduction(t)]
    accumulated = _running_along(spec) if term.op == "pack" else ()
    # the loop is the first output's (and the other outputs'): an accumulated output reduces over the rows
    own = [x for k, x in enumerate(term.args if term.op == "pack" else (term,)) if k - 1 not in accumulated]
    loop, chunked = _loop_axis(spec, [t for x in own for t in ir.walk(x) if ir.is_reduction(t)])
    out_axes = list(spec.output_axes)
    row_axes = {a for a in out_axes if is_large(spec.extent(a))}   # the rows an accumulated output sums over
    in_tile = {t.attrs[1] for t in reds if t.attrs[1] != loop and not (accumulated and t.attrs[1] in row_axes)}
    inner = tuple(sorted(in_tile | _further_axes(spec, loop, accumulated)))
    col = None
    # an output axis reduced over a long reduction's values (sum(c, sum(s, x)) beside an output along c) reads
    # that reduction renamed, which needs the whole axis in one program: held whole, as the tile's columns
    renamed = {t.attrs[0] for t in ir.walk(term) if t.op == "rename"}
    whole = [a for a in out_axes if a in renamed and a != loop]
    if len(out_axes) > 1 and whole:
        col = whole[-1]
        out_axes.remove(col)
    elif len(out_axes) > 1 and out_axes[-1] != loop and not is_large(spec.extent(out_axes[-1])):
        col = out_axes.pop()
    rest = [a for a in out_axes if a != loop]
    row = None
    for a in reversed(rest):
        if is_large(spec.extent(a)):
            row = a
            break
    if row is None and rest:
        row = rest[-1]
    grid = tuple(a for a in rest if a != row)
    divided = sorted(renamed & ({row} | set(grid)))
    if divided:   # a reduction over an output axis needs the whole axis in one tile: the columns, not rows or grid
        raise SpecError(f"spec {spec.name}: the output runs along {', '.join(divided)} and reduces over "
                        f"{'them' if len(divided) > 1 else 'it'}, but one kernel holds one such axis whole in a tile "
                        f"({col}); its programs divide {', '.join(divided)} among themselves")
    sched = Schedule(spec, term, loop, row, col, grid, inner, writes_loop=loop in spec.output_axes, chunked=chunked,
                     accumulated=accumulated)
    _check_further_outputs(sched)
    if loop is None:
        return sched
    loop_reds = [t for t in reds if t.attrs[1] == loop]
    deps = {r: _top_refs(r, loop) for r in loop_reds}
    order: list[Term] = []

    def visit(r: Term, stack: tuple = ()) -> None:
        if r in order:
            return
        if r in stack:
            raise SpecError(f"spec {spec.name}: reductions over {loop} depend on each other in a cycle")
        for d in deps[r]:
            visit(d, stack + (r,))
        order.append(r)
        if r.op in ("roll", "split"):
            sched.pass_of[r] = max((sched.pass_of[d] for d in deps[r]), default=0)
        else:
            sched.pass_of[r] = max((sched.pass_of[d] + 1 for d in deps[r]), default=0)

    for r in loop_reds:
        visit(r)
    sched.reductions = order
    kinds = {r.op == "split" for r in order}
    if len(kinds) > 1:
        raise SpecError(f"spec {spec.name}: some reductions over {loop} are split into chunks and some are not")
    _check_accumulated_passes(sched)
    return sched
