"""Sharing among the cheapest terms: extraction prices every e-class as a tree, so two forms of equal cost tie
even where one of them reuses a value the term computes anyway. A masked score is the usual case: the maximum
reads where(p, s, -inf) (the scale moved out of it), and the exponent reads either where(p, s*k, -inf), as
written, or where(p, s, -inf)*k, which is the maximum's operand once more and, with the exponent's shift, one
fused multiply-add per element instead of a multiply, a select and an add.

`share` starts from the chosen e-nodes and swaps, one e-class at a time, the chosen e-node for another of the
same tree cost (so nothing the plan families and the cost model compare changes) wherever that lowers the work
of the distinct e-classes the term reaches, which is what a kernel computes once each. Every swap keeps the
costs monotone along the chosen e-nodes, so the term stays acyclic."""
from __future__ import annotations

from neptune_eqsat.plan.snapshot import ENode, Snapshot

SWEEPS = 4   # each sweep visits every reached e-class once; a swap rarely enables another


def _reached(best: dict[str, ENode], root: str) -> list[str]:
    """The e-classes the chosen e-nodes reach from the root, each once, parents before children."""
    seen, order, stack = set(), [], [root]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        order.append(c)
        stack.extend(reversed(best[c].kids))
    return order


def share(snap: Snapshot, best: dict[str, ENode], costs: dict[str, tuple], cost) -> dict[str, ENode]:
    """`best` with e-nodes of equal tree cost swapped in where the term then reaches less distinct work; `cost`
    and `costs` are best_nodes' (the work is a cost tuple's last field, summed over a node's children)."""
    def value(n: ENode):
        return cost(n, [costs[k][0] for k in n.kids]) if all(k in costs for k in n.kids) else None

    def own(n: ENode) -> float:   # the node's own work: its tree cost's work less its children's
        return value(n)[-1] - sum(costs[k][0][-1] for k in n.kids)

    def work(choice: dict[str, ENode]) -> float:
        return sum(own(choice[c]) for c in _reached(choice, snap.root))

    best = dict(best)
    total = work(best)
    for _ in range(SWEEPS):
        swapped = False
        for c in _reached(best, snap.root):
            target = costs[c][0]
            for n in snap.classes[c]:
                if n == best[c] or value(n) != target:
                    continue
                trial = {**best, c: n}
                lower = work(trial)
                if lower < total:
                    best, total, swapped = trial, lower, True
                    break
        if not swapped:
            break
    return best
