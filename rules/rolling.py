"""Rolling update: run a reduction in the same pass as the reductions its body waits for.

For out = f(out, g(u, x)) where g = combine(u, x), u does not use any reduction over j and x uses only
finished reductions over j, sympy derives h(t, r, r') = combine(combine^-1(t, r), r') and proves
h(f(a, b)) = f(h(a), h(b)). A proved pair becomes a rewrite
    red_f(j, combine(u, x))  ->  roll_f(j, combine(u, x), repair)
whose repair term is h with t = acc, r = prev_j(x) (x from the previous partial values) and r' = x. The
factor of h is wrapped in finite_or_zero: while nothing has been accumulated (t is the identity), h keeps
the identity whatever the factor says (proved), so an overflowing factor must not turn 0 into NaN.
"""
from egglog import String, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, deps, free
from neptune_eqsat.proof.symbolic import REDUCER_OPS, derive_repair, repair_function
from neptune_eqsat.proof.rulebook import NumOps, Rule, close

COMBINERS = ("add", "sub", "mul", "div")


def to_eterm(tree: list, r, rp):
    """A repair factor (symbolic.repair_tree: nested lists in r and r') as an e-graph term."""
    head, *args = tree
    if head == "r":
        return r
    if head == "r'":
        return rp
    if head == "const":
        return ETerm.const(float(args[0]))
    if head == "exp":
        return ETerm.un("exp", to_eterm(args[0], r, rp))
    return ETerm.bin(head, to_eterm(args[0], r, rp), to_eterm(args[1], r, rp))


def repair_term(reducer: str, combine: str, j, x):
    """h(acc, prev_j(x), x) as a term: acc op finite_or_zero(K(r, r'))."""
    rep = derive_repair(reducer, combine)
    factor = ETerm.un("finite_or_zero", to_eterm(rep.factor_tree, ETerm.prev(j, x), x))
    return ETerm.bin("mul" if rep.shape == "mul" else "add", ETerm.acc(), factor)


def _egglog(reducer: str, combine: str, name: str):
    def build() -> list:
        u, x, m, j = var("u", ETerm), var("x", ETerm), var("matched", ETerm), var("j", String)
        body = ETerm.bin(combine, u, x)
        return [rule(m == ETerm.red(reducer, j, body), deps(x).contains(j), free(x).not_contains(j),
                     deps(u).not_contains(j), name=name)
                .then(union(m).with_(ETerm.roll(reducer, j, body, repair_term(reducer, combine, j, x))))]
    return build


def _obligation(reducer: str, combine: str):
    def check() -> tuple[str, bool]:
        rep = derive_repair(reducer, combine)
        return rep.summary(), rep.proved
    return check


def _numeric(reducer: str, combine: str):
    """Run the rolled loop on values u_1..u_3 while x takes the values r_1..r_3 (x as its reductions grow):
    acc_k = f(h(acc_{k-1}, r_{k-1}, r_k), g(u_k, r_k)) must equal the reduction of g(u_j, r_3) over all j."""
    f, g = NumOps.REDUCE[reducer], NumOps.BIN[combine]

    def check(vals: list[float]) -> str | None:
        h = repair_function(reducer, combine)
        if h is None:
            return "no repair term to run"
        us, rs = vals[:3], [x if abs(x) > 0.1 else 0.1 for x in vals[3:]]
        try:
            acc = g(us[0], rs[0])
            for k in (1, 2):
                acc = f(h(acc, rs[k - 1], rs[k]), g(us[k], rs[k]))
            want = g(us[0], rs[2])
            for k in (1, 2):
                want = f(want, g(us[k], rs[2]))
        except ZeroDivisionError:
            return None
        return None if close(float(acc), float(want)) else f"u = {us}, x = {rs}: rolled {acc!r} != direct {want!r}"
    return check


def _example(reducer: str, combine: str) -> tuple[str, str]:
    x = "exp(-max(j, s[i, j]))"
    before = f"{reducer}(j, {combine}(u[i, j], {x}))"
    rep = derive_repair(reducer, combine)
    if not rep.proved:
        return before, f"(not rewritten: {rep.reason})"
    factor = rep.factor.replace("r'", "X").replace("r", "prev_j(X)").replace("X", x)
    op = "*" if rep.shape == "mul" else "+"
    return before, f"roll_{reducer}(j, {combine}(u[i, j], {x}), repair=acc {op} finite_or_zero({factor}))"


RULES = [Rule(f"roll-{r}-{c}", "rolling",
              f"{r}_j({c}(u, x)) in one pass with the reductions x waits for, repaired by the derived h",
              _egglog(r, c, f"roll-{r}-{c}"), _obligation(r, c), _numeric(r, c), 6, _example(r, c))
         for r in REDUCER_OPS for c in COMBINERS]
