"""Proof obligations with sympy.

An identity is proved when sympy simplifies lhs - rhs to 0. sympy leaves Max/Min alone, so they are first
written as (a + b ± |a - b|) / 2, which it can reason about under sign assumptions.
Casts are the identity on the reals (they only round), so obligations treat them as such.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from neptune_eqsat.ir import ops
from neptune_eqsat.proof import verdicts
from neptune_eqsat.proof.lazy import sympy as sp


def _max(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = (out + x + sp.Abs(out - x)) / 2
    return out


def _min(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = (out + x - sp.Abs(out - x)) / 2
    return out


def is_zero(e: sp.Expr) -> bool:
    """Does sympy prove e = 0? The verdict is kept on disk (verdicts.py), keyed by e written out in full."""
    return verdicts.recall("is_zero", sp.srepr(e), lambda: _is_zero(e))


def _is_zero(e: sp.Expr) -> bool:
    e = e.replace(sp.Max, _max).replace(sp.Min, _min)
    if sp.simplify(e) == 0:
        return True
    # hyperbolic functions written as exponentials, which simplify can cancel against exp and 2**x
    as_exp = e.rewrite(sp.exp)
    return as_exp != e and sp.simplify(as_exp) == 0


def proves(lhs: sp.Expr, rhs: sp.Expr) -> bool:
    return is_zero(lhs - rhs)


def simplifies_to(e: sp.Expr, value: sp.Expr) -> bool:
    """Does e simplify to exactly `value` (which may be infinite, where e - value says nothing)?"""
    return verdicts.recall("simplifies_to", f"{sp.srepr(e)}|{sp.srepr(value)}", lambda: bool(sp.simplify(e) == value))


class SymOps:
    """Builds sympy expressions from rule patterns."""
    UN = ops.forms("un", "sympy", sp)
    BIN = ops.forms("bin", "sympy", sp)

    def un(self, fn, a): return self.UN[fn](a)
    def bin(self, fn, a, b): return self.BIN[fn](a, b)
    def cast(self, dtype, a): return a
    def const(self, v): return sp.nsimplify(v)


REDUCER_OPS = {"sum": lambda a, b: a + b, "max": lambda *xs: sp.Max(*xs), "min": lambda *xs: sp.Min(*xs)}


class _Identities:
    """reducer -> its identity as a sympy number (made on first use, like every sympy object here)."""
    def __getitem__(self, reducer: str):
        return {"sum": sp.Integer(0), "max": -sp.oo, "min": sp.oo}[reducer]


IDENTITY = _Identities()


@dataclass(frozen=True)
class Repair:
    """The repair term of a rolling update for `reducer` over a body combine(u, x)."""
    reducer: str
    combine: str
    inverse: str       # combine^-1(t, r), solved by sympy
    h: str             # h(t, r, r') = combine(combine^-1(t, r), r')
    shape: str         # "mul": h = t * K(r, r'); "add": h = t + K(r, r')
    factor: str | None   # K(r, r') as sympy prints it
    proved: bool
    reason: str
    h_text: str | None = None      # h as sympy's srepr
    factor_tree: list | None = None   # the factor as nested lists (repair_tree), read without sympy

    @property
    def h_expr(self) -> sp.Expr | None:
        return None if self.h_text is None else sp.sympify(self.h_text)

    def summary(self) -> str:
        head = f"{self.reducer} of {self.combine}(u, x):"
        if not self.proved:
            return f"{head} refused: {self.reason}"
        return f"{head} g^-1 = {self.inverse}, h(t, r, r') = {self.h}; {self.reason}"


@lru_cache(maxsize=None)
def symbols():
    """t, r, r': the accumulated value, the previous partial value of x and its new value."""
    return sp.symbols("t r r'", real=True)


@lru_cache(maxsize=None)
def derive_repair(reducer: str, combine: str) -> Repair:
    """The repair of a rolling update (see _derive_repair), kept on disk between runs (verdicts.py)."""
    return Repair(**verdicts.recall("repair", f"{reducer}|{combine}",
                                    lambda: vars(_derive_repair(reducer, combine))))


@lru_cache(maxsize=None)
def repair_function(reducer: str, combine: str):
    """h(t, r, r') of derive_repair as a function of floats (the rules' numeric checks), or None where there is
    no h; made once, not for every value checked."""
    rep = derive_repair(reducer, combine)
    return None if rep.h_text is None else sp.lambdify(symbols(), rep.h_expr)


def repair_tree(e) -> list:
    """A repair factor (sympy, in r and r') as nested lists that name the IR's operations, so that the rolling
    rules build their e-graph terms without sympy: ["r"], ["r'"], ["const", v], [op, a, b] for add, sub, mul,
    div (terms that are subtracted or divided last), ["exp", a]."""
    T, R, RP = symbols()
    if e == R:
        return ["r"]
    if e == RP:
        return ["r'"]
    if e.is_Number:
        return ["const", float(e)]
    if isinstance(e, (sp.Add, sp.Mul)):   # positive terms (factors) first, then the subtracted (divided) ones
        add = isinstance(e, sp.Add)
        inverse = (lambda t: t.could_extract_minus_sign()) if add else (lambda t: t.is_Pow and t.exp == -1)
        undo = (lambda t: -t) if add else (lambda t: t.base)
        kept = [t for t in e.args if not inverse(t)]
        out = repair_tree(kept[0]) if kept else ["const", 0.0 if add else 1.0]
        for t in kept[1:]:
            out = ["add" if add else "mul", out, repair_tree(t)]
        for t in e.args:
            if inverse(t):
                out = ["sub" if add else "div", out, repair_tree(undo(t))]
        return out
    if e.is_Pow and e.exp == -1:
        return ["div", ["const", 1.0], repair_tree(e.base)]
    if isinstance(e, sp.exp):
        return ["exp", repair_tree(e.args[0])]
    raise ValueError(f"no term for repair factor {e}")


def _derive_repair(reducer: str, combine: str) -> Repair:
    """Neptune's construction: for out = f(out, g(u, x)) with g separable as combine(u, x), solve
    combine(a, r) = t for a, set h(t, r, r') = combine(a, r'), and prove h(f(y1, y2)) = f(h(y1), h(y2))
    together with h(identity) = identity (so skipped or empty prefixes stay empty)."""
    T, R, RP = symbols()
    g = SymOps.BIN[combine]
    f = REDUCER_OPS[reducer]
    a = sp.Symbol("a", real=True)
    sols = sp.solve(sp.Eq(g(a, R), T), a)
    if len(sols) != 1:
        return Repair(reducer, combine, "?", "?", "", None, False,
                      f"{combine}(a, r) = t has {len(sols)} solutions for a; need exactly one")
    inv = sp.simplify(sols[0])
    h = sp.simplify(g(inv, RP))
    y1, y2 = sp.symbols("y1 y2", real=True)
    hom = proves(h.subs(T, f(y1, y2)), f(h.subs(T, y1), h.subs(T, y2)))
    ident = IDENTITY[reducer]
    keeps_identity = sp.simplify(h.subs(T, ident)) == ident
    k_mul, k_add = sp.simplify(h / T), sp.simplify(h - T)
    shape, factor = ("mul", k_mul) if not k_mul.has(T) else (("add", k_add) if not k_add.has(T) else ("", None))
    if not hom:
        reason = f"cannot prove h({reducer}(y1, y2)) = {reducer}(h(y1), h(y2))"
    elif not keeps_identity:
        reason = f"h does not keep the identity {ident} of {reducer}"
    elif factor is None:
        reason = "h is not t combined with a factor of r, r'"
    else:
        reason = f"proved h({reducer}(y1, y2)) = {reducer}(h(y1), h(y2)) and h({ident}) = {ident}"
    ok = hom and keeps_identity and factor is not None
    return Repair(reducer, combine, str(inv), str(h), shape, None if factor is None else str(factor), ok, reason,
                  sp.srepr(h), None if factor is None else repair_tree(factor))
