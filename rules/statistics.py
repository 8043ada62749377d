"""Row statistics as one value: exp(a - m) / sum_j exp(b - m) = exp(a - (m + log sum_j exp(b - m))).

The stager (plan/stages.py) computes a statistic of a row -- a value without the row's axis -- as a kernel of
its own. Written as a maximum and a sum, a softmax's statistics are two stages, each a pass over the row; as the
one value m + log(sum_j exp(b - m)) (its log-sum-exp) they are one stage, whose own plan rolls the maximum and
the sum into one pass. The rewrite is applied to the stager's terms, not inside the e-graph; the sum is
positive wherever the row has an element above -inf, and where it has none both sides are undefined.
"""
import math

from neptune_eqsat.proof.lazy import sympy as sp

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.proof.rulebook import Rule, close
from neptune_eqsat.proof.symbolic import proves

F = "statistics"


# the two forms, over numbers (sympy or math): a softmax and a log-softmax, as written and with one statistic
FORMS = {
    "log-normalize": ("exp(a - m) / l = exp(a - (m + log l))", lambda f, a, m, l: f.exp(a - m) / l,
                      lambda f, a, m, l: f.exp(a - (m + f.log(l)))),
    "log-normalize-difference": ("(a - m) - log l = a - (m + log l)", lambda f, a, m, l: (a - m) - f.log(l),
                                 lambda f, a, m, l: a - (m + f.log(l))),
}


def _obligation(name: str):
    def check() -> tuple[str, bool]:
        statement, *forms = FORMS[name]
        a, m, l = (*sp.symbols("a m", real=True), sp.Symbol("l", positive=True))
        left, right = (form(sp, a, m, l) for form in forms)
        return f"{statement} for l > 0", proves(left, right)
    return check


def _numeric(name: str):
    def check(vals: list[float]) -> str | None:
        a, m, l = vals[0], vals[1], math.exp(vals[2])
        left, right = (form(math, a, m, l) for form in FORMS[name][1:])
        return None if close(left, right) else f"a={a}, m={m}, l={l}: {left!r} != {right!r}"
    return check


RULES = [Rule("log-normalize", F, "exp(a - m) / sum_j exp(b - m) = exp(a - (m + log sum_j exp(b - m))): a "
              "softmax's statistics as one log-sum-exp, one stage", lambda: [], _obligation("log-normalize"),
              _numeric("log-normalize"), 3, ("exp(x[i, j] - m[i]) / sum(j, exp(x[i, j] - m[i]))",
                                            "exp(x[i, j] - (m[i] + log(sum(j, exp(x[i, j] - m[i])))))")),
         Rule("log-normalize-difference", F, "(a - m) - log sum_j exp(b - m) = a - (m + log sum_j exp(b - m)): a "
              "log-softmax's statistics as one", lambda: [], _obligation("log-normalize-difference"),
              _numeric("log-normalize-difference"), 3,
              ("(x[i, j] - m[i]) - log(sum(j, exp(x[i, j] - m[i])))",
               "x[i, j] - (m[i] + log(sum(j, exp(x[i, j] - m[i]))))"))]
PROVED = {r.name: r for r in RULES}


def _shifted_exp(t: Term) -> tuple[Term, Term] | None:
    """(a, m) for t = exp(a - m), else None."""
    if t.op == "un" and t.attrs[0] == "exp" and t.args[0].op == "bin" and t.args[0].attrs[0] == "sub":
        return t.args[0].args[0], t.args[0].args[1]
    return None


def _normalizer(l: Term, m: Term) -> bool:
    """Is l = sum_j exp(b - m) for this m?"""
    body = _shifted_exp(l.args[0]) if l.op == "red" and l.attrs[0] == "sum" else None
    return body is not None and body[1] == m


def _rewrite(y: Term) -> Term:
    """One node: exp(a - m) / l -> exp(a - (m + log l)) and (a - m) - log l -> a - (m + log l), l normalizing m."""
    if y.op != "bin":
        return y
    if y.attrs[0] == "div" and PROVED["log-normalize"].proof[1]:
        top = _shifted_exp(y.args[0])
        if top is not None and _normalizer(y.args[1], top[1]):
            return ir.un("exp", ir.bin("sub", top[0], ir.bin("add", top[1], ir.un("log", y.args[1]))))
    if y.attrs[0] == "sub" and PROVED["log-normalize-difference"].proof[1]:
        diff, log = y.args
        if (diff.op == "bin" and diff.attrs[0] == "sub" and log.op == "un" and log.attrs[0] == "log"
                and _normalizer(log.args[0], diff.args[1])):
            return ir.bin("sub", diff.args[0], ir.bin("add", diff.args[1], log))
    return y


def log_normalized(t: Term) -> Term:
    """t with a softmax's and a log-softmax's statistics written as one (the rules above, where proved)."""
    return ir.bottom_up(t, _rewrite)
