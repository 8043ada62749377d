"""Extraction: candidate plans out of the e-graph, each priced by the analytic cost model.

Inside the e-graph a per-node cost picks the cheapest form of every value (work over the tile of its free
axes, exp of a value not known to be <= 0 priced as an overflow risk). Plans differ in how reductions over the
same axis share passes, so one extraction is made per plan family:
  unfused  -- no rolled reduction: a reduction whose body reads another reduction over its axis waits for it
  rolled   -- a reduction that would wait is priced as an extra pass, so rolled forms win where they exist
  split    -- every reduction over a long axis is split into chunks (split-K); rolled within each chunk
Each extracted term is scheduled and priced by `cost.plan_cost`; the cheapest plan is chosen.

Measured times replace estimates: where the tuning database holds a time measured on the GPU for a candidate's
family (at this spec, shape bucket and GPU), the candidates are ranked by it instead of by the analytic cost.
Candidates of one spec may then be ranked partly by measurements, partly by estimates, compared as they are,
though an estimate can be off either way (a roofline without latencies or pipeline bubbles, a fill factor that
takes bandwidth to grow with the busy SMs): an unmeasured plan can win or lose on paper against a measured one.
Measuring that plan too settles it.
"""
from __future__ import annotations

from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.plan.cost import PlanCost, plan_cost
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.layout import pack_group_rows
from neptune_eqsat.plan.plan import Plan
from neptune_eqsat.plan.saturate import Saturation
from neptune_eqsat.plan.schedule import TILE_LIMIT, Schedule, schedule
from neptune_eqsat.plan.sharing import share
from neptune_eqsat.plan.snapshot import ENode, Snapshot, best_nodes, snapshot, to_term, written
from neptune_eqsat.plan.validate import Validation
from neptune_eqsat.frontend.spec import Spec, SpecError

OP_WORK = {name: op.work for kind in ops.OPS.values() for name, op in kind.items()}
LAYOUT_MARGIN = 1.05


@dataclass
class Candidate:
    family: str
    term: Term
    sched: Schedule
    cost: PlanCost
    measured: float | None = None   # seconds measured on the GPU (tuning database), when this family was timed

    @property
    def basis(self) -> str:
        return "analytic" if self.measured is None else "measured"

    @property
    def seconds(self) -> float:
        return self.cost.seconds if self.measured is None else self.measured

    @property
    def plan(self) -> Plan:
        """The plan code generation takes (for a split plan, with its combine step planned)."""
        return Plan.of(self.family, self.term, self.sched)

    def rank(self) -> float:
        if self.measured is not None:
            return self.measured
        # a layout change must win by a margin on paper: the model does not see what gathered rows cost
        return self.cost.seconds * (LAYOUT_MARGIN if "+packed" in self.family else 1.0)


class Analyses:
    """What the cost of an e-node needs, the same in every plan family, so worked out once per e-node for all
    three: (constructor, work, may-overflow exps, reduced axis, does the body read a reduction over that axis,
    fixed risks)."""

    def __init__(self, snap: Snapshot, weight, load_axes, as_written: set[ENode] = frozenset()):
        self.snap, self.weight, self.load_axes = snap, weight, load_axes
        self.memo: dict[ENode, tuple] = {}
        # the e-nodes of each e-class where the spec as written takes an exp that may overflow (exp(s * 0.1) in
        # a score): every plan computes that value, so no form of it is a risk a plan takes. Risks are counted
        # per use in a tree (a score read by the max and by both sums counts three times): were the spec's own
        # exp counted, a plan dropping the max's subtraction (sum exp(s) exp(-max), overflowing where s is
        # large) would look less risky than the shifted one. The exps of a softmax (of s - max) are not such.
        self.given = {n for c, enodes in snap.classes.items()
                      if any(m in as_written and self._may_overflow(m) for m in enodes) for n in enodes}

    def _may_overflow(self, n: ENode) -> bool:
        return n.op == "un" and n.lits[0] in ("exp", "exp2") and not self.snap.flag("nonpositive", n.kids[0])

    def node(self, n: ENode) -> tuple:
        if n in self.memo:
            return self.memo[n]
        snap, weight = self.snap, self.weight
        risks, ax, waits_on_ax, fixed = 0, None, False, 0
        if n.op in ("axis", "dim", "const", "acc"):
            own = 1.0
        elif n.op == "load":
            own = 2.0 * weight(self.load_axes(*n.lits))
        else:
            axes = set().union(*(snap.axes("free", k) for k in n.kids))
            if n.op in ("red", "roll", "split"):
                ax = n.lits[1]
                axes.discard(ax)
            own = weight(axes)
            if n.op in ("un", "bin"):
                fn = n.lits[0]
                own *= OP_WORK.get(fn, 1.0)
                risks = int(self._may_overflow(n) and n not in self.given)
                # risks only in a pass that repairs: a running sum over the whole row's count (a repair across
                # it cancels; the sum over the prefix's own count, a mean of the prefix, does not), and x - m
                # with a maximum that is partial there (-inf until a block or chunk has an element above
                # -inf, then -inf - -inf is NaN; the difference of two maxima is a repair factor, guarded)
                if n.op == "bin":
                    fixed = int(fn == "div" and snap.flag("whole_count", n.kids[1])) + \
                        int(fn == "sub" and snap.flag("running_max", n.kids[1])
                            and not snap.flag("running_max", n.kids[0])) + \
                        int(fn == "sub" and snap.flag("running_min", n.kids[0])   # min - x: +inf - +inf
                            and not snap.flag("running_min", n.kids[1]))
            elif ax is not None:
                own *= weight({ax})
                waits_on_ax = ax in snap.axes("deps", n.kids[0])   # the body (a split's and a roll's first)
            elif n.op == "cast":
                own *= 0.5
        self.memo[n] = (n.op, own, risks, ax, waits_on_ax, fixed)
        return self.memo[n]


def node_cost(family: str, long_axes: set[str], known: Analyses):
    """The per-node cost for one plan family, compared in order: (banned forms, exps that may overflow,
    reductions that must wait for another over their axis, work). Every node adds work >= 1, so a node
    always costs more than each child (monotone, which extraction over cycles needs); separate counts keep
    a large penalty from swallowing small differences in work. Analyses are read on the children only
    (the node itself is being extracted)."""
    def cost(n: ENode, kids: list) -> tuple:
        name, own, risks, ax, waits_on_ax, fixed = known.node(n)
        risks += fixed if family != "unfused" else 0
        banned = waits = 0
        if name in ("red", "roll", "split"):
            if family == "split":
                banned = int((name == "split") != (ax in long_axes))
            else:
                banned = int(name == "split" or (name == "roll" and family == "unfused"))
            waits = int(name == "red" and family == "rolled" and waits_on_ax)
        for k in kids:   # the children's counts added field by field
            banned, risks, waits, own = banned + k[0], risks + k[1], waits + k[2], own + k[3]
        return banned, risks, waits, own
    return cost


def _nested_axes(term: Term, long_axes: set[str]) -> set[str]:
    """Long axes reduced inside the body of a reduction over another long axis (the hidden dim of logits
    h W^T under a log-sum-exp over the vocabulary): a kernel reduces them in loops of their own inside its
    loop (schedule.chunked), so the split family splits the outer axis only."""
    inside = set()
    for t in ir.walk(term):
        if ir.is_reduction(t) and t.attrs[1] in long_axes:
            inside |= {x.attrs[1] for x in ir.walk(t.args[0]) if ir.is_reduction(x) and x.attrs[1] in long_axes
                       and x.attrs[1] != t.attrs[1]}
    return inside


def _as_written(spec: Spec, sizes: dict[str, int], device) -> list[Candidate]:
    """The spec's own term as the unfused plan, for when extraction gave none: it is always a term of the spec,
    and an extraction that names what the spec lacks (seen rarely, and not reproducibly) must cost speed, never
    the kernel."""
    try:
        sched = schedule(spec, spec.root_term)
    except Exception:   # a term that needs the rewrites to be scheduled at all: the caller reports no plan
        return []
    return [Candidate("unfused", spec.root_term, sched, plan_cost(sched, sizes, device))]


def _malformed(spec: Spec, term: Term) -> str:
    """Why an extracted term is not a term of the spec (a reduction by an unknown reducer or over an axis the
    spec lacks, an operation the registry lacks, a read of an unknown input), or "" when it is one."""
    for t in ir.walk(term):
        if t.op in ops.OPS and t.attrs[0] not in ops.OPS[t.op]:
            return f"an operation {t.attrs[0]!r}, not in the op registry: {ir.show(t)[:120]}"
        if ir.is_reduction(t) and t.attrs[0] not in ir.REDUCERS:
            return f"a reduction by {t.attrs[0]!r}, not a reducer: {ir.show(t)[:120]}"
        if ir.is_reduction(t) and t.attrs[1] not in spec.axes_:
            return f"a reduction over {t.attrs[1]!r}, not an axis of the spec: {ir.show(t)[:120]}"
        if t.op == "load" and t.attrs[0] not in spec.inputs:
            return f"a read of {t.attrs[0]!r}, not an input of the spec"
    return ""


def candidates(sat: Saturation, spec: Spec, sizes: dict[str, int], device,
               measured: dict[str, float] | None = None) -> list[Candidate]:
    """The plans, best first; `measured`: family -> seconds measured for this spec and shape on `device`."""
    def weight(axes: set[str]) -> float:
        w = 1.0
        for a in axes:
            ext = spec.extent(a) if a in spec.axes_ else 1
            w *= ext if isinstance(ext, int) else sizes.get(ext.name, 4096)
        return w

    out: list[Candidate] = []
    seen: set[Term] = set()
    long_axes = {a for a, e in spec.axes_.items() if not isinstance(e, int) or e > TILE_LIMIT}
    long_axes -= _nested_axes(spec.root_term, long_axes)
    snap = snapshot(sat.egraph)
    as_written = written(snap, spec.root_term)
    known = Analyses(snap, weight, lambda t, key: set().union(*(i.free for i in sat.mirror.loads[(t, key)])),
                     as_written)
    validation = Validation(spec)
    # several outputs: one kernel writes them all, not split into chunks (a combine step writes one output)
    for family in ("rolled", "unfused") + (() if spec.also else ("split",)):
        family_cost = node_cost(family, long_axes, known)
        best, costs = best_nodes(snap, family_cost, as_written)
        if snap.root not in costs or costs[snap.root][0][0]:   # only banned forms exist
            continue
        term = to_term(snap, share(snap, best, costs, family_cost), sat.mirror)
        if term in seen:
            continue
        seen.add(term)
        malformed = _malformed(spec, term) or validation.disagreement(term)
        if malformed:   # a term that names what the spec lacks, or computes something else, is no plan of it
            sat.rejected.append(f"{family}: {malformed}")
            sat.malformed += 1
            continue
        try:
            sched = schedule(spec, term)
        except SpecError as e:   # a form this family extracts that no kernel runs: the other families remain
            sat.rejected.append(f"{family}: {e}")
            continue
        ops = {t.op for t in ir.walk(term)}
        kind = "split" if "split" in ops else "rolled" if "roll" in ops else "unfused"
        if sched.split and (sched.writes_loop or sched.passes != 1):
            continue   # a split plan writes partial results once per chunk, after one pass
        if sched.split and sched.row is None:   # its kernels tile rows: a reduction to one value runs rolled
            sat.rejected.append("split: no row axis to tile (the output is one value per grid index)")
            continue
        out.append(Candidate(kind, term, sched, plan_cost(sched, sizes, device)))
        packed = pack_group_rows(spec, term, sched.row, sched.loop) if sched.loop and not spec.also else None
        if packed is not None:
            psched = schedule(*packed)
            psizes = {**sizes, **{d: g * sizes[base] for d, (g, base) in packed[0].derived.items()}}
            out.append(Candidate(kind + "+packed", packed[1], psched, plan_cost(psched, psizes, device)))
    if not any(c.family == "unfused" for c in out):
        out += _as_written(spec, sizes, device)
    for cand in out:
        cand.measured = (measured or {}).get(cand.family)
    out.sort(key=Candidate.rank)
    return out
