"""prev_j(x): x computed from the previous partial values of the reductions over j (the repair's r).

prev_j is a substitution, so it moves into every operation; it stops at a reduction over j (which becomes
the previous partial value itself) and vanishes on values that use no reduction over j.
"""
from neptune_eqsat.proof.lazy import sympy as sp
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
def _obligation(statement: str, sides):
    """lhs = rhs with (lhs, rhs) = sides(r, r', A, B, C, X, f, g, W, K, Red_k), built when it is proved."""
    def check() -> tuple[str, bool]:
        R, RP = sp.symbols("r r'", real=True)
        return statement, proves(*sides(R, RP, *(sp.Function(n)(R) for n in ("A", "B", "C", "X")),
                                        *(sp.Function(n) for n in ("f", "g", "W", "K", "Red_k"))))
    return check


def _prev(e, R, RP):
    return e.subs(R, RP)


PROOFS = {
    "prev-unused": ("prev_j(x) = x for x free of r",
                    lambda R, RP, A, B, C, X, *_: (_prev(X.subs(R, 0), R, RP), X.subs(R, 0))),
    "prev-unary": ("prev_j(f(A(r))) = f(A(r'))",
                   lambda R, RP, A, B, C, X, F, *_: (_prev(F(A), R, RP), F(_prev(A, R, RP)))),
    "prev-binary": ("prev_j(g(A(r), B(r))) = g(A(r'), B(r'))",
                    lambda R, RP, A, B, C, X, F, G, *_: (_prev(G(A, B), R, RP), G(_prev(A, R, RP), _prev(B, R, RP)))),
    "prev-where": ("prev_j(W(C(r), A(r), B(r))) = W(C(r'), A(r'), B(r'))",
                   lambda R, RP, A, B, C, X, F, G, W, *_: (_prev(W(C, A, B), R, RP),
                                                           W(_prev(C, R, RP), _prev(A, R, RP), _prev(B, R, RP)))),
    "prev-cast": ("prev_j(K(A(r))) = K(A(r'))",
                  lambda R, RP, A, B, C, X, F, G, W, K, _: (_prev(K(A), R, RP), K(_prev(A, R, RP)))),
    "prev-other-reduction": ("prev_j(Red_k(A(r))) = Red_k(A(r')) (a reduction over k != j keeps r fixed)",
                             lambda R, RP, A, B, C, X, F, G, W, K, RED: (_prev(RED(A), R, RP), RED(_prev(A, R, RP)))),
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
