"""Extraction prices e-classes as trees; `plan/sharing.py` then prefers, among forms of equal tree cost, the one
that reuses what the term computes anyway."""
import re

from neptune_eqsat.plan.sharing import share
from neptune_eqsat.plan.snapshot import ENode, Snapshot, best_nodes

from conftest import SPECS, compiled


def _work_cost(n, kids):   # (work,): one unit a node, summed over the children as extraction does
    return (1 + sum(k[0] for k in kids),)


def _masked_scores(reuse: str, extra: dict | None = None) -> Snapshot:
    """root = pair(M, E): M = max(W) with W = where(p, s); E has two forms, where(p, s*k) (as written) and
    `reuse`*k, which reads W (or what `extra` builds on it) again."""
    leaf = lambda name: ENode(name, (), ())   # noqa: E731
    return Snapshot("root", {
        "p": [leaf("p")], "s": [leaf("s")], "k": [leaf("k")],
        "sk": [ENode("mul", (), ("s", "k"))],
        "W": [ENode("where", (), ("p", "s"))],
        **(extra or {}),
        "M": [ENode("max", (), ("W",))],
        "E": [ENode("where", (), ("p", "sk")), ENode("mul", (), (reuse, "k"))],
        "root": [ENode("pair", (), ("M", "E"))],
    })


def test_an_equal_cost_form_that_reuses_a_computed_value_is_taken():
    snap = _masked_scores("W")   # both forms of E cost the same as trees
    classes = snap.classes
    best, costs = best_nodes(snap, _work_cost, preferred={classes["E"][0], *[n for c, ns in classes.items()
                                                                             if c != "E" for n in ns]})
    assert best["E"] == classes["E"][0]   # the tree costs tie; the form as written wins the tie
    shared = share(snap, best, costs, _work_cost)
    assert shared["E"] == classes["E"][1]
    assert costs["E"][0] == _work_cost(shared["E"], [costs[k][0] for k in shared["E"].kids])   # same tree cost


def test_a_form_of_higher_tree_cost_is_never_taken_for_sharing():
    snap = _masked_scores("W2", {"W2": [ENode("neg", (), ("W",))]})   # the second form costs one more
    best, costs = best_nodes(snap, _work_cost)
    assert share(snap, best, costs, _work_cost)["E"] == snap.classes["E"][0]


def test_attention_under_a_mask_computes_its_masked_scores_once():
    """The maximum and the exponent read the same masked scores (before, grouped-query attention tested its
    mask twice per element: once for the maximum, once for the exponent's scaled scores)."""
    for name in ("gqa_pf", "causal_pf", "gqa_dc"):
        result, _ = compiled(str(SPECS / f"{name}.py"))
        plan = re.search(r"^PLAN = '(.*)'$", result.source, re.M)[1]
        assert len(re.findall(r", -inf\)", plan)) == 1, (name, plan)   # one where(mask, scores, -inf)
