"""Every rule carries a proof obligation; unsound rules are refused and never join a ruleset."""
import sympy as sp
from egglog import EGraph, eq

from neptune_eqsat.ir.eterm import ETerm

from neptune_eqsat.proof.symbolic import derive_repair
from neptune_eqsat.proof.rulebook import identity, make_ruleset
from neptune_eqsat.rules import ALL_RULES, FAMILIES, TERM_FAMILIES


def test_softmax_repair_is_derived_and_proved():
    rep = derive_repair("sum", "mul")
    t, r, rp = sp.symbols("t r r'", real=True)
    assert rep.proved and rep.h == "r'*t/r"
    assert rep.shape == "mul" and rep.factor == str(rp / r) == "r'/r"
    assert rep.factor_tree == ["div", ["r'"], ["r"]]   # what the rolling rule builds its e-graph term from


def test_division_repair_is_t_r_over_r_prime():
    rep = derive_repair("sum", "div")
    assert rep.proved and rep.h in ("r*t/r'", "t*r/r'")


def test_repairs_that_do_not_distribute_are_refused():
    for reducer, combine in [("sum", "add"), ("sum", "sub"), ("max", "mul"), ("min", "div")]:
        rep = derive_repair(reducer, combine)
        assert not rep.proved, (reducer, combine)
        assert "cannot prove" in rep.reason


def test_max_repairs_are_proved_by_case_free_rewriting():
    assert derive_repair("max", "add").proved and derive_repair("min", "sub").proved


def test_every_active_rule_is_proved():
    names = {r.name for r in ALL_RULES}
    assert {"exp-split", "roll-sum-mul", "roll-sum-div", "sum-pull-div", "prev-binary"} <= names
    for r in ALL_RULES:
        stmt, ok = r.proof
        assert stmt
        if r.name in ("exp-split", "exp-merge-div", "mul-regroup", "sum-pull-div", "max-pull-sub", "roll-max-add"):
            assert ok, r.name
    assert not next(r for r in ALL_RULES if r.name == "sum-pull-add").proof[1]  # sum(x + c) != sum(x) + c


def test_planted_unsound_rule_is_refused_and_left_out():
    bad = identity("exp-of-sum-is-sum-of-exp", "algebra", "wrong on purpose",
                   lambda o, a, b: o.un("exp", o.bin("add", a, b)),
                   lambda o, a, b: o.bin("add", o.un("exp", a), o.un("exp", b)), 2)
    stmt, ok = bad.proof
    assert not ok and "exp(a + b)" in stmt
    good = identity("exp-of-sum", "algebra", "right", lambda o, a, b: o.un("exp", o.bin("add", a, b)),
                    lambda o, a, b: o.bin("mul", o.un("exp", a), o.un("exp", b)), 2)
    assert good.proof[1]
    a, b = ETerm.axis("a"), ETerm.axis("b")
    lhs = ETerm.un("exp", ETerm.bin("add", a, b))
    for rule_, name, equal in ((bad, "planted_bad", False), (good, "planted_good", True)):
        eg = EGraph()
        x = eg.let("x", lhs)
        eg.run(make_ruleset(name, [rule_]) * 2)
        target = (ETerm.bin("add", ETerm.un("exp", a), ETerm.un("exp", b)) if rule_ is bad
                  else ETerm.bin("mul", ETerm.un("exp", a), ETerm.un("exp", b)))
        assert eg.check_bool(eq(x).to(target)) is equal


def test_families_are_separate_rulesets():
    assert set(FAMILIES) == {"algebra", "reduction", "substitution", "rolling", "scalar", "splitk"}
    assert all(r.family in FAMILIES or r.family in TERM_FAMILIES for r in ALL_RULES)


def test_a_second_test_of_a_mask_under_its_exp_is_absorbed():
    """where(p, a * exp(where(p, s, -inf) - r), 0) is a * exp(...) (the exp is 0 where p is false): proved, and
    fired only where both tests are the same mask."""
    absorbed = next(r for r in ALL_RULES if r.name == "mask-absorbed-by-exp")
    assert absorbed.proof[1]
    i, j, a, s, r = (ETerm.axis(n) for n in ("i", "j", "a", "s", "r"))
    neg_inf, zero = ETerm.const(float("-inf")), ETerm.const(0.0)

    def masked_product(test, mask):
        e = ETerm.cast("f16", ETerm.un("exp2", ETerm.bin("sub", ETerm.where(mask, s, neg_inf), r)))
        return ETerm.where(test, ETerm.bin("mul", a, e), zero), ETerm.bin("mul", a, e)

    causal, other = ETerm.bin("ge", i, j), ETerm.bin("gt", i, j)
    for test, equal in ((causal, True), (other, False)):
        lhs, rhs = masked_product(test, causal)
        eg = EGraph()
        x = eg.let("x", lhs)
        eg.run(make_ruleset("absorbed", [absorbed]) * 2)
        assert eg.check_bool(eq(x).to(rhs)) is equal


def test_a_positive_scale_leaves_the_maximum_and_the_mask():
    """max_j(x * k) = max_j(x) * k and where(p, a * k, -inf) = where(p, a, -inf) * k, for constants k > 0: both
    proved, fired only for a positive k (a negative one turns a maximum into a minimum, and -inf into +inf). The
    chosen plans then take their row maximum over the raw scores and scale it once per row, so that the
    exponent's s * k - m * k is one multiply-add per element (bench/experiments/2026-11-26-raw-max-fma)."""
    pulls = {r.name: r for r in ALL_RULES if r.name in ("max-pull-positive-constant", "constant-out-of-mask")}
    assert set(pulls) == {"max-pull-positive-constant", "constant-out-of-mask"}
    assert all(r.proof[1] for r in pulls.values())
    p, x = ETerm.axis("p"), ETerm.axis("x")
    neg_inf = ETerm.const(float("-inf"))
    for k, fires in ((0.125, True), (-0.125, False)):
        scaled = ETerm.bin("mul", x, ETerm.const(k))
        for lhs, rhs in ((ETerm.red("max", "j", scaled), ETerm.bin("mul", ETerm.red("max", "j", x), ETerm.const(k))),
                         (ETerm.where(p, scaled, neg_inf), ETerm.bin("mul", ETerm.where(p, x, neg_inf),
                                                                    ETerm.const(k)))):
            eg = EGraph()
            e = eg.let("e", lhs)
            eg.run(make_ruleset(f"pulls{k}", list(pulls.values())) * 2)
            assert eg.check_bool(eq(e).to(rhs)) is fires, (k, lhs)


def test_an_identity_that_cancels_a_division_is_refused():
    """(a * b) / b = a: sympy cancels the left side as it builds it, so the obligation read a = a and the rule
    fired, giving a value where the spec has none (b = 0). The divisions each side makes are compared first."""
    cancel = identity("cancel-div", "algebra", "planted: (a * b) / b = a",
                      lambda o, a, b: o.bin("div", o.bin("mul", a, b), b), lambda o, a, b: a, 2)
    stmt, ok = cancel.proof
    assert not ok and "divides by b and the right does not" in stmt
    kept = identity("scale-over-difference", "algebra", "(a - b) / c = a / c - b / c",
                    lambda o, a, b, c: o.bin("div", o.bin("sub", a, b), c),
                    lambda o, a, b, c: o.bin("sub", o.bin("div", a, c), o.bin("div", b, c)), 3)
    assert kept.proof[1]
