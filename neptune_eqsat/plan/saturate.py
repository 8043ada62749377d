"""Equality saturation in rounds of rule families, under node and time limits.

egglog has no limits of its own, so the driver runs one round at a time and checks the e-graph size and the
clock between rounds. A round is one egglog run: the analyses to a fixpoint, then one step of each family in the
order in which each one feeds the next (SCHEDULE); rounds repeat while the e-graph changes. Saturation stops
when
  saturated    -- no family changed the e-graph in a round;
  plan stable  -- a whole round left the e-graph, analyses included, as it was (what still matches belongs to
                  rules that the back-off bans because they match too often, and applies nothing): every
                  extraction reads the same e-graph, so the extracted plans cannot change any more;
  node limit / time limit -- whatever stops it, the e-graph holds every plan found so far and extraction
                  still works.
Comparing the extracted plans themselves after every round would cost more than the saturation (extraction
calls the Python cost model for every e-node of every plan family); comparing the serialized e-graph costs
milliseconds and is exact: an unchanged e-graph cannot extract to another plan.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field

from egglog import EGraph, back_off, run, seq, set_

from neptune_eqsat.ir.eterm import ETerm, Mirror, egraph_size, extent
from neptune_eqsat.ir import Term
from neptune_eqsat.rules import FAMILIES
from neptune_eqsat.rules.analysis import analysis

# algebra exposes the separable form of reduction bodies; reduction moves what does not vary out of them, so
# that rolling finds bodies combine(u, x) with x read from finished reductions; rolling's repair terms bring
# prev_j, which substitution pushes down to the reductions; splitk privatizes plain and rolled reductions;
# scalar last: it rewrites the per-element work of the forms found above, repair terms included. Each family
# takes one step per round: with two, the back-off carries its bans from one step to the next within the
# round and the rewrites that match often (commuting products, folding constants) fire in other rounds, which
# grew the e-graph by a fifth on the soft-capped specs and changed which of equal-cost terms was extracted.
SCHEDULE = ("algebra", "reduction", "rolling", "substitution", "splitk", "scalar")


@dataclass
class Limits:
    max_nodes: int = 20_000
    max_seconds: float = 20.0
    match_limit: int = 400   # per rule and step


@dataclass
class Saturation:
    egraph: EGraph
    root: ETerm
    mirror: Mirror
    fired: Counter = field(default_factory=Counter)   # rule name -> matches
    steps: int = 0     # family steps (one family's rewrites once), len(schedule) per round
    rounds: int = 0    # rounds of the schedule
    schedule: tuple = ()   # the families of a round, in order
    nodes: int = 0
    seconds: float = 0.0
    stop: str = ""     # saturated, plan stable, node limit (...), time limit (...)
    rejected: list = field(default_factory=list)   # extracted terms no plan was made of, and why (see extract)
    malformed: int = 0   # of those, terms that do not read as the spec's own (an extraction anomaly)

    def release(self) -> None:
        """Free the e-graph now, on this thread: the shared e-graph (_Base) goes back to its empty state; a
        fresh one's engine is dropped here. egglog's state sits in reference cycles, so otherwise the cyclic
        collector frees it later on whichever thread runs a collection, and an egglog e-graph may be freed
        only on the thread that made it (a kernel compile thread once collected one: "EGraph is unsendable,
        but is being dropped on another thread")."""
        if _BASE.give_back(self):
            return
        for state in [getattr(self.egraph, "_state", None), *getattr(self.egraph, "_state_stack", [])]:
            if state is not None:
                state.egraph = None

    def summary(self) -> str:
        rounds = f"{self.rounds} round{'s' if self.rounds != 1 else ''}"
        return f"{self.nodes} e-nodes after {self.steps} steps in {rounds}, {self.seconds:.2f} s; stopped: {self.stop}"


class _Base:
    """One e-graph, on the main thread, with every rule family declared and no terms, reused by each
    saturation there (pushed before, popped by Saturation.release). Declaring the rules to a new e-graph took
    0.1-0.25 s a saturation on the two-core development machine, a staged spec's six saturations over a second.
    Other threads, and a saturation while the last one is still held, get a fresh e-graph."""

    def __init__(self) -> None:
        self.egraph: EGraph | None = None
        self.holder = None   # a weak reference to the Saturation that holds the pushed state

    def take(self) -> EGraph | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        if self.holder is not None:
            if self.holder() is not None:
                return None   # still in use
            self.egraph.pop()   # its saturation was dropped without release
            self.holder = None
        if self.egraph is None:
            eg = EGraph()
            eg.run(_round(list(FAMILIES), back_off(match_limit=1, ban_length=2)))   # declares every ruleset
            self.egraph = eg
        self.egraph.push()
        return self.egraph

    def hold(self, sat: "Saturation") -> None:
        self.holder = weakref.ref(sat)

    def give_back(self, sat: "Saturation") -> bool:
        if self.holder is None or self.holder() is not sat:
            return False
        self.egraph.pop()
        self.holder = None
        return True


_BASE = _Base()


def _round(chosen: list[str], scheduler):
    """One round: the analyses to a fixpoint, then one step of every family in turn (analyses between the
    families too made the soft-capped specs' saturation a third slower, for the same plans)."""
    return seq(analysis.saturate(), *(run(FAMILIES[f][0], scheduler=scheduler) for f in chosen))


def _fingerprint(eg: EGraph) -> int:
    """The e-graph's e-nodes and analysis rows, each with its e-class and its children's e-classes."""
    nodes = json.loads(eg._serialize().to_json())["nodes"]
    return hash(frozenset((n["op"], n["eclass"], tuple(nodes[c]["eclass"] for c in n["children"]))
                          for n in nodes.values()))


def saturate(term: Term, limits: Limits | None = None, families: list[str] | None = None,
             extents: dict[str, str] | None = None, shared: bool = True) -> Saturation:
    """`extents`: axis -> the dim it runs over, for the rules that read it (a count over j is that dim);
    `shared`: in the e-graph kept with every rule family declared (_Base) where it is free, else a fresh one."""
    limits = limits or Limits()
    order = [f for f in SCHEDULE if f in FAMILIES] + [f for f in FAMILIES if f not in SCHEDULE]   # new ones last
    unknown = set(families or ()) - set(FAMILIES)
    if unknown:
        raise KeyError(f"no rule family {', '.join(sorted(unknown))}")
    chosen = [f for f in order if families is None or f in families]
    base = _BASE.take() if shared else None
    eg = base or EGraph()
    mirror = Mirror()
    sat = Saturation(eg, None, mirror, schedule=tuple(chosen))
    if base is not None:
        _BASE.hold(sat)
    try:
        sat.root = eg.let("root", mirror.to_egg(term))
        eg.register(*mirror.facts, *(set_(extent(a)).to(d) for a, d in sorted((extents or {}).items())))
        _run_rounds(sat, chosen, limits)
    except BaseException:
        sat.release()
        raise
    return sat


def _run_rounds(sat: Saturation, chosen: list[str], limits: Limits) -> None:
    eg = sat.egraph
    # back-off bans a rule for the step once it matches too often, so one step cannot explode
    one_round = _round(chosen, back_off(match_limit=limits.match_limit, ban_length=2))   # one egglog run
    t0 = time.perf_counter()
    size, before = 0, None
    while not sat.stop:
        sat.rounds += 1
        sat.steps += len(chosen)
        report = eg.run(one_round)
        for decl, n in report.num_matches_per_rule.items():
            if n and getattr(decl, "name", None) and decl.name != "":
                sat.fired[decl.name] += n
        sat.nodes = egraph_size(eg)
        if not report.updated:
            sat.stop = "saturated"
        elif sat.nodes > limits.max_nodes:
            sat.stop = f"node limit ({sat.nodes} > {limits.max_nodes})"
        elif time.perf_counter() - t0 > limits.max_seconds:
            sat.stop = f"time limit ({limits.max_seconds:g} s)"
        else:   # the table sizes are free to read: serialize only once they hardly change over a round
            total = sum(n for _, n in eg.all_function_sizes())
            now = _fingerprint(eg) if abs(total - size) <= total // 100 else None
            if now is not None and now == before:
                sat.stop = "plan stable"
            size, before = total, now
    eg.run(analysis.saturate())
    sat.seconds = time.perf_counter() - t0
    sat.nodes = egraph_size(eg)
