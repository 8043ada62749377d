"""Rules as data. A rule is a name, a family, a one-line meaning, the egglog commands it adds and its proof
obligation. Identities are written once, as a pattern over an `ops` object, and become both the egglog
rewrite (EggOps) and the sympy obligation (SymOps).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import sympy as sp
from egglog import Ruleset, eq, rule, ruleset, union, var

from .eterm import ETerm
from .proof import SymOps, proves


class EggOps:
    """Builds e-graph patterns from rule patterns."""
    def un(self, fn, a): return ETerm.un(fn, a)
    def bin(self, fn, a, b): return ETerm.bin(fn, a, b)
    def cast(self, dtype, a): return ETerm.cast(dtype, a)
    def const(self, v): return ETerm.const(v)


@dataclass
class Rule:
    name: str
    family: str
    meaning: str
    egglog: Callable[[], list]                  # the commands this rule adds to its ruleset
    obligation: Callable[[], tuple[str, bool]]  # (statement, proved)

    @cached_property
    def proof(self) -> tuple[str, bool]:
        return self.obligation()


def identity(name: str, family: str, meaning: str, lhs: Callable, rhs: Callable, nvars: int,
             conditions: Callable | None = None) -> Rule:
    """A rewrite lhs -> rhs whose obligation is lhs = rhs over the reals."""
    letters = list("abcdefgh"[:nvars])

    def build() -> list:
        vs = [var(n, ETerm) for n in letters]
        e = var("matched", ETerm)
        conds = conditions(*vs) if conditions else ()
        return [rule(eq(e).to(lhs(EggOps(), *vs)), *conds, name=name).then(union(e).with_(rhs(EggOps(), *vs)))]

    def obligation() -> tuple[str, bool]:
        syms = sp.symbols(letters, real=True)
        left, right = lhs(SymOps(), *syms), rhs(SymOps(), *syms)
        return f"{left} = {right}", proves(left, right)

    return Rule(name, family, meaning, build, obligation)


def make_ruleset(name: str, rules: list[Rule], extra: list | None = None) -> Ruleset:
    """The egglog ruleset of a family: only the rules whose obligation is proved."""
    rs = ruleset(name=name)
    for r in rules:
        if r.proof[1]:
            for cmd in r.egglog():
                rs.append(cmd)
    for cmd in extra or []:
        rs.append(cmd)
    return rs
