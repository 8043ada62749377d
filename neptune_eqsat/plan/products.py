"""Sums of products in the backward's specs written as matrix products (autodiff.py): the form whose operands
meet on the tensor cores in 16 bits, accumulating in fp32."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.ir import Term

SIXTEEN = ("f16", "bf16")


def products(t: Term, dtypes: dict[str, str]) -> Term:
    """Sums of products written as matrix products: factors that do not vary along the summed axis move out
    (sum_e (dO / L) * V = (sum_e dO * V) / L; constants likewise), and where one of the two operands left is a
    16-bit tensor the other is rounded to its dtype, as the forward rounds its probabilities before P V: the
    adjoint's dS and P / L meet dO, K and Q on the tensor cores in 16 bits, accumulating in fp32."""
    return ir.bottom_up(t, lambda y: _as_product(y, dtypes) if y.op == "red" and y.attrs[0] == "sum" else y)


def _as_product(r: Term, dtypes: dict[str, str]) -> Term:
    ax = r.attrs[1]
    num, den = _factors(r.args[0])
    inner = [f for f in num if ax in f.free]
    if len(inner) < 2:
        return r
    outer = [f for f in num if ax not in f.free]
    inner_den = [f for f in den if ax in f.free]
    outer_den = [f for f in den if ax not in f.free]
    wide = next((f for f in inner if _sixteen(f, dtypes)), None)
    at = inner.index(wide) if wide is not None else 0
    first, rest = inner[at], inner[:at] + inner[at + 1:]   # x * x: the same term twice
    second = _product(rest)
    for d in inner_den:
        second = ir.bin("div", second, d)
    dtype = _sixteen(first, dtypes)
    if dtype and _sixteen(second, dtypes) != dtype:
        second = _rounded(second, dtype, dtypes)
    out = Term("red", r.attrs, (ir.bin("mul", first, second),), r.origin)
    for f in outer:
        out = ir.bin("mul", out, f)
    for d in outer_den:
        out = ir.bin("div", out, d)
    return out


def _rounded(t: Term, dtype: str, dtypes: dict[str, str]) -> Term:
    """t rounded to `dtype` factor by factor: a cast of a product is the same value, but the algebra rules may
    move such a cast onto one factor (cast(a * b) = cast(a) * b), which leaves an fp32 operand. A mask's select
    of a zero rounds its value alone (where(p, a, 0) rounds to where(p, cast(a), 0) exactly), so a masked
    product's factors are rounded too: a probability factor is then the 16-bit tile the other product reads,
    not an fp32 one held beside it."""
    if t.op == "bin" and t.attrs[0] == "mul":
        return ir.bin("mul", _rounded(t.args[0], dtype, dtypes), _rounded(t.args[1], dtype, dtypes))
    if t.op == "where" and t.args[2] == ir.const(0.0):
        return ir.where(t.args[0], _rounded(t.args[1], dtype, dtypes), t.args[2])
    return t if _sixteen(t, dtypes) == dtype else ir.cast(dtype, t)


def _factors(t: Term) -> tuple[list[Term], list[Term]]:
    """t as a product of numerator factors over denominator factors."""
    if t.op == "bin" and t.attrs[0] == "mul":
        (n1, d1), (n2, d2) = _factors(t.args[0]), _factors(t.args[1])
        return n1 + n2, d1 + d2
    if t.op == "bin" and t.attrs[0] == "div":
        (n1, d1), (n2, d2) = _factors(t.args[0]), _factors(t.args[1])
        return n1 + d2, d1 + n2
    if t.op == "un" and t.attrs[0] == "neg":
        n, d = _factors(t.args[0])
        return [ir.const(-1.0)] + n, d
    return [t], []


def _product(fs: list[Term]) -> Term:
    out = fs[0]
    for f in fs[1:]:
        out = ir.bin("mul", out, f)
    return out


def _sixteen(t: Term, dtypes: dict[str, str]) -> str | None:
    """The 16-bit dtype of a tensor read or a cast, else None."""
    if t.op == "load" and dtypes.get(t.attrs[0]) in SIXTEEN:
        return dtypes[t.attrs[0]]
    if t.op == "cast" and t.attrs[0] in SIXTEEN:
        return t.attrs[0]
    return None
