"""A saturated e-graph read once into plain Python: its e-classes, their e-nodes and the analyses the cost model
needs, so that extraction runs without crossing into egglog.

egglog's own extraction calls a Python cost model for every e-node each time a child's cost changes, through
its expression objects: on the two-core development machine that was half of a compile (0.1-0.5 s for three
plan families). The serialized e-graph holds the same facts (e-nodes with their e-classes, analysis rows as
function nodes whose e-class holds their value) and costs milliseconds to read.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from egglog import EGraph

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term
from neptune_eqsat.ir.eterm import Mirror, load_key

# constructor -> how many of its leading arguments are literals (names, numbers); the rest are e-classes
LITERALS = {"axis": 1, "dim": 1, "const": 1, "load": 2, "un": 1, "bin": 1, "where": 0, "cast": 1, "red": 2,
            "roll": 2, "split": 3, "acc": 0, "prev": 1, "pack": 0}
SET_ANALYSES = ("free", "deps")                          # e-class -> a set of axis names
FLAG_ANALYSES = ("nonpositive", "running_max", "running_min", "whole_count")   # e-class -> present or not


@dataclass(frozen=True)
class ENode:
    op: str                 # the constructor: axis, load, bin, red, ...
    lits: tuple             # its literal arguments, in order
    kids: tuple[str, ...]   # the e-classes of its other arguments, in order


@dataclass
class Snapshot:
    root: str
    classes: dict[str, list[ENode]]
    sets: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)   # analysis -> e-class -> axes
    flags: dict[str, set[str]] = field(default_factory=dict)                    # analysis -> e-classes

    def axes(self, analysis: str, eclass: str) -> frozenset[str]:
        return self.sets[analysis].get(eclass, frozenset())

    def flag(self, analysis: str, eclass: str) -> bool:
        return eclass in self.flags[analysis]


def _literal(text: str):
    """A primitive's value as egglog prints it: a quoted string, or a number (inf, -inf and NaN included)."""
    if text.startswith('"'):
        try:
            return json.loads(text)
        except ValueError:
            return text[1:-1]
    return float(text)


def _fits(name: str, lits: tuple) -> bool:
    """Does each literal of an e-node name what its place holds (a dtype for a cast, an operator for un and
    bin, a reducer)? egglog 13.2 now and then builds an e-node whose string literals are another of the rule's
    strings (cast("mul", x) or bin("f16", a, b), from cast(a * b) = cast(a) * b, seen under load on two
    cores): such an e-node is dropped, and extraction takes another of its e-class. A literal swapped for
    another of the same kind (mul for sub) fits; translation validation (validate.py) refuses that term."""
    if name == "cast":
        return lits[0] in ir.DTYPES
    if name in ("un", "bin"):
        return lits[0] in (ops.UN if name == "un" else ops.BIN)
    if name in ("red", "roll", "split"):
        return lits[0] in ir.REDUCERS
    return True


def snapshot(eg: EGraph) -> Snapshot:
    data = json.loads(eg._serialize().to_json())
    nodes, by_class = data["nodes"], {}
    for nid, n in nodes.items():
        by_class.setdefault(n["eclass"], []).append(nid)
    roots = [c for c, d in data.get("class_data", {}).items() if d.get("let") == "$root"]
    if len(roots) != 1:
        raise RuntimeError(f"the serialized e-graph names {len(roots)} root e-classes")
    snap = Snapshot(roots[0], {}, {a: {} for a in SET_ANALYSES}, {a: set() for a in FLAG_ANALYSES})
    for nid, n in nodes.items():
        op = n["op"]
        if op.startswith("ETerm."):
            if n.get("subsumed"):
                continue
            name = op.rsplit(".", 1)[1]
            k = LITERALS[name]
            kids = n["children"]
            lits = tuple(_literal(nodes[c]["op"]) for c in kids[:k])
            if not _fits(name, lits):   # (see _fits)
                continue
            snap.classes.setdefault(n["eclass"], []).append(ENode(name, lits, tuple(nodes[c]["eclass"]
                                                                                     for c in kids[k:])))
        elif op in SET_ANALYSES:
            value = [nodes[m] for m in by_class[n["eclass"]] if nodes[m]["op"] == "Set"]
            if len(value) != 1:
                raise RuntimeError(f"the serialized e-graph holds {len(value)} values for one {op} row")
            snap.sets[op][nodes[n["children"][0]]["eclass"]] = frozenset(_literal(nodes[c]["op"])
                                                                         for c in value[0]["children"])
        elif op in FLAG_ANALYSES:
            snap.flags[op].add(nodes[n["children"][0]]["eclass"])
    return snap


def written(snap: Snapshot, term: Term) -> set[ENode]:
    """The e-nodes of the term as it was given (before any rewrite)."""
    index = {n: c for c, enodes in snap.classes.items() for n in enodes}
    found: set[ENode] = set()
    memo: dict[Term, str | None] = {}

    def go(t: Term) -> str | None:
        if t in memo:
            return memo[t]
        if t.op == "pack" and len(t.args) > 2:   # n outputs: nested pairs in the e-graph
            return go(ir.pack(t.args[0], ir.pack(*t.args[1:])))
        if t.op == "load":
            n = ENode("load", (t.attrs[0], load_key(t.args)), ())
        else:
            kids = tuple(go(a) for a in t.args)
            n = ENode(t.op, tuple(t.attrs[:LITERALS[t.op]]), kids) if None not in kids else None
        memo[t] = index.get(n) if n is not None else None
        if memo[t] is not None:
            found.add(n)
        return memo[t]

    go(term)
    return found


def best_nodes(snap: Snapshot, cost, preferred: set[ENode] = frozenset()) -> tuple[dict[str, ENode], dict[str, tuple]]:
    """The cheapest e-node of every e-class under `cost(enode, kid_costs) -> tuple` (compared as a tuple),
    found by sweeping every e-node until nothing gets cheaper. Equal costs go to the term with fewer e-nodes
    outside `preferred` (the term as written), then to the smaller term, then to a hash of its structure:
    never to e-class numbers or table order, which depend on what the process saturated before. The cost
    must exceed each child's (monotone): then the sweeps end, and no chosen e-node lies on a cycle. Returns
    the chosen e-nodes and each e-class's (cost, e-nodes not preferred, size, structure hash)."""
    best: dict[str, ENode] = {}
    costs: dict[str, tuple] = {}
    order = [(c, n) for c, enodes in snap.classes.items() for n in enodes]
    changed = True
    while changed:
        changed = False
        for c, n in order:
            kids = []
            for k in n.kids:
                if k not in costs:
                    break
                kids.append(costs[k])
            else:
                new = (n not in preferred) + sum(k[1] for k in kids)
                size = 1 + sum(k[2] for k in kids)
                shape = hashlib.blake2b(repr((n.op, n.lits, [k[3] for k in kids])).encode(), digest_size=8).digest()
                value = (cost(n, [k[0] for k in kids]), new, size, shape)
                if c not in costs or value < costs[c]:
                    costs[c], best[c] = value, n
                    changed = True
    return best, costs


def to_term(snap: Snapshot, best: dict[str, ENode], mirror: Mirror, eclass: str | None = None) -> Term:
    """The term of the chosen e-nodes below `eclass` (the root by default)."""
    memo: dict[str, Term] = {}

    def go(c: str) -> Term:
        if c in memo:
            return memo[c]
        n = best[c]
        if n.op == "load":
            t = Term("load", (n.lits[0],), mirror.loads[(n.lits[0], n.lits[1])])
        elif n.op == "acc":
            t = ir.ACC
        elif n.op in ("axis", "dim", "const"):
            t = Term(n.op, n.lits)
        elif n.op == "pack":   # nested pairs back into one pack of every output
            t = ir.pack(*(y for x in map(go, n.kids) for y in (x.args if x.op == "pack" else (x,))))
        else:
            t = Term(n.op, n.lits, tuple(go(k) for k in n.kids))
        memo[c] = t
        return t

    return go(eclass or snap.root)

