"""Split-K update: privatize a reduction over j into chunks computed in parallel, then combine the partials.

A reduction whose body reads no other reduction over j splits by associativity alone:
    red_f(j, body)  ->  split_f(j / chunks, body, repair=acc)
A rolled reduction out = f_j g(u, x) splits with the repair term it already carries: each chunk runs the
rolled loop over its own keys (x from the chunk's own reductions, r_c), and the combine re-tags every partial
to the global x (r) with h, then reduces:
    roll_f(j, g(u, x), repair=h)  ->  split_f(j / chunks, g(u, x), repair=h)
    result = f_c h(P_c, r_c, r)
Two facts make that exact, and they are this family's obligation: h re-tags one element,
h(g(u, r_c), r_c, r) = g(u, r), and h distributes over f, h(f(a, b)) = f(h(a), h(b)), so re-tagging a whole
partial re-tags each of its elements. The chunk count is the term's `chunks` parameter, chosen per shape by
the cost model (and by the generated launcher at run time).
"""
import functools

from neptune_eqsat.proof.lazy import sympy as sp
from egglog import String, eq, rule, union, var

from neptune_eqsat.ir.eterm import ETerm, deps
from neptune_eqsat.proof.symbolic import (IDENTITY, REDUCER_OPS, SymOps, derive_repair, proves, repair_function,
                                          simplifies_to, symbols)
from neptune_eqsat.proof.rulebook import NumOps, Rule, close

from .rolling import repair_term

CHUNKS = "chunks"   # the name of the chunk-count parameter in split terms
COMBINERS = ("add", "sub", "mul", "div")


def _assoc_obligation(reducer: str):
    def check() -> tuple[str, bool]:
        a, b, c = sp.symbols("a b c", real=True)
        f, ident = REDUCER_OPS[reducer], IDENTITY[reducer]
        ok = (proves(f(f(a, b), c), f(a, f(b, c))) and proves(f(a, b), f(b, a))
              and simplifies_to(f(a, ident) - a, sp.Integer(0)))
        return f"{reducer} is associative and commutative with identity {ident}", ok
    return check


def _assoc_numeric(reducer: str):
    """Five values, cut into two chunks at every place: f(f(chunk 1), f(chunk 2)) = f(all)."""
    step = NumOps.REDUCE[reducer]

    def check(vals: list[float]) -> str | None:
        whole = functools.reduce(step, vals)
        for cut in range(1, len(vals)):
            parts = step(functools.reduce(step, vals[:cut]), functools.reduce(step, vals[cut:]))
            if not close(parts, whole):
                return f"values {vals} cut at {cut}: {parts!r} != {whole!r}"
        return None
    return check


def _assoc_egglog(reducer: str, name: str):
    def build() -> list:
        body, m, j = var("body", ETerm), var("matched", ETerm), var("j", String)
        return [rule(m == ETerm.red(reducer, j, body), deps(body).not_contains(j), name=name)
                .then(union(m).with_(ETerm.split(reducer, j, CHUNKS, body, ETerm.acc())))]
    return build


def _retag_obligation(reducer: str, combine: str):
    def check() -> tuple[str, bool]:
        rep = derive_repair(reducer, combine)
        if not rep.proved:
            return f"{reducer} of {combine}(u, x): refused: {rep.reason}", False
        u, rc = sp.symbols("u r_c", real=True)
        T, R, RP = symbols()
        g = SymOps.BIN[combine]
        retags = proves(rep.h_expr.subs({T: g(u, rc), R: rc}, simultaneous=True), g(u, RP))
        return (f"{reducer} of {combine}(u, x): h = {rep.h}; h({combine}(u, r_c), r_c, r') = {combine}(u, r') "
                f"{'proved' if retags else 'not proved'}; {rep.reason}"), bool(retags)
    return check


def _retag_numeric(reducer: str, combine: str):
    """Four elements u_1..u_4 in two chunks whose own x are r_1, r_2; the global x is r. Combining the
    re-tagged partials must equal reducing g(u_k, r) directly."""
    f, g = NumOps.REDUCE[reducer], NumOps.BIN[combine]

    def check(vals: list[float]) -> str | None:
        h = repair_function(reducer, combine)
        if h is None:
            return "no repair term to run"
        us = vals[:4]
        r1, r2, r = (x if abs(x) > 0.1 else 0.1 for x in vals[4:])
        try:
            p1, p2 = f(g(us[0], r1), g(us[1], r1)), f(g(us[2], r2), g(us[3], r2))
            got = f(h(p1, r1, r), h(p2, r2, r))
            want = functools.reduce(f, [g(x, r) for x in us])
        except ZeroDivisionError:
            return None
        return None if close(float(got), float(want)) else \
            f"u = {us}, chunk x = {r1}, {r2}, global x = {r}: combined {got!r} != direct {want!r}"
    return check


def _retag_egglog(reducer: str, combine: str, name: str):
    def build() -> list:
        u, x, rep, m, j = var("u", ETerm), var("x", ETerm), var("repair", ETerm), var("matched", ETerm), \
            var("j", String)
        body = ETerm.bin(combine, u, x)
        # only the repair derived for this body: a rolled sum repaired otherwise (moments.py) is not re-tagged
        # by h alone
        return [rule(m == ETerm.roll(reducer, j, body, rep), eq(rep).to(repair_term(reducer, combine, j, x)),
                     name=name)
                .then(union(m).with_(ETerm.split(reducer, j, CHUNKS, body, rep)))]
    return build


RULES = [Rule(f"split-{r}", "splitk", f"{r}_j(body) in chunks of j combined by {r}, for a body that reads no "
              f"other reduction over j", _assoc_egglog(r, f"split-{r}"), _assoc_obligation(r), _assoc_numeric(r), 5,
              (f"{r}(j, s[i, j])", f"split_{r}(j / chunks, s[i, j], repair=acc)"))
         for r in REDUCER_OPS]
RULES += [Rule(f"split-roll-{r}-{c}", "splitk", f"roll_{r}_j({c}(u, x)) in chunks, partials re-tagged to the "
               f"global x by the rolled repair h", _retag_egglog(r, c, f"split-roll-{r}-{c}"), _retag_obligation(r, c),
               _retag_numeric(r, c), 7,
               (f"roll_{r}(j, {c}(u[i, j], x[i]), repair=h)", f"split_{r}(j / chunks, {c}(u[i, j], x[i]), repair=h)"))
          for r in REDUCER_OPS for c in COMBINERS]
