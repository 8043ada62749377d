"""spec -> e-graph -> candidate plans -> chosen plan -> Triton module, with an explanation of each step."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import ir
from .cost import Device
from .extract import Candidate, candidates
from .saturate import Limits, Saturation, saturate
from .spec import Spec, SpecError, load_spec


@dataclass
class Result:
    spec: Spec
    saturation: Saturation
    candidates: list[Candidate]
    source: str
    tuned: dict | None = None   # a measured config from the tuning database, baked into the module

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    def explain(self) -> str:
        from .rules import ALL_RULES
        sat = self.saturation
        by_name = {r.name: r for r in ALL_RULES}
        lines = [f"spec {self.spec.name}: {ir.show(self.spec.output_term)}", "",
                 f"e-graph: {sat.nodes} e-nodes after {sat.steps} steps in {sat.seconds:.2f} s ({sat.stop})",
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
        lines.append("candidate plans (analytic cost):")
        for k, c in enumerate(self.candidates):
            mark = "*" if k == 0 else " "
            lines.append(f" {mark} {c.family:13s} {c.cost.summary()}")
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
        if self.tuned:
            lines.append(f"tunables measured on this GPU (tuning database): {self.tuned}")
        lines.append(f"chosen: {c.family} ({c.sched.passes} pass{'es' if c.sched.passes != 1 else ''} over "
                     f"{c.sched.loop}; rows {c.sched.row}, columns {c.sched.col}, programs over {list(c.sched.grid)})")
        return "\n".join(lines)


def module_name(spec: Spec) -> str:
    return re.sub(r"\W", "_", spec.name)


def optimize(spec: Spec | str | Path, sizes: dict[str, int] | None = None, device: Device | None = None,
             limits: Limits | None = None, spec_file: str | None = None, out_file: str | None = None) -> Result:
    from .codegen.module import module_source

    if not isinstance(spec, Spec):
        spec_file = spec_file or str(spec)
        spec = load_spec(spec)
    sizes = {**spec.typical, **(sizes or {})}
    device = device or Device.detect()
    sat = saturate(spec.output_term, limits)
    cands = candidates(sat, spec, sizes, device)
    if not cands:
        raise SpecError(f"spec {spec.name}: no plan could be extracted")
    best = cands[0]
    plan = "\n".join([f"{best.family}: {best.sched.passes} pass(es) over {best.sched.loop}"] +
                      ir.show_lets(best.term))
    from .tune import stored_config
    tuned = stored_config(spec.name, sizes, device.name)
    src = module_source(best.sched, module_name(spec), plan, spec_file or "SPEC.py", out_file or "OUT.py", tuned)
    return Result(spec, sat, cands, src, tuned)
