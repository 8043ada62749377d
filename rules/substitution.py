"""prev_j(x): x computed from the previous partial values of the reductions over j (the repair's r).

prev_j is a substitution, so it moves into every operation; it stops at a reduction over j (which becomes
the previous partial value itself) and vanishes on values that use no reduction over j.
"""
import sympy as sp
from egglog import String, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, deps
from neptune_eqsat.proof.rulebook import Rule, make_ruleset
from neptune_eqsat.proof.symbolic import proves

a, b, c, m = (var(n, ETerm) for n in ("a", "b", "c", "matched"))
j, k, s = (var(n, String) for n in ("j", "k", "s"))
P = ETerm.prev


def _rule(name: str, lhs, rhs, *conds):
    return lambda: [rule(m == lhs, *conds, name=name).then(union(m).with_(rhs))]


# The meaning of prev_j: an expression with each running reduction over j (r) read as the block began (r').
# Sub-terms are unknown functions of r (A(r), B(r), C(r)); f and g stand for any unary and binary operation,
# W for where, K for a cast and Red_k for a reduction over another axis (functions of their operands alone).
_R, _RP = sp.symbols("r r'", real=True)
_A, _B, _C, _X = (sp.Function(n)(_R) for n in ("A", "B", "C", "X"))
_F, _G, _W, _K, _RED = (sp.Function(n) for n in ("f", "g", "W", "K", "Red_k"))


def _prev(e):
    return e.subs(_R, _RP)


def _obligation(statement: str, lhs, rhs):
    return lambda: (statement, proves(lhs, rhs))


PROOFS = {
    "prev-unused": ("prev_j(x) = x for x free of r", _prev(_X.subs(_R, 0)), _X.subs(_R, 0)),
    "prev-unary": ("prev_j(f(A(r))) = f(A(r'))", _prev(_F(_A)), _F(_prev(_A))),
    "prev-binary": ("prev_j(g(A(r), B(r))) = g(A(r'), B(r'))", _prev(_G(_A, _B)), _G(_prev(_A), _prev(_B))),
    "prev-where": ("prev_j(W(C(r), A(r), B(r))) = W(C(r'), A(r'), B(r'))", _prev(_W(_C, _A, _B)),
                   _W(_prev(_C), _prev(_A), _prev(_B))),
    "prev-cast": ("prev_j(K(A(r))) = K(A(r'))", _prev(_K(_A)), _K(_prev(_A))),
    "prev-other-reduction": ("prev_j(Red_k(A(r))) = Red_k(A(r')) (a reduction over k != j keeps r fixed)",
                             _prev(_RED(_A)), _RED(_prev(_A))),
}


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
RULES = [Rule(name, "substitution", meaning, _rule(name, lhs, rhs, *conds), _obligation(*PROOFS[name]))
         for name, meaning, lhs, rhs, *conds in CASES]

substitution = make_ruleset("substitution", RULES)
