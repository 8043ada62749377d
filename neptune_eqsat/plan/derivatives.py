"""Local derivatives of the IR's ops, and the proof that a max only shifts values the output does not see.

Each differentiable op declares, once in the op registry (ir/ops.py), the adjoint of each argument given the op's
own value `t` and its adjoint `A` (a term): `exp` gives `A * t`, a quotient `a / b` gives `A / b` and
`-A * t / b`. Writing a derivative with the op's own value lets the backward read a saved value (the output)
instead of recomputing it. Ops whose value is an integer, a truth value or piecewise constant (comparisons,
`floor`, bit operations) are declared `flat`: their arguments get no gradient, as in torch; an op with neither
is refused by name. `tests/test_autodiff.py` checks every declared derivative against
sympy's `diff` of the op's sympy form.
"""
from __future__ import annotations

import sympy as sp

from neptune_eqsat import ir
from neptune_eqsat.frontend.spec import SpecError
from neptune_eqsat.ir import ops
from neptune_eqsat.proof import symbolic as proof
from neptune_eqsat.ir import Term

ZERO, ONE = ir.const(0.0), ir.const(1.0)


# ---- simplifying constructors: the adjoint should not carry `* 1`, `+ 0` or where(c, 0, 0) into the e-graph ----
def plus(a: Term, b: Term) -> Term:
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    return ir.bin("add", a, b)


def minus(a: Term) -> Term:
    if a == ZERO:
        return a
    if a.op == "un" and a.attrs[0] == "neg":
        return a.args[0]
    return ir.un("neg", a)


def times(a: Term, b: Term) -> Term:
    if ZERO in (a, b):
        return ZERO
    if a == ONE:
        return b
    if b == ONE:
        return a
    for x, y in ((a, b), (b, a)):   # where(c, 0, A) * w[t[r]]: the read stays under the where that guards it
        negated = x.op == "un" and x.attrs[0] == "neg"
        w = x.args[0] if negated else x
        if w.op == "where" and ZERO in w.args[1:] and _reads_at_values(y):
            guarded = ir.where(w.args[0], times(w.args[1], y), times(w.args[2], y))
            return minus(guarded) if negated else guarded
    return ir.bin("mul", a, b)


def _reads_at_values(t: Term) -> bool:
    """Does t read a tensor at an index computed from another tensor's values (a label's row of weights)? A
    where in the forward guards such a read (a label of -100 reads nothing), and the gradient must keep it so."""
    return any(x.op == "load" and any(y.op == "load" for a in x.args for y in ir.walk(a)) for x in ir.walk(t))


def over(a: Term, b: Term) -> Term:
    return ZERO if a == ZERO else (a if b == ONE else ir.bin("div", a, b))


def keep_if(c: Term, a: Term) -> Term:
    """a where c holds, else 0."""
    return ZERO if a == ZERO else ir.where(c, a, ZERO)


def total(a: Term, keep: frozenset[str]) -> Term:
    """a summed over its axes that are not in `keep` (a parent's adjoint reaching a child with fewer axes)."""
    for ax in sorted(a.free - keep):
        a = ir.red("sum", ax, a)
    return a


def over_broadcast(extents: dict, t: Term, child: Term, contribution: Term) -> Term:
    """A contribution from t to its child times the extent (`extents`: axis -> int or Dim) of each axis the
    child is broadcast along but the contribution does not vary along: t's value (with the axis it reduces
    over, for a reduction) runs over axes the child lacks, and the child's adjoint is the sum over them
    (`sum(j, x[r, j] + t[r])` gives t[r] the adjoint N * A, not A). A sum over an axis the contribution does
    vary along stays a sum (`total`)."""
    domain = t.free | ({t.attrs[1]} if ir.is_reduction(t) else set())
    for ax in sorted(domain - child.free - contribution.free):
        ext = extents[ax]
        contribution = times(contribution, ir.const(float(ext)) if isinstance(ext, int) else ir.dim(ext.name))
    return contribution


class Builder:
    """The term constructors an op's derivative in the registry (ir/ops.py) builds its adjoints with."""
    ZERO, ONE = ZERO, ONE
    times, over, minus, plus, keep_if = staticmethod(times), staticmethod(over), staticmethod(minus), \
        staticmethod(plus), staticmethod(keep_if)
    const, un, bin, where = staticmethod(ir.const), staticmethod(ir.un), staticmethod(ir.bin), staticmethod(ir.where)


def unary_adjoint(fn: str, a: Term, t: Term, A: Term) -> Term:
    """The adjoint of the operand of un(fn, a) = t, given t's adjoint A (the registry's derivative of fn)."""
    return ops.UN[fn].derivative(Builder, a, t, A)


def binary_adjoints(fn: str, a: Term, b: Term, t: Term, A: Term) -> tuple[Term, Term]:
    """The adjoints of the operands of bin(fn, a, b) = t, given t's adjoint A."""
    return ops.BIN[fn].derivative(Builder, a, b, t, A)


def local_adjoints(t: Term, A: Term) -> list[tuple[Term, Term]]:
    """(child, contribution) for each argument of t through which a gradient flows, given t's adjoint A."""
    op, args = t.op, t.args
    if op in ("un", "bin"):
        fn = ops.OPS[op][t.attrs[0]]
        if fn.flat:
            return []
        if fn.derivative is None:
            where = f"{t.origin}: " if t.origin else ""
            raise SpecError(f"{where}{fn.name} has no derivative in the op registry (ir/ops.py): declare its "
                            f"`derivative`, or `flat=True` if it is piecewise constant")
        if op == "un":
            return [(args[0], unary_adjoint(fn.name, args[0], t, A))]
        return list(zip(args, binary_adjoints(fn.name, args[0], args[1], t, A)))
    if op == "where":
        return [(args[1], keep_if(args[0], A)), (args[2], ZERO if A == ZERO else ir.where(args[0], ZERO, A))]
    if op == "cast":
        return [(args[0], A)]
    if op == "red" and t.attrs[0] == "sum":
        return [(args[0], A)]
    if op == "red":   # max / min: the subgradient, split evenly among the elements equal to the result (as
        # torch.amax splits it): each tied element taking all of it made a gradient that sums to the tie count
        hit = ir.bin("eq", args[0], t)
        ties = ir.red("sum", t.attrs[1], ir.where(hit, ONE, ZERO))
        return [(args[0], keep_if(hit, over(A, ties)))]
    return []


# ---- shift invariance, proved -----------------------------------------------------------------------------------
_COPIES = 2   # a reduction is written out over this many symbolic elements


def shift_invariant(T: Term, r: Term) -> bool:
    """Is T unchanged when r is replaced by r + c for every c (so T's derivative in r is 0)? Proved by sympy on
    T written out: each reduction over an axis becomes the reduction of _COPIES symbolic elements, every
    sub-term that does not depend on r is an opaque symbol (one per copy of the axes it varies along), and a
    test of equality on a value that depends on r (`m == -inf`, `l == 0`) takes its generic branch (the other
    is a set of measure zero, where the derivative is taken as 0). Any other test on r: not proved."""
    try:
        base = _sym(T, r, sp.Integer(0), {}, {})
        shift = sp.Symbol("shift", real=True)
        moved = _sym(T, r, shift, {}, {})
    except _Unproved:
        return False
    return proof.is_zero(moved - base)


class _Unproved(Exception):
    pass


def _sym(t: Term, r: Term, shift, env: dict[str, int], names: dict) -> sp.Expr:
    if t == r:
        return sp.Symbol("M", real=True) + shift
    if r not in ir.walk(t):   # opaque: one symbol per copy of the reduced axes it varies along
        key = (t, tuple(sorted((a, env[a]) for a in t.free if a in env)))
        if key not in names:
            names[key] = sp.Symbol(f"x{len(names)}", real=True)
        return names[key]
    op, at, ar = t.op, t.attrs, t.args
    if op == "red":
        copies = [_sym(ar[0], r, shift, {**env, at[1]: k}, names) for k in range(_COPIES)]
        return proof.REDUCER_OPS[at[0]](*copies) if at[0] != "sum" else sp.Add(*copies)
    if op == "cast":
        return _sym(ar[0], r, shift, env, names)
    if op == "where":
        c = ar[0]
        if r in ir.walk(c):
            if c.op == "bin" and c.attrs[0] in ("eq", "ne"):
                generic = ar[2] if c.attrs[0] == "eq" else ar[1]
                return _sym(generic, r, shift, env, names)
            raise _Unproved
        # a test that does not depend on r: invariant if both branches are (proved separately by the caller's
        # difference, which holds for each value of the opaque test)
        flag = sp.Symbol(f"c{len(names)}")
        names[(c, len(names))] = flag
        return sp.Piecewise((_sym(ar[1], r, shift, env, names), flag), (_sym(ar[2], r, shift, env, names), True))
    if op == "un" and at[0] in proof.SymOps.UN:
        return proof.SymOps.UN[at[0]](_sym(ar[0], r, shift, env, names))
    if op == "bin" and at[0] in proof.SymOps.BIN:
        return proof.SymOps.BIN[at[0]](*(_sym(a, r, shift, env, names) for a in ar))
    raise _Unproved
