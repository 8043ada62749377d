"""spec -> e-graph -> candidate plans -> chosen plan -> Triton module, with an explanation of each step."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from neptune_eqsat import ir
from neptune_eqsat.codegen.gluon import eligible
from neptune_eqsat.codegen.gluon_gradients import match_gradients
from neptune_eqsat.codegen.hygiene import check_names
from neptune_eqsat.codegen.module import module_source
from neptune_eqsat.codegen.staged_module import module_source as staged_module_source
from neptune_eqsat.plan.cost import Device, PlanCost, parse_device, plan_cost
from neptune_eqsat.plan.extract import Candidate, candidates
from neptune_eqsat.plan.saturate import Limits, Saturation, saturate
from neptune_eqsat.plan.stages import Stage, staged
from neptune_eqsat.frontend.spec import Spec, SpecError, load_spec
from neptune_eqsat.frontend.spec_checks import unknown_dims
from neptune_eqsat.rules import ALL_RULES
from neptune_eqsat.tune.database import config_for, configs_by_gpu, db_path, key_prefix, measured_plans, plan_times


class PlanError(ValueError):
    """A plan family was asked for (--plan) that extraction did not produce."""


@dataclass
class Result:
    spec: Spec
    saturation: Saturation
    candidates: list[Candidate]
    source: str
    tuned: dict | None = None   # a measured config from the tuning database, baked into the module
    device: Device = field(default_factory=Device)
    measured: dict[str, dict] = field(default_factory=dict)   # family -> tuning-database record (tune/database.py)
    measured_under: str = ""   # the tuning-database key prefix (spec|shape bucket|GPU|) measurements came from
    forced: str | None = None   # the plan family asked for with --plan
    # a spec planned as stages: each with its own result, run before the kernel described above, and why
    stages: tuple[tuple[Stage, "Result"], ...] = ()
    staged_because: str = ""
    last: "Result | None" = None   # of a staged spec: the last kernel's own result (its spec is <name>_last)

    def kernels(self) -> list[tuple[Spec, "Result"]]:
        """(spec, result) of each kernel's spec in the order they run: the stages' then the last one; the spec's
        own for one kernel. Each is optimized, and tuned, as a spec of its own."""
        if not self.stages:
            return [(self.spec, self)]
        return [(st.spec, r) for st, r in self.stages] + [(self.last.spec, self.last)]

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    def explain(self) -> str:
        sat = self.saturation
        by_name = {r.name: r for r in ALL_RULES}
        lines = [f"spec {self.spec.name}: {ir.show(self.spec.root_term)}", ""]
        if self.stages:
            lines.append(f"{self.staged_because}: {self.stage_count}, each a spec of its own, then the last kernel, "
                         "which reads them")
            lines += [f"  {st.name}[{', '.join(st.axes)}] = {ir.show(st.spec.output_term)[:100]}: {r.summary()}"
                      for st, r in self.stages]
            lines += [f"the last kernel: {ir.show(self.chosen.term)[:160]}", ""]
        lines += [f"e-graph: {sat.summary()}",
                 f"saturation rounds: {' -> '.join(sat.schedule)}, one step of each family per round",
                 "rules that fired (matches):"]
        for name, n in sorted(sat.fired.items(), key=lambda kv: (by_name[kv[0]].family if kv[0] in by_name else "",
                                                                  kv[0])):
            fam = by_name[name].family if name in by_name else "?"
            lines.append(f"  {fam:12s} {name:24s} {n:4d}")
        rolls = [by_name[n] for n in sat.fired if n in by_name and by_name[n].family == "rolling"]
        if rolls:
            lines.append("rolling-update repairs (derived and proved by sympy):")
            lines += [f"  {r.name}: {r.proof[0]}" for r in rolls]
        refused = [r for r in ALL_RULES if r.family == "rolling" and not r.proof[1]]
        if refused:
            lines.append("rolling-update rewrites refused (never fire):")
            lines += [f"  {r.name}: {r.proof[0]}" for r in refused]
        lines += [f"extracted term rejected: {r}" for r in sat.rejected]
        lines.append(f"device: {self.device.name} ({self.device.source})")
        times = ", ".join(f"{f} {t * 1e6:.1f} us" for f, t in sorted(plan_times(self.measured).items(),
                                                                        key=lambda ft: ft[1]))
        lines.append(f"measured plan times (tuning database {db_path()}, entries {self.measured_under}*): "
                     f"{times or 'none'}")
        lines.append("candidate plans (cost: measured on the GPU where the tuning database has the plan, else "
                     "analytic):")
        for k, c in enumerate(self.candidates):
            mark = "*" if k == 0 else " "
            if c.measured is None:
                lines.append(f" {mark} {c.family:13s} analytic {c.cost.summary()}")
            else:
                lines.append(f" {mark} {c.family:13s} measured {c.measured * 1e6:9.1f} us  (analytic estimate "
                             f"{c.cost.summary().strip()})")
            lines += [f"      {note}" for note in c.cost.notes]
            passes = [", ".join({"roll": "roll_", "split": "split_"}.get(r.op, "") + r.attrs[0]
                                for r in c.sched.in_pass(p))
                      for p in range(c.sched.passes)]
            lines.append("      " + "; ".join(f"pass {p} over {c.sched.loop}: {x}" for p, x in enumerate(passes)))
        lines.append("chosen plan:")
        lines += ["    " + x for x in ir.show_lets(self.chosen.term)]
        c = self.chosen
        for r in c.sched.reductions:
            waits = [d for d in c.sched.reductions if c.sched.pass_of[d] < c.sched.pass_of[r] and d in ir.walk(r)]
            if r.op == "red" and waits:
                lines.append(f"not rolled: {ir.show(r)[:100]} waits for {ir.show(waits[0])[:60]}: no rolling rewrite "
                             f"applied (its body has no form u op x with x read only from finished reductions over "
                             f"{r.attrs[1]} and u from none, or the repair for that op is refused above)")
        no_gluon = eligible(c.sched)
        if no_gluon is not None and c.sched.accumulated:   # a gradient pass adding into another's rows
            matched = match_gradients(c.sched, "probe")
            no_gluon = matched if isinstance(matched, str) else None
        lines.append("kernels: Triton, and a warp-specialized Gluon kernel for Hopper GPUs (BACKEND)" if no_gluon is None
                     else f"kernels: Triton only; no warp-specialized Gluon kernel: {no_gluon}")
        if self.tuned:
            lines.append(f"tunables measured on this GPU (tuning database): {self.tuned}")
        lines.append(f"chosen: {c.family} ({c.sched.passes} pass{'es' if c.sched.passes != 1 else ''} over "
                     f"{c.sched.loop}; rows {c.sched.row}, columns {c.sched.col}, programs over {list(c.sched.grid)})")
        if c.sched.chunked:
            lines.append(f"long axes reduced in blocks of their own inside the loop over {c.sched.loop}: "
                         f"{', '.join(c.sched.chunked)} (BLOCK_{', BLOCK_'.join(a.upper() for a in c.sched.chunked)})")
        lines.append(f"why: {self.why()}")
        return "\n".join(lines)

    @property
    def stage_count(self) -> str:
        n = len(self.stages)
        return f"{n} stage{'s' if n != 1 else ''}"

    def summary(self) -> str:
        c = self.chosen
        staged = f"{self.stage_count}, then " if self.stages else ""
        return f"{staged}{c.family} plan, {c.sched.passes} pass(es)"

    def why(self) -> str:
        """Which cost won the ranking, and whether it was a measurement or an estimate."""
        chosen, others = self.chosen, self.candidates[1:]

        def priced(c: Candidate) -> str:
            return f"{c.family} {c.basis} {c.seconds * 1e6:.1f} us"
        if self.forced:
            ranked_first = min(self.candidates, key=Candidate.rank)
            return f"forced with --plan {self.forced} ({priced(chosen)}; the ranking's best: {priced(ranked_first)})"
        if not others:
            return "the only plan extracted"
        runner = min(others, key=Candidate.rank)
        text = f"{priced(chosen)} against {priced(runner)}, the next best"
        if chosen.basis == runner.basis == "measured":
            return text + ": both measured on the GPU"
        if chosen.basis == runner.basis:
            margin = " (a +packed plan must win by the layout margin)" if "+packed" in chosen.family + runner.family \
                else ""
            return text + f": analytic estimates{margin}, no measurements of either plan for this GPU and shape"
        unmeasured = [c.family for c in self.candidates if c.measured is None]
        return (text + ": a measurement against an estimate, compared as they are (an estimate can be off "
                f"either way); to settle it, time {', '.join(unmeasured)} too (optimize --plan, then tune)")


def module_name(spec: Spec) -> str:
    return re.sub(r"\W", "_", spec.name)


SATURATIONS = 3   # tries when extractions do not read as the spec's term (egglog 13.2 now and then swaps literals)


def _saturated_candidates(spec: Spec, sizes: dict, device: Device, measured, limits: Limits | None,
                          shared: bool = True):
    """Saturate the spec's term and extract its candidate plans; the e-graph is freed before returning.
    `shared`: in the e-graph kept with its rules declared (saturate.py), else in a fresh one."""
    sat = saturate(spec.root_term, limits, extents=spec.axis_dims, shared=shared)
    try:
        return sat, candidates(sat, spec, sizes, device, plan_times(measured))
    finally:
        sat.release()


def _unrewritten(sat, cands, spec: Spec) -> bool:
    """Is the best plan the spec's term as written, from a saturation stopped while rules still fired (not
    saturated)? A small spec saturates with nothing better; a large one that ends as written is suspect."""
    return bool(cands) and cands[0].term == spec.root_term and sat.stop != "saturated"


def optimize(spec: Spec | str | Path, sizes: dict[str, int] | None = None, device: Device | None = None,
             limits: Limits | None = None, spec_file: str | None = None, out_file: str | None = None,
             plan: str | None = None, dtype: str | None = None) -> Result:
    """Compile a spec. Plans are ranked by the times measured on `device` (the tuning database, under its GPU
    name) where there are any, else by the analytic cost; `plan` forces a family (PlanError if none); `dtype`
    retypes the spec's 16-bit inputs, casts and output (Spec.retyped)."""
    if not isinstance(spec, Spec):
        spec_file = spec_file or str(spec)
        spec = load_spec(spec)
    if dtype is not None:
        spec = spec.retyped(dtype)
    device = parse_device(device) if isinstance(device, str) else device
    return _compiled(spec, _checked_sizes(spec, sizes or {}), device, limits, spec_file, out_file, plan)


def _compiled(spec: Spec, sizes: dict[str, int], device: Device | None, limits: Limits | None,
              spec_file: str | None = None, out_file: str | None = None, plan: str | None = None) -> Result:
    """optimize's work on a spec object; `sizes` may also name dims of the spec it is a stage of (a staged
    spec's kernels are priced, and their measurements kept, at the whole spec's sizes)."""
    sizes = {**spec.typical, **sizes}
    device = device or Device.detect()
    measured = measured_plans(spec.name, sizes, device.name)
    sat, cands = _saturated_candidates(spec, sizes, device, measured, limits)
    for attempt in range(2, SATURATIONS + 1):
        if not (sat.malformed or _unrewritten(sat, cands, spec)):
            break
        # an extraction that did not read as the spec's term, or the spec as written after rules kept firing:
        # saturate again, in a fresh e-graph (one in ten to twenty compiles of a gradient kernel met the first,
        # a few of those twice in a row; one in twenty or thirty the second, a union the e-graph missed)
        again, more = _saturated_candidates(spec, sizes, device, measured, limits, shared=False)
        if not sat.malformed and (not more or more[0].seconds >= cands[0].seconds):
            break   # nothing better again: the spec as written is the plan
        again.rejected[:0] = [f"(saturation {attempt - 1}) {r}" for r in sat.rejected]
        sat, cands = again, more
    if not cands:
        why = "; ".join(sat.rejected) or "every form left in the e-graph is banned in every plan family"
        result = _as_stages(spec, sizes, device, limits)
        if result is None:
            raise SpecError(f"spec {spec.name}: no plan could be extracted ({why})")
        if plan is not None:
            raise PlanError(f"spec {spec.name} runs as {result.summary()}; --plan names the plan of one kernel")
        result.staged_because = "no one kernel runs this spec (reductions over several long axes)"
        return result
    if plan is not None:
        cands = _force(cands, plan, spec.name)
    elif cands[0].sched.writes_loop and not spec.also and (one := _one_kernel_cost(cands[0], sizes, device)).programs < \
            UNDER_FILLED * device.sms:
        result = _as_stages(spec, sizes, device, limits, every=True)
        seconds = cands[0].measured or one.seconds
        if result is not None and (staged_seconds := _staged_seconds(result)) < seconds:
            result.staged_because = (
                f"the one-kernel plan ({cands[0].family}) writes along its loop axis {cands[0].sched.loop} with "
                f"{one.programs} programs on {device.sms} SMs: staged {staged_seconds * 1e6:.1f} us against its "
                f"{seconds * 1e6:.1f} us")
            return result
    best = cands[0]
    tuned = config_for(measured, best.family)
    src = module_source(best.plan, module_name(spec), spec_file or "SPEC.py", out_file or "OUT.py",
                        tuned, configs_by_gpu(spec.name, best.family), device.name)
    check_names(src, spec)
    return Result(spec, sat, cands, src, tuned, device, measured, key_prefix(spec.name, sizes, device.name), plan)


UNDER_FILLED = 0.5     # of the SMs: a one-kernel plan with fewer programs is priced against stages
STAGE_LAUNCH = 4e-6    # seconds priced for each kernel launch a staged plan adds


def _one_kernel_cost(best: Candidate, sizes: dict[str, int], device: Device) -> PlanCost:
    """The best one-kernel plan's cost with the programs it launches (one row each where it streams rows). Where
    it writes along its loop axis (so it cannot be split into chunks) with too few programs to fill the GPU --
    a softmax or a norm over a few very long rows -- stages are priced against it."""
    return plan_cost(best.sched, sizes, device, block_rows=1) if best.sched.streams_rows else best.cost


def _staged_seconds(result: Result) -> float:
    return sum(r.chosen.rank() for _, r in result.stages) + result.chosen.rank() + STAGE_LAUNCH * len(result.stages)


def _as_stages(spec: Spec, sizes: dict[str, int], device: Device, limits: Limits | None,
               every: bool = False) -> Result | None:
    """The spec as stages (plan/stages.py), each optimized as a spec of its own: what no one kernel runs, or,
    with `every`, every reduction over a long axis, so that the last kernel writes in parallel. None where
    staging gives no stages (one kernel runs the spec as written) or does not help."""
    if spec.also:   # stages write one output each
        return None
    try:
        stages, last = staged(spec, every=every)
    except SpecError:
        return None
    if not stages:
        return None
    try:
        parts = tuple((st, _compiled(st.spec, sizes, device, limits)) for st in stages)
        final = _compiled(last, sizes, device, limits)
    except SpecError:   # a stage refused, e.g. for a name clash (hygiene.py): optional stages fall back
        if every:
            return None
        raise
    source = staged_module_source(spec, [(st, r.source) for st, r in parts], last, final.source)
    return replace(final, spec=spec, source=source, stages=parts, last=final)


def _checked_sizes(spec: Spec, sizes: dict) -> dict[str, int]:
    """Sizes to price plans at, each a dim of the spec with a positive int."""
    if problem := unknown_dims(spec, sizes):
        raise SpecError(problem)
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"spec {spec.name}: size {name} must be a positive int, got {value!r}")
    return sizes


def _force(cands: list[Candidate], family: str, spec_name: str) -> list[Candidate]:
    """The candidates with `family` first (the others stay listed, for --explain)."""
    forced = [c for c in cands if c.family == family]
    if not forced:
        raise PlanError(f"spec {spec_name} has no {family!r} plan; the plans extracted are: "
                        f"{', '.join(dict.fromkeys(c.family for c in cands))}")
    return forced + [c for c in cands if c.family != family]
