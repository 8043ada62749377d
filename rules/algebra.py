"""Real-number identities that expose the separable form of a reduction body and simplify repair terms.

Each rule is proved by sympy before it joins the ruleset (casts only round, so they are the identity here).
"""
from neptune_eqsat.proof.lazy import sympy as sp
from egglog import String, f64, ne, rule, union, var

from neptune_eqsat.ir.eterm import AxisSet, ETerm, deps
from neptune_eqsat.proof.symbolic import SymOps, proves
from neptune_eqsat.proof.rulebook import Rule, evaluate_both, identity, make_ruleset

F = "algebra"


def _subtracts_a_reduction(a, b, c):
    """Only where the subtracted side reads a reduction (x - max_j x): the form the rolling rules look for.
    Elsewhere a scale over a difference of positions (slope * (j - i)) stays one rounding, not two."""
    return (ne(deps(b)).to(AxisSet.empty()),)


RULES = [
    identity("exp-split", F, "exp(a - b) = exp(a) * exp(-b): separates what a body takes from a finished reduction",
             lambda o, a, b: o.un("exp", o.bin("sub", a, b)),
             lambda o, a, b: o.bin("mul", o.un("exp", a), o.un("exp", o.un("neg", b))), 2),
    identity("exp-merge-mul", F, "exp(a) * exp(b) = exp(a + b)",
             lambda o, a, b: o.bin("mul", o.un("exp", a), o.un("exp", b)),
             lambda o, a, b: o.un("exp", o.bin("add", a, b)), 2),
    identity("exp-merge-div", F, "exp(a) / exp(b) = exp(a - b): one transcendental instead of two",
             lambda o, a, b: o.bin("div", o.un("exp", a), o.un("exp", b)),
             lambda o, a, b: o.un("exp", o.bin("sub", a, b)), 2),
    identity("sub-of-negations", F, "-a - -b = b - a",
             lambda o, a, b: o.bin("sub", o.un("neg", a), o.un("neg", b)),
             lambda o, a, b: o.bin("sub", b, a), 2),
    identity("mul-regroup", F, "(a * b) * c = (a * c) * b: moves a factor to the outside of a product",
             lambda o, a, b, c: o.bin("mul", o.bin("mul", a, b), c),
             lambda o, a, b, c: o.bin("mul", o.bin("mul", a, c), b), 3),
    identity("mul-commute", F, "a * b = b * a",
             lambda o, a, b: o.bin("mul", a, b), lambda o, a, b: o.bin("mul", b, a), 2),
    identity("div-over-difference", F, "(a - b) / c = a / c - b / c: a row scale on a difference reaches each "
             "side, so a body exp((x - m) / t) shows its exp(u - x) form",
             lambda o, a, b, c: o.bin("div", o.bin("sub", a, b), c),
             lambda o, a, b, c: o.bin("sub", o.bin("div", a, c), o.bin("div", b, c)), 3, _subtracts_a_reduction),
    identity("mul-over-difference", F, "c * (a - b) = c * a - c * b: the same for a scale written as a factor",
             lambda o, a, b, c: o.bin("mul", c, o.bin("sub", a, b)),
             lambda o, a, b, c: o.bin("sub", o.bin("mul", c, a), o.bin("mul", c, b)), 3, _subtracts_a_reduction),
    identity("div-regroup", F, "(a / c) * b = (a * b) / c: a divisor moves to the outside of a product (where a "
             "reduction can take it out)",
             lambda o, a, b, c: o.bin("mul", o.bin("div", a, c), b),
             lambda o, a, b, c: o.bin("div", o.bin("mul", a, b), c), 3),
]


def _cast_of_product() -> list:
    """For every dtype: the rounding moves to one factor, so the other may leave the reduction."""
    a, b, m, dtype = var("a", ETerm), var("b", ETerm), var("matched", ETerm), var("dtype", String)
    return [rule(m == ETerm.cast(dtype, ETerm.bin("mul", a, b)), name="cast-of-product")
            .then(union(m).with_(ETerm.bin("mul", ETerm.cast(dtype, a), b)))]


def _cast_of_product_obligation() -> tuple[str, bool]:
    a, b = sp.symbols("a b", real=True)
    o = SymOps()   # a cast of any dtype is the identity on the reals
    return "cast(a * b) = cast(a) * b (any dtype; a cast only rounds)", proves(o.cast("any", a * b), o.cast("any", a) * b)


RULES.append(Rule("cast-of-product", F, "cast(a * b) = cast(a) * b for a cast to any dtype (a cast only rounds)",
                  _cast_of_product, _cast_of_product_obligation))


def _mask_absorbed() -> list:
    """where(p, a * e, 0) = a * e for e = exp(where(p, s, -inf) - r), in base e or 2, rounded or not: e is 0
    wherever p is false, so the product is too (a gradient's dS = P (dP - D) under a mask). Over the reals a is
    finite; a factor rounded to 16 bits that overflows makes NaN here where the mask made 0, as the rounded
    product overflows where the mask is true."""
    p, a, s, r, m, dtype = (*(var(n, ETerm) for n in "pasr"), var("matched", ETerm), var("dtype", String))
    found = []
    for fn in ("exp", "exp2"):
        e = ETerm.un(fn, ETerm.bin("sub", ETerm.where(p, s, ETerm.const(float("-inf"))), r))
        for name, factor in ((f"mask-absorbed-by-{fn}", e), (f"mask-absorbed-by-rounded-{fn}", ETerm.cast(dtype, e))):
            found.append(rule(m == ETerm.where(p, ETerm.bin("mul", a, factor), ETerm.const(0.0)), name=name)
                         .then(union(m).with_(ETerm.bin("mul", a, factor))))
    return found


def _mask_absorbed_obligation() -> tuple[str, bool]:
    c, a, s, r = sp.symbols("c a s r", real=True)
    masked = sp.Piecewise((s, sp.Ne(c, 0)), (-sp.oo, True))   # where(c, s, -inf)
    ok = all(proves(sp.Piecewise((a * e, sp.Ne(c, 0)), (0, True)), a * e)
             for e in (sp.exp(masked - r), 2 ** (masked - r)))
    return "where(c, a * exp(where(c, s, -inf) - r), 0) = a * exp(where(c, s, -inf) - r) (and in base 2)", ok


RULES.append(Rule("mask-absorbed-by-exp", F, "where(p, a * exp(where(p, s, -inf) - r), 0) = a * exp(where(p, s, "
                  "-inf) - r): the exp is 0 where the mask is false, so a second test of the mask is redundant",
                  _mask_absorbed, _mask_absorbed_obligation))


def _guarded_exp() -> list:
    x, m = var("x", ETerm), var("matched", ETerm)
    return [rule(m == ETerm.un("finite_or_zero", ETerm.un("exp", x)), name="guarded-exp")
            .then(union(m).with_(ETerm.un("exp_or_zero", x)))]


def _guarded_exp_obligation() -> tuple[str, bool]:
    x, o = sp.Symbol("x", real=True), SymOps()
    return ("finite_or_zero(exp(x)) = exp_or_zero(x) (the registry's forms; both 0 where exp overflows)",
            proves(o.un("finite_or_zero", o.un("exp", x)), o.un("exp_or_zero", x)))


RULES.append(Rule("guarded-exp", F, "finite_or_zero(exp(x)) = exp_or_zero(x): an exp whose overflow is caught "
                  "cannot spoil a result", _guarded_exp, _guarded_exp_obligation,
                  evaluate_both(lambda o, x: o.un("finite_or_zero", o.un("exp", x)),
                                lambda o, x: o.un("exp_or_zero", x)), 1))


def _div_by_constant() -> list:
    a, m, c = var("a", ETerm), var("matched", ETerm), var("c", f64)
    return [rule(m == ETerm.bin("div", a, ETerm.const(c)), c != f64(0.0), name="div-by-constant")
            .then(union(m).with_(ETerm.bin("mul", a, ETerm.const(f64(1.0) / c))))]


def _div_by_constant_obligation() -> tuple[str, bool]:
    a, c = sp.symbols("a c", real=True, nonzero=True)
    return "a / c = a * (1/c), c a nonzero constant", proves(a / c, a * (1 / c))


RULES.append(Rule("div-by-constant", F, "a / c = a * (1/c) for a constant c: a multiply instead of a divide",
                  _div_by_constant, _div_by_constant_obligation))

algebra = make_ruleset("algebra", RULES)
