"""Rules as data. A rule is a name, a family, a one-line meaning, the egglog commands it adds and its proof
obligation. Identities are written once, as a pattern over an `ops` object, and become both the egglog
rewrite (EggOps) and the sympy obligation (SymOps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from neptune_eqsat.ir import ops
from neptune_eqsat.proof import verdicts
from neptune_eqsat.proof.lazy import sympy as sp
from neptune_eqsat.proof.symbolic import SymOps, proves


class RuleDeclarationError(ValueError):
    """The rule files declare something that cannot be (a name twice): every command that reads the rules says so."""


class EggOps:
    """Builds e-graph patterns from rule patterns (egglog is imported where a ruleset is built: the rules'
    obligations and term rewrites need only sympy)."""
    def __init__(self):
        from neptune_eqsat.ir.eterm import ETerm
        self.term = ETerm

    def un(self, fn, a): return self.term.un(fn, a)
    def bin(self, fn, a, b): return self.term.bin(fn, a, b)
    def cast(self, dtype, a): return self.term.cast(dtype, a)
    def const(self, v): return self.term.const(v)


@dataclass
class Rule:
    name: str
    family: str
    meaning: str
    egglog: Callable[[], list]                  # the commands this rule adds to its ruleset
    obligation: Callable[[], tuple[str, bool]]  # (statement, proved)
    # numeric check: values -> None when the rule holds there, else a description of the counterexample
    numeric: Callable[[list[float]], str | None] | None = None
    nvalues: int = 0
    example: tuple[str, str] | None = None      # a tiny term before and after the rewrite

    @cached_property
    def proof(self) -> tuple[str, bool]:
        """(statement, proved), kept in the verdict cache under the rule and the files that state it (so a
        compile whose rules are unchanged proves nothing, and never imports sympy)."""
        return self.prove()

    def prove(self) -> tuple[str, bool]:
        """The proof from the verdict cache, or proved now (always, inside verdicts.reproving()) and stored."""
        files = sorted(_defining_files(self.obligation))
        question = "|".join([self.family, self.name, self.meaning, *(verdicts.source_digest(f) for f in files)])
        statement, proved = verdicts.recall("rule", question,
                                            lambda: (lambda st, ok: [str(st), bool(ok)])(*self.obligation()))
        self.__dict__["proof"] = (statement, proved)
        return statement, proved

    def counterexample(self, examples: int = 200) -> str | None:
        """Search random values with hypothesis; the shrunk counterexample, or None."""
        if self.numeric is None:
            return None
        from hypothesis import HealthCheck, given, settings, strategies as st
        found: list[str] = []
        values = st.floats(-6, 6, allow_nan=False, allow_subnormal=False)

        @settings(max_examples=examples, database=None, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(values, min_size=self.nvalues, max_size=self.nvalues))
        def holds(vals: list[float]) -> None:
            bad = self.numeric(vals)
            if bad is not None:
                found.append(bad)
                raise AssertionError(bad)

        try:
            holds()
        except AssertionError:
            return found[-1]
        return None


def _defining_files(fn, depth: int = 3) -> set[str]:
    """The source files of a function and of the functions its closure holds (a rule's obligation is often a
    closure over the patterns that state it)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return set()
    files = {code.co_filename}
    if depth:
        for cell in fn.__closure__ or ():
            try:
                files |= _defining_files(cell.cell_contents, depth - 1)
            except ValueError:   # an empty cell
                pass
    return files


def close(x: float, y: float) -> bool:
    """Equal up to rounding, with infinities and NaNs equal to themselves."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y or (x * y > 0 and abs(x) > 1e300 and abs(y) > 1e300)
    return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))


class ShowOps:
    """Renders rule patterns as text, for examples."""
    def un(self, fn, a): return f"-{a}" if fn == "neg" else f"{fn}({a})"
    def bin(self, fn, a, b):
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}.get(fn)
        return f"({a} {sym} {b})" if sym else f"{fn}({a}, {b})"
    def cast(self, dtype, a): return f"cast({a}, {dtype})"
    def const(self, v): return repr(v)


class NumOps:
    """Evaluates rule patterns on floats."""
    UN = {name: op.python for name, op in ops.UN.items()}
    BIN = {name: op.python for name, op in ops.BIN.items()}
    REDUCE = {"sum": BIN["add"], "max": max, "min": min}   # a reducer's binary step

    def un(self, fn, a): return self.UN[fn](a)
    def bin(self, fn, a, b): return self.BIN[fn](a, b)
    def cast(self, dtype, a): return a
    def const(self, v): return v


class _Divisions(SymOps):
    """SymOps that notes each divisor as the pattern is built (before sympy cancels it away)."""
    def __init__(self):
        self.divisors: list = []

    def bin(self, fn, a, b):
        if fn == "div":
            self.divisors.append(b)
        return super().bin(fn, a, b)

    def dropped_by(self, other: "_Divisions") -> list:
        """Divisors of this side that may be 0 and that no divisor of `other` shares its zeros with (equal up to
        a nonzero constant factor)."""
        def shares(d, e) -> bool:
            ratio = sp.simplify(d / e)
            return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
        return [d for d in self.divisors   # (sympy knows where a divisor is never 0: exp(b), a nonzero constant)
                if d.is_zero is not False and not any(shares(d, e) for e in other.divisors)]


def evaluate_both(lhs: Callable, rhs: Callable):
    """A numeric check of lhs = rhs: None where they agree (or are undefined), else the counterexample."""
    def check(vals: list[float]) -> str | None:
        try:
            left, right = lhs(NumOps(), *vals), rhs(NumOps(), *vals)
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
        return None if close(left, right) else f"values {vals}: left {left!r} != right {right!r}"
    return check


def identity(name: str, family: str, meaning: str, lhs: Callable, rhs: Callable, nvars: int,
             conditions: Callable | None = None) -> Rule:
    """A rewrite lhs -> rhs whose obligation is lhs = rhs over the reals."""
    letters = list("abcdefgh"[:nvars])

    def build() -> list:
        from egglog import eq, rule, union, var

        from neptune_eqsat.ir.eterm import ETerm
        vs = [var(n, ETerm) for n in letters]
        e = var("matched", ETerm)
        conds = conditions(*vs) if conditions else ()
        return [rule(eq(e).to(lhs(EggOps(), *vs)), *conds, name=name).then(union(e).with_(rhs(EggOps(), *vs)))]

    def obligation() -> tuple[str, bool]:
        syms = sp.symbols(letters, real=True)
        lo, ro = _Divisions(), _Divisions()
        left, right = lhs(lo, *syms), rhs(ro, *syms)
        statement = f"{left} = {right}"
        lost = [] if conditions else lo.dropped_by(ro)
        if lost:   # sympy cancels (a * b) / b as it builds it: the obligation alone would read a = a
            return f"{statement}, but the left side divides by {lost[0]} and the right does not: the rewrite " \
                   f"would give a value where the left has none ({lost[0]} = 0)", False
        return statement, proves(left, right)

    names = ["x[i, j]", "m[i]", "v[j]", "w", "y", "z", "u", "t"][:nvars]
    example = (lhs(ShowOps(), *names), rhs(ShowOps(), *names))
    return Rule(name, family, meaning, build, obligation, evaluate_both(lhs, rhs), nvars, example)


def make_ruleset(name: str, rules: list[Rule], extra: list | None = None):
    """The egglog ruleset of a family: only the rules whose obligation is proved."""
    from egglog import ruleset
    rs = ruleset(name=name)
    for r in rules:
        if r.proof[1]:
            for cmd in r.egglog():
                rs.append(cmd)
    for cmd in extra or []:
        rs.append(cmd)
    return rs
