"""Conditions on indices (masks) in the one form the compiler reads: comparisons and logic of index arithmetic,
a negated comparison flipped rather than wrapped in `not`."""
from __future__ import annotations

import math

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.ir import ops

_FLIPPED = {name: op.negation for name, op in ops.BIN.items() if op.negation}
_INDEX_ARITHMETIC = ("add", "sub", "mul") + ir.INTEGER


def _is_index(t: Term) -> bool:
    """Integer arithmetic of axes, dims and constants (no loaded value, so no NaN)."""
    return all(x.op in ("axis", "dim", "const") or (x.op == "bin" and x.attrs[0] in _INDEX_ARITHMETIC)
               or (x.op == "un" and x.attrs[0] == "neg") for x in ir.walk(t))


def negate(c: Term) -> Term:
    """not c; a comparison of indices flips instead (never NaN, so not(a > b) is a <= b), which keeps it a
    linear bound that loops can be clipped to."""
    if c.op == "bin" and c.attrs[0] in _FLIPPED and all(_is_index(x) for x in c.args):
        return Term("bin", (_FLIPPED[c.attrs[0]],), c.args, c.origin)
    if c.op == "un" and c.attrs[0] == "not":
        return c.args[0]
    return Term("un", ("not",), (c,), c.origin)


def is_index_condition(c: Term) -> bool:
    """A condition on indices only (a mask), built from comparisons and logic of index arithmetic."""
    return all(_is_index(x) or (x.op == "bin" and x.attrs[0] in ir.COMPARE + ir.LOGIC)
               or (x.op == "un" and x.attrs[0] == "not") for x in ir.walk(c))


def index_max(axes: dict, t: Term) -> int | None:
    """Largest value of a non-negative index expression over constant-extent axes, if known."""
    if t.op == "axis":
        ext = axes[t.attrs[0]]
        return ext - 1 if isinstance(ext, int) else None
    if t.op == "const":
        return int(t.attrs[0]) if math.isfinite(t.attrs[0]) else None
    if t.op == "bin" and t.attrs[0] in ("add", "mul", "floordiv"):
        a, b = (index_max(axes, x) for x in t.args)
        if a is None or b is None:
            return None
        return {"add": a + b, "mul": a * b, "floordiv": a // max(b, 1)}[t.attrs[0]]
    return None
