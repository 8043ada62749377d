"""Truth values, logic and dtype conversions of traced aten operations: how torch reads a number as a truth value
(nonzero), converts between dtypes (truncating, wrapping, rounding) and selects between truth values, in spec
values."""
from __future__ import annotations

import torch

from neptune_eqsat.frontend import spec as S
from neptune_eqsat.frontend.aten_math import _is_number, _pow, _scalar, _unary


def _dtype(node) -> torch.dtype | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return getattr(val, "dtype", None)


def _is_float(dtype) -> bool:
    return dtype is not None and dtype.is_floating_point


def _logic(name: str, a, b):
    """a and / or / xor b, with a Python bool on either side folded away (3 > 2 is True before tracing)."""
    for x, y in ((a, b), (b, a)):
        if isinstance(x, bool):
            if name == "and":
                return y if x else False
            if name == "or":
                return True if x else y
            return ~_scalar(y) if x else y
    return {"and": lambda: _scalar(a) & b, "or": lambda: _scalar(a) | b, "xor": lambda: _scalar(a) != b}[name]()


def _not(a):
    return (not a) if isinstance(a, bool) else ~_scalar(a)


def _truth_value(v, node_arg):
    """An operand of a logical op as a truth value: a boolean as it is, a number as v != 0 (logical_xor(i % 3,
    j % 2) tests the remainders' truth, not their values)."""
    if isinstance(v, bool) or (hasattr(node_arg, "meta") and _dtype(node_arg) == torch.bool):
        return v
    return _scalar(v) != 0


def _logical(name: str):
    def translate(node, *values):
        truths = [_truth_value(v, a) for v, a in zip(values, node.args)]
        return _not(truths[0]) if name == "not" else _logic(name, *truths)
    return translate


def _compared(fn):
    """A comparison, a Python truth value on either side read as the number 1 or 0 ((i >= j) == True)."""
    return lambda a, b: fn(_scalar(_truth(a)), _truth(b))


def _pow_node(node, a, k):
    """torch.pow; an integer raised to a traced power is an integer (3 ** (h + 1) as 27, not exp(k ln 3))."""
    out = _pow(a, k)
    target = _dtype(node)
    if isinstance(out, S.Expr) and target is not None and not target.is_floating_point and not _is_number(k):
        return S.where(out >= 0, S.floor(out + 0.5), -S.floor(0.5 - out))
    return out


def _where(c, a, b):
    if isinstance(c, bool):
        return a if c else b
    if isinstance(a, bool) and isinstance(b, bool):   # where(c, True, False): a truth value
        return c if a and not b else _not(c) if b and not a else a
    return S.where(c, _truth(a), _truth(b))   # a truth value beside a number as 1 or 0


def _to(node, x, *args, **kwargs):
    """A dtype conversion as torch converts: to bool a number's truth, float to integer truncates, to a narrow
    integer wraps, to 16 bits rounds; the rest keep the value."""
    source = _dtype(node.args[0]) if node.args and hasattr(node.args[0], "meta") else None
    target = _dtype(node)
    if target == torch.bool and source != torch.bool:   # a number's truth: nonzero (0.5 is True)
        return x != 0 if isinstance(x, (int, float)) else _scalar(x) != 0
    if target is None:
        return x
    if not target.is_floating_point:   # to an integer
        if _is_float(source):
            x = _unary("trunc", x)   # toward zero, as torch converts
        if target in NARROW_INTEGERS and source != torch.bool and not isinstance(x, bool):   # wraps, as torch's
            low, span = NARROW_INTEGERS[target]
            return (_scalar(x) - low) % span + low
        return x
    if target in (torch.float16, torch.bfloat16):
        if source is not None and not source.is_floating_point:
            # an integer rounded to 16 bits (to bf16 through fp32: Triton's interpreter converts int32 to bf16
            # wrongly)
            return S.cast(x, "f16") if target == torch.float16 else S.cast(_scalar(x) * 1.0, "bf16")
        if _is_float(source) and source.itemsize > target.itemsize:
            return S.cast(x, "f16" if target == torch.float16 else "bf16")   # rounded, as torch rounds
    return x


NARROW_INTEGERS = {torch.uint8: (0, 256), torch.int8: (-128, 256), torch.int16: (-32768, 65536)}


def _truth(x) -> S.Expr:
    """An operand as a spec value: a constant truth value (torch.tensor(True) & mask) as the number 1 or 0, which
    the logic reads as true where nonzero."""
    return S._wrap(float(x) if isinstance(x, bool) else x)

