"""Index predicates (where(i >= j, s, -inf) and the like) turned into loop bounds.

A predicate that is a conjunction of linear comparisons in the row axis i and the loop axis j gives, for a
tile of rows [i_lo, i_hi], the key range where it may hold for some row (blocks outside are skipped) and the
range where it holds for every row (blocks inside need no test). Skipping is only done when every reduction
of the pass provably gets its identity from a masked element (checked by evaluating the body on
representative values with the predicate false).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term

INDEX_OPS = ("axis", "dim", "const")


def is_index_predicate(c: Term, loop: str) -> bool:
    """A condition computed from indices, sizes and inputs read at such indices (a document id per position),
    never from a reduction, that varies along the loop axis."""
    if loop not in c.free:
        return False
    return all(t.op in INDEX_OPS + ("load", "bin", "un", "where", "cast") for t in ir.walk(c))


def mask_wheres(term: Term, loop: str) -> list[Term]:
    """The wheres that mask: an index predicate choosing between a value and a constant (a condition that reads
    inputs, such as a test of a partial result, masks only when it falls back to a constant)."""
    def masking(t: Term) -> bool:
        reads = any(x.op == "load" for x in ir.walk(t.args[0]))
        return is_index_predicate(t.args[0], loop) and (not reads or t.args[2].op == "const")
    return [t for t in ir.walk(term) if t.op == "where" and masking(t)]


def linear(t: Term) -> dict | None:
    """Integer linear form {symbol or None (constant): coefficient}, symbols being axes and dims."""
    if t.op in ("axis", "dim"):
        return {(t.op, t.attrs[0]): 1}
    if t.op == "bin" and t.attrs[0] == "floordiv" and t.args[0].op == "axis" and t.args[1].op == "const" \
            and t.args[1].attrs[0] >= 1 and t.args[1].attrs[0] == int(t.args[1].attrs[0]):
        # rising with the axis: a whole divisor of at least 1 (i // 2.5 and i // -1 are no such form)
        return {("div", t.args[0].attrs[0], int(t.args[1].attrs[0])): 1}
    if t.op == "const":
        v = t.attrs[0]
        return {None: int(v)} if math.isfinite(v) and v == int(v) else None
    if t.op == "un" and t.attrs[0] == "neg":
        a = linear(t.args[0])
        return None if a is None else {k: -c for k, c in a.items()}
    if t.op == "bin" and t.attrs[0] in ("add", "sub"):
        a, b = linear(t.args[0]), linear(t.args[1])
        if a is None or b is None:
            return None
        sign = 1 if t.attrs[0] == "add" else -1
        out = dict(a)
        for k, c in b.items():
            out[k] = out.get(k, 0) + sign * c
        return out
    if t.op == "bin" and t.attrs[0] == "mul":
        a, b = linear(t.args[0]), linear(t.args[1])
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if set(y) <= {None}:
                return {k: c * y.get(None, 0) for k, c in x.items()}
    return None


def constraints(pred: Term) -> list[dict] | None:
    """The predicate as linear forms that must be >= 0, or None if it is not such a conjunction."""
    if pred.op == "bin" and pred.attrs[0] == "and":
        a, b = constraints(pred.args[0]), constraints(pred.args[1])
        return None if a is None or b is None else a + b
    if pred.op != "bin" or pred.attrs[0] not in ("ge", "gt", "le", "lt"):
        return None
    a, b = linear(pred.args[0]), linear(pred.args[1])
    if a is None or b is None:
        return None
    d = dict(a)
    for k, c in b.items():
        d[k] = d.get(k, 0) - c
    op = pred.attrs[0]
    if op in ("le", "lt"):
        d = {k: -c for k, c in d.items()}
    if op in ("gt", "lt"):
        d[None] = d.get(None, 0) - 1
    return [d]


@dataclass
class Bounds:
    """Scalar code for the key range of a row tile: [lo_any, hi_any) may hold, [lo_all, hi_all) always holds."""
    lo_any: str
    hi_any: str
    lo_all: str
    hi_all: str
    work_grows: bool = False   # later row tiles see more keys (schedule them first)


def key_bounds(pred: Term, row: str, loop: str, name, i_lo: str, i_hi: str, n: str, lang: str = "tl"
               ) -> Bounds | None:
    """Bounds of the loop axis from a predicate; `name(symbol)` gives the code of an axis or dim symbol, `lang`
    the language module the code calls (tl, or Gluon's gl)."""
    cons = constraints(pred)
    if cons is None:
        return None
    lows_any, lows_all, highs_any, highs_all = ["0"], ["0"], [n], [n]
    interior_possible = True
    upper_grows = lower_grows = False
    for c in cons:
        if any(abs(v) >= 2**30 for v in c.values()):   # (i - j < sys.maxsize): no bound int32 code can hold;
            interior_possible = False                  # the mask's own test keeps the keys it keeps
            continue
        # the row enters as the row index itself or as row // G (rows packed from several heads)
        row_keys = [k for k in c if k == ("axis", row) or (k and k[0] == "div" and k[1] == row)]
        if len(row_keys) > 1 or any(k and k[0] == "div" and k[1] == loop for k in c):
            return None
        key = row_keys[0] if row_keys else ("axis", row)
        a = c.get(key, 0)
        b = c.get(("axis", loop), 0)
        if any(k and k[0] == "div" for k in c if k != key):
            return None
        rest_terms = [f"{v} * {name(k)}" for k, v in c.items() if k not in (None, key, ("axis", loop))]
        rest = " + ".join(rest_terms + [str(c.get(None, 0))])
        if b == 0 or abs(b) != 1:
            interior_possible = False
            continue

        def at(i: str, a=a, key=key, rest=rest) -> str:
            return f"({a} * ({i} // {key[2]}) + {rest})" if key[0] == "div" else f"({a} * {i} + {rest})"
        upper_grows |= b == -1 and a > 0
        lower_grows |= b == 1 and a < 0
        if b == 1:   # j >= -(a*i + rest)
            lo_first, lo_last = f"-{at(i_lo)}", f"-{at(i_hi)}"
            any_, all_ = (lo_last, lo_first) if a > 0 else (lo_first, lo_last)
            lows_any.append(any_)
            lows_all.append(all_)
        else:        # j <= a*i + rest, so j < a*i + rest + 1
            hi_first, hi_last = f"({at(i_lo)} + 1)", f"({at(i_hi)} + 1)"
            any_, all_ = (hi_last, hi_first) if a > 0 else (hi_first, hi_last)
            highs_any.append(any_)
            highs_all.append(all_)
    if not interior_possible:
        lows_all, highs_all = [n], ["0"]

    def fold(fn: str, xs: list[str]) -> str:
        out = xs[0]
        for x in xs[1:]:
            out = f"{lang}.{fn}({out}, {x})"
        return out
    return Bounds(fold("maximum", lows_any), fold("minimum", highs_any), fold("maximum", lows_all),
                  fold("minimum", highs_all), upper_grows and not lower_grows)


# ---- is skipping a masked element sound? -------------------------------------------------------------------
FINITE = [-2.5, -0.3, 0.0, 0.3, 2.5]
REDUCED = [-math.inf, -2.5, -0.3, 0.0, 0.3, 2.5]


@functools.lru_cache(maxsize=None)
def _numpy():
    """numpy and the ops' numpy forms, imported when a mask is first checked (a compile without one skips the
    import, a sixth of a second)."""
    import numpy
    return numpy, ops.forms("un", "numpy", numpy), ops.forms("bin", "numpy", numpy)


def _index_condition(t: Term) -> bool:
    """A comparison or logic of indices only (no loaded or reduced values)."""
    if not ((t.op == "bin" and t.attrs[0] in ir.COMPARE + ir.LOGIC) or (t.op == "un" and t.attrs[0] == "not")):
        return False
    return all(x.op in INDEX_OPS or x.op in ("bin", "un") for x in ir.walk(t))


def masked_gives_identity(body: Term, reducer: str, masked: list[Term], loop: str, max_leaves: int = 6) -> bool:
    """With every where in `masked` taking its else branch, does body equal the reducer's identity for all
    values of the other leaves (loads, reductions, indices)?"""
    out = _over_leaves(ir.substitute(body, {w: w.args[2] for w in masked}), max_leaves)
    np = _numpy()[0]
    return out is not None and bool(np.all(out == ir.REDUCERS[reducer]))


def _over_leaves(body: Term, max_leaves: int):
    """body in numpy over a grid of values of each of its leaves (None past max_leaves leaves): loads finite, an
    index condition true and false, a reduction also -inf (an empty row's max) unless it is a sum of a body
    finite wherever its leaves are (a sum of dO V, not of a masked score)."""
    leaves: list[Term] = []

    def find(t: Term) -> None:
        # an index condition other than the skipped mask (e.g. i >= 12) may be true or false: a boolean leaf
        # taking both values, not a function of a few sampled indices (which could all make it false)
        if t.op in ("load", "axis", "dim", "acc") or ir.is_reduction(t) or t.op == "prev" or _index_condition(t):
            if t not in leaves:
                leaves.append(t)
            return
        for a in t.args:
            find(a)

    find(body)
    if len(leaves) > max_leaves:
        return None
    np = _numpy()[0]
    grids = []
    for leaf in leaves:
        if _index_condition(leaf):
            grids.append([0.0, 1.0])
        elif leaf.op in ("axis", "dim"):
            grids.append([0.0, 1.0, 5.0])
        elif leaf.op == "red" and leaf.attrs[0] == "sum":
            inner = _over_leaves(leaf.args[0], max_leaves)
            grids.append(FINITE if inner is not None and np.all(np.isfinite(inner)) else REDUCED)
        elif ir.is_reduction(leaf) or leaf.op in ("prev", "acc"):
            grids.append(REDUCED)
        else:
            grids.append(FINITE)
    values = {leaf: np.array(g).reshape([-1 if k == n else 1 for k in range(len(leaves))])
              for n, (leaf, g) in enumerate(zip(leaves, grids))}
    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate(body, lambda x, ev: values.get(x)), [len(g) for g in grids] or [1])


def evaluate(t: Term, leaf):
    """t in numpy float64. `leaf(x, ev)` gives the value of a subterm x it knows (evaluating x's parts with ev),
    None for the others: constants, casts (the identity here) and the scalar operations are computed."""
    np, un, bin_ = _numpy()

    def ev(x: Term):
        v = leaf(x, ev)
        if v is not None:
            return v
        if x.op == "const":
            return np.float64(x.attrs[0])
        if x.op == "cast":
            return ev(x.args[0])
        if x.op == "un":
            return un[x.attrs[0]](ev(x.args[0]))
        if x.op == "bin":
            return bin_[x.attrs[0]](ev(x.args[0]), ev(x.args[1]))
        if x.op == "where":
            return np.where(ev(x.args[0]), ev(x.args[1]), ev(x.args[2]))
        raise ValueError(x.op)
    return ev(t)


def skippable(reductions: list[Term], masked: list[Term], loop: str) -> bool:
    return bool(masked) and all(masked_gives_identity(r.args[0], r.attrs[0], masked, loop) for r in reductions)

