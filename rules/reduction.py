"""Move a value that does not vary along j out of a reduction over j, e.g. sum_j(x / c) = sum_j(x) / c.

Generated for every (reducer, operation) pair; only pairs whose obligation sympy proves join the ruleset:
the operation distributes over the reducer, (y1 f y2) op c = (y1 op c) f (y2 op c), and keeps the reducer's
identity (an empty range stays empty).
"""
import functools

from neptune_eqsat.proof.lazy import sympy as sp
from egglog import String, eq, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, extent, free
from neptune_eqsat.proof.symbolic import IDENTITY, REDUCER_OPS, SymOps, proves, simplifies_to
from neptune_eqsat.proof.rulebook import NumOps, Rule, close, make_ruleset

OPS = ("add", "sub", "mul", "div")


def _obligation(reducer: str, op: str):
    def check() -> tuple[str, bool]:
        y1, y2, c = sp.symbols("y1 y2 c", real=True)
        f, g, ident = REDUCER_OPS[reducer], SymOps.BIN[op], IDENTITY[reducer]
        distributes = proves(g(f(y1, y2), c), f(g(y1, c), g(y2, c)))
        keeps = simplifies_to(g(ident, c), ident)
        return f"{reducer}(y1, y2) {op} c = {reducer}(y1 {op} c, y2 {op} c) and {ident} {op} c = {ident}", \
            bool(distributes and keeps)
    return check


def _egglog(reducer: str, op: str, name: str):
    def build() -> list:
        x, c, m, j = var("x", ETerm), var("c", ETerm), var("matched", ETerm), var("j", String)
        return [rule(m == ETerm.red(reducer, j, ETerm.bin(op, x, c)), free(c).not_contains(j), name=name)
                .then(union(m).with_(ETerm.bin(op, ETerm.red(reducer, j, x), c)))]
    return build


def _numeric(reducer: str, op: str):
    """Three values of x and one c: reduce(x op c) against reduce(x) op c."""
    step, apply = NumOps.REDUCE[reducer], NumOps.BIN[op]

    def check(vals: list[float]) -> str | None:
        xs, c = vals[:3], vals[3]
        try:
            left, right = functools.reduce(step, [apply(x, c) for x in xs]), apply(functools.reduce(step, xs), c)
        except ZeroDivisionError:
            return None
        return None if close(left, right) else f"x = {xs}, c = {c}: {left!r} != {right!r}"
    return check


RULES = [Rule(f"{r}-pull-{op}", "reduction", f"{r}_j(x {op} c) = {r}_j(x) {op} c when c does not vary along j",
              _egglog(r, op, f"{r}-pull-{op}"), _obligation(r, op), _numeric(r, op), 4,
              (f"{r}(j, x[i, j] {op} c[i])", f"{r}(j, x[i, j]) {op} c[i]"))
         for r in REDUCER_OPS for op in OPS]



def _count_egglog() -> list:
    a, m, j, n = var("a", ETerm), var("matched", ETerm), var("j", String), var("n", String)
    total = ETerm.red("sum", j, a)
    return [rule(m == ETerm.bin("div", total, ETerm.dim(n)), eq(extent(j)).to(n), name="mean-as-count")
            .then(union(m).with_(ETerm.bin("div", total, ETerm.red("sum", j, ETerm.const(1.0)))))]


def _count_obligation() -> tuple[str, bool]:
    k, n = sp.Symbol("k", integer=True), sp.Symbol("N", integer=True, positive=True)
    return "sum_{k=0}^{N-1} 1 = N", simplifies_to(sp.summation(sp.Integer(1), (k, 0, n - 1)), n)


# a mean over j divides by the count of j: as a reduction too, its value over a prefix of j is the prefix's
# count, so a rolled loop reads the prefix's own mean (moments.py: Welford's update) instead of a partial sum
# over the whole row's count
RULES.append(Rule("mean-as-count", "reduction", "sum_j(a) / N = sum_j(a) / sum_j(1) where j runs over N",
                  _count_egglog, _count_obligation, None, 0, ("sum(j, x[i, j]) / N", "sum(j, x[i, j]) / sum(j, 1)")))

reduction = make_ruleset("reduction", RULES)
