"""What the planner hands to code generation: the chosen plan, frozen.

A `Plan` holds the extracted term's schedule (which axis the kernel loops over, how rows tile, which
reductions run in which pass) and, for a split plan, its combine step (the second computation that reduces
the chunks' partial results, planned here so that code generation never plans)."""
from __future__ import annotations

from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.frontend.spec import Spec
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.combine import Combine, combine_plan
from neptune_eqsat.plan.schedule import Schedule


@dataclass(frozen=True)
class Plan:
    family: str                     # rolled, unfused, split, ... (+packed for a row-packing layout)
    term: Term                      # the extracted term (the schedule's may name copies of axes, schedule.py)
    schedule: Schedule
    combine: Combine | None = None  # a split plan's combine step

    @staticmethod
    def of(family: str, term: Term, sched: Schedule) -> Plan:
        return Plan(family, term, sched, combine_plan(sched) if sched.split else None)

    @property
    def spec(self) -> Spec:
        return self.schedule.spec

    def text(self) -> str:
        """The plan as the generated module's docstring shows it: the family, its passes and the term."""
        s = self.schedule
        return "\n".join([f"{self.family}: {s.passes} pass(es) over {s.loop}"] + ir.show_lets(self.term))
