"""Rolling update of a sum whose body is a polynomial in a value x that waits for other reductions over j.

For sum_j g(u_j, x) with g a polynomial in x (u + x, u - x, (u - x)^2, ...), the sum over a prefix cannot be
re-tagged from its own value alone (the t-only repair of rolling.py is refused for sum of add: the shift
counts once per element). Taylor's formula in x is exact for a polynomial, so the prefix sum moves from the
old x (r) to the new one (r') by
    sum_j g(u_j, r') = sum_j g(u_j, r) + sum_k (r' - r)^k * sum_j g_k(u_j, r),   g_k = (d/dx)^k g / k!
and every sum_j g_k(u_j, r) is itself a running reduction over the same prefix: a lower-degree body of
the same kind (rolled in turn by these rules) or, for a constant g_k, a count of the prefix. The repair
reads those running values as they were before the block (prev_j), the same way a repair reads prev_j(x).
Sympy derives the g_k, finds each as a constant times a body of the table, and proves the expansion on a
symbolic prefix; a body none of whose derivatives is in the table is refused.

With a mean written as sum_j x / count (reduction.py's `mean-as-count`), prev_j(x) is the mean of the prefix,
the first-order moment sum_j (u_j - x) is ~0, and this is Welford's / Chan's update of the squared deviation.
"""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from egglog import String, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, deps, free
from neptune_eqsat.proof import verdicts
from neptune_eqsat.proof.lazy import sympy as sp
from neptune_eqsat.proof.rulebook import EggOps, NumOps, Rule, ShowOps, close

from .splitk import CHUNKS
from neptune_eqsat.proof.symbolic import SymOps, proves


def _ux():
    return sp.symbols("u x", real=True)

# bodies g(u, x) polynomial in x, as patterns over an ops object (EggOps, SymOps, NumOps, ShowOps)
BODIES = {
    "add": lambda o, u, x: o.bin("add", u, x),
    "sub": lambda o, u, x: o.bin("sub", u, x),
    "rsub": lambda o, u, x: o.bin("sub", x, u),
    "square-of-sub": lambda o, u, x: o.bin("mul", o.bin("sub", u, x), o.bin("sub", u, x)),
    "square-of-rsub": lambda o, u, x: o.bin("mul", o.bin("sub", x, u), o.bin("sub", x, u)),
    "square-of-add": lambda o, u, x: o.bin("mul", o.bin("add", u, x), o.bin("add", u, x)),
}
COUNT = "count"   # a constant coefficient: the sum of 1 over the prefix


@lru_cache(maxsize=None)
def moments(body: str) -> tuple[tuple[int, Fraction, str], ...] | str:
    """The Taylor terms of g in x as (k, c, name): g_k = c * BODIES[name] (or c * 1 for COUNT); or the reason
    there are none. Derived by sympy once, then read from the verdict cache (keyed by this file)."""
    found = verdicts.recall("moments", f"{body}|{verdicts.source_digest(__file__)}", lambda: _moments(body))
    return found if isinstance(found, str) else tuple((k, Fraction(c), name) for k, c, name in found)


def _moments(body: str) -> list | str:
    U, X = _ux()
    g = BODIES[body](SymOps(), U, X)
    degree = sp.degree(sp.expand(g), X)
    out = []
    for k in range(1, degree + 1):
        gk = sp.expand(sp.diff(g, X, k) / sp.factorial(k))
        if not gk.has(U) and not gk.has(X):
            out.append([k, str(gk), COUNT])
            continue
        for name, form in BODIES.items():
            ratio = sp.cancel(gk / form(SymOps(), U, X))   # a rational function: cancel decides a constant ratio
            if ratio.is_Number and ratio != 0:
                out.append([k, str(ratio), name])
                break
        else:
            return f"its derivative {gk} is no body of the table"
    return out


def _obligation(body: str):
    """On a symbolic prefix u_1..u_3: sum g(u_i, r') = sum g(u_i, r) + sum_k (r' - r)^k c_k sum T_k(u_i, r)."""
    def check() -> tuple[str, bool]:
        terms = moments(body)
        U, X = _ux()
        g = lambda u, x: BODIES[body](SymOps(), u, x)   # noqa: E731
        if isinstance(terms, str):
            return f"sum of {g(U, X)}: refused: {terms}", False
        us, r, rp = sp.symbols("u1:4", real=True), sp.Symbol("r", real=True), sp.Symbol("r'", real=True)
        moved = sum(g(u, r) for u in us)
        for k, c, name in terms:
            inner = len(us) if name == COUNT else sum(BODIES[name](SymOps(), u, r) for u in us)
            moved += (rp - r) ** k * sp.Rational(c.numerator, c.denominator) * inner
        shown = " + ".join(f"(r' - r)^{k} * {c} * sum({'1' if n == COUNT else BODIES[n](SymOps(), U, X)})"
                           for k, c, n in terms)
        return (f"sum_j {g(U, X)} at r' = the sum at r + {shown}",
                proves(sum(g(u, rp) for u in us), moved))
    return check


def _aux(name: str, j, u, x):
    """The running reduction whose previous value a repair reads: sum_j T(u, x), or the prefix count."""
    body = ETerm.const(1.0) if name == COUNT else BODIES[name](EggOps(), u, x)
    return ETerm.red("sum", j, body)


def repair_term(body: str, j, u, x):
    """acc + finite_or_zero(sum_k c_k (x - prev_j(x))^k prev_j(sum_j g_k)): before anything is accumulated
    the prefix sums are 0 while prev_j(x) may not be finite (0 / 0), and the correction must stay 0."""
    step = ETerm.bin("sub", x, ETerm.prev(j, x))
    total = None
    for k, c, name in moments(body):
        power = step
        for _ in range(k - 1):
            power = ETerm.bin("mul", power, step)
        term = ETerm.bin("mul", ETerm.bin("mul", ETerm.const(float(c)), power), ETerm.prev(j, _aux(name, j, u, x)))
        total = term if total is None else ETerm.bin("add", total, term)
    return ETerm.bin("add", ETerm.acc(), ETerm.un("finite_or_zero", total))


def _egglog(body: str, name: str):
    def build() -> list:
        u, x, m, j = var("u", ETerm), var("x", ETerm), var("matched", ETerm), var("j", String)
        form = BODIES[body](EggOps(), u, x)
        return [rule(m == ETerm.red("sum", j, form), deps(x).contains(j), free(x).not_contains(j),
                     deps(u).not_contains(j), name=name)
                .then(union(m).with_(ETerm.roll("sum", j, form, repair_term(body, j, u, x))))]
    return build


def _numeric(body: str):
    """The rolled loop on u_1..u_3 while x takes r_1..r_3, each moment kept exactly for its prefix: the
    result must equal sum_i g(u_i, r_3)."""
    g = lambda u, x: BODIES[body](NumOps(), u, x)   # noqa: E731

    def check(vals: list[float]) -> str | None:
        terms = moments(body)
        us, rs = vals[:3], vals[3:]
        acc = g(us[0], rs[0])
        for n in (1, 2):
            prefix, r, rp = us[:n], rs[n - 1], rs[n]
            for k, c, name in terms:
                inner = len(prefix) if name == COUNT else sum(BODIES[name](NumOps(), u, r) for u in prefix)
                acc += float(c) * (rp - r) ** k * inner
            acc += g(us[n], rp)
        want = sum(g(u, rs[2]) for u in us)
        return None if close(acc, want) else f"u = {us}, x = {rs}: rolled {acc!r} != direct {want!r}"
    return check


def _example(body: str) -> tuple[str, str]:
    before = f"sum(j, {BODIES[body](ShowOps(), 'u[i, j]', 'x')})"
    terms = moments(body)
    if isinstance(terms, str):
        return before, f"(not rewritten: {terms})"
    shown = " + ".join(f"{c} * (x - prev_j(x))^{k} * prev_j(sum(j, "
                       f"{'1' if n == COUNT else BODIES[n](ShowOps(), 'u[i, j]', 'x')}))" for k, c, n in terms)
    return before, f"roll_sum(j, ..., repair=acc + finite_or_zero({shown}))"


RULES = [Rule(f"roll-sum-moments-{b}", "rolling",
              f"sum_j of the polynomial {BODIES[b](ShowOps(), 'u', 'x')} in one pass, repaired by its Taylor "
              f"moments over the prefix", _egglog(b, f"roll-sum-moments-{b}"), _obligation(b), _numeric(b), 6,
              _example(b))
         for b in BODIES]


def _split_egglog(body: str, name: str):
    def build() -> list:
        u, x, m, j = var("u", ETerm), var("x", ETerm), var("matched", ETerm), var("j", String)
        form, repair = BODIES[body](EggOps(), u, x), repair_term(body, j, u, x)
        return [rule(m == ETerm.roll("sum", j, form, repair), name=name)
                .then(union(m).with_(ETerm.split("sum", j, CHUNKS, form, repair)))]
    return build


# A chunk is a prefix of its own: the expansion that moves a prefix's sum to a new x moves a chunk's partial
# from the chunk's x to the global one, its moments re-tagged the same way (the derivative of the combined
# sum is the combined first moment at the new x). For the squared deviation this is Chan's parallel update.
SPLIT_RULES = [Rule(f"split-roll-sum-moments-{b}", "splitk",
                    f"roll_sum_j({BODIES[b](ShowOps(), 'u', 'x')}) in chunks, each partial moved to the global x by "
                    f"its moments", _split_egglog(b, f"split-roll-sum-moments-{b}"), _obligation(b), _numeric(b), 6,
                    (f"roll_sum(j, {BODIES[b](ShowOps(), 'u[i, j]', 'x[i]')}, repair=h)",
                     f"split_sum(j / chunks, {BODIES[b](ShowOps(), 'u[i, j]', 'x[i]')}, repair=h)"))
               for b in BODIES]
