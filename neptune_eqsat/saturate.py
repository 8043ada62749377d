"""Equality saturation under node and time limits.

egglog has no limits of its own, so the driver runs one step at a time (analyses to a fixpoint, then one
round of every rewrite family) and checks the e-graph size and the clock between steps. Whatever stops it,
the e-graph holds every plan found so far and extraction still works.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from egglog import EGraph, back_off, run, seq

from .eterm import ETerm, Mirror, egraph_size
from .ir import Term


@dataclass
class Limits:
    max_nodes: int = 20_000
    max_seconds: float = 20.0
    max_steps: int = 12
    match_limit: int = 400   # per rule and step


@dataclass
class Saturation:
    egraph: EGraph
    root: ETerm
    mirror: Mirror
    fired: Counter = field(default_factory=Counter)   # rule name -> matches
    steps: int = 0
    nodes: int = 0
    seconds: float = 0.0
    stop: str = ""
    rejected: list = field(default_factory=list)   # extracted terms that do not read as the spec's (see extract)


def saturate(term: Term, limits: Limits | None = None, families: list[str] | None = None) -> Saturation:
    from .rules import FAMILIES, analysis  # the rules import the engine, not the other way round at load

    limits = limits or Limits()
    eg = EGraph()
    mirror = Mirror()
    root = eg.let("root", mirror.to_egg(term))
    eg.register(*mirror.facts)
    chosen = [FAMILIES[f][0] for f in (families or list(FAMILIES))]
    # back-off bans a rule for a few steps once it matches too often, so one step cannot explode
    scheduler = back_off(match_limit=limits.match_limit, ban_length=2)
    step = seq(analysis.saturate(), *(run(rs, scheduler=scheduler) for rs in chosen))
    sat = Saturation(eg, root, mirror)
    t0 = time.perf_counter()
    sat.stop = "step limit"
    for sat.steps in range(1, limits.max_steps + 1):
        report = eg.run(step)
        for decl, n in report.num_matches_per_rule.items():
            if n and getattr(decl, "name", None) and decl.name != "":
                sat.fired[decl.name] += n
        sat.nodes = egraph_size(eg)
        if not report.updated:
            sat.stop = "saturated"
            break
        if sat.nodes > limits.max_nodes:
            sat.stop = f"node limit ({sat.nodes} > {limits.max_nodes})"
            break
        if time.perf_counter() - t0 > limits.max_seconds:
            sat.stop = f"time limit ({limits.max_seconds:g} s)"
            break
    eg.run(analysis.saturate())
    sat.seconds = time.perf_counter() - t0
    sat.nodes = egraph_size(eg)
    return sat
