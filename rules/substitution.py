"""prev_j(x): x computed from the previous partial values of the reductions over j (the repair's r).

prev_j is a substitution, so it moves into every operation; it stops at a reduction over j (which becomes
the previous partial value itself) and vanishes on values that use no reduction over j.
"""
from egglog import String, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, deps
from neptune_eqsat.proof.rulebook import Rule, make_ruleset

a, b, c, m = (var(n, ETerm) for n in ("a", "b", "c", "matched"))
j, k, s = (var(n, String) for n in ("j", "k", "s"))
P = ETerm.prev


def _rule(name: str, lhs, rhs, *conds):
    return lambda: [rule(m == lhs, *conds, name=name).then(union(m).with_(rhs))]


def _definition() -> tuple[str, bool]:
    return "prev_j substitutes values for the reductions over j; substitution commutes with every operation", True


CASES = [
    ("prev-unused", "prev_j(x) = x when x uses no reduction over j", P(j, a), a, deps(a).not_contains(j)),
    ("prev-unary", "prev_j(f(a)) = f(prev_j(a))", P(j, ETerm.un(s, a)), ETerm.un(s, P(j, a))),
    ("prev-binary", "prev_j(a op b) = prev_j(a) op prev_j(b)", P(j, ETerm.bin(s, a, b)),
     ETerm.bin(s, P(j, a), P(j, b))),
    ("prev-where", "prev_j(where(c, a, b)) = where(prev_j(c), prev_j(a), prev_j(b))", P(j, ETerm.where(c, a, b)),
     ETerm.where(P(j, c), P(j, a), P(j, b))),
    ("prev-cast", "prev_j(cast(a)) = cast(prev_j(a))", P(j, ETerm.cast(s, a)), ETerm.cast(s, P(j, a))),
    ("prev-other-reduction", "prev_j(red_k(a)) = red_k(prev_j(a)) for k != j", P(j, ETerm.red(s, k, a)),
     ETerm.red(s, k, P(j, a)), k != j),
]
RULES = [Rule(name, "substitution", meaning, _rule(name, lhs, rhs, *conds), _definition)
         for name, meaning, lhs, rhs, *conds in CASES]

substitution = make_ruleset("substitution", RULES)
