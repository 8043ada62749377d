"""The ATen operators that are arithmetic on one or two values, as spec expressions (aten_trace.py's table
takes them): min, max and clamp, divisions and remainders, powers, signs and the smooth activations."""
from __future__ import annotations

import math

from neptune_eqsat import ir
from neptune_eqsat.frontend import spec as S


def _scalar(x):
    return S._wrap(x) if isinstance(x, (int, float, bool, S.Expr)) else x


def _max(a, b):   # elementwise (spec's max(j, x) with an axis first is a reduction)
    return _scalar(a)._bin("max", b)


def _min(a, b):
    return _scalar(a)._bin("min", b)


def _clamp(x, lo=None, hi=None):
    x = _scalar(x)
    if lo is not None:
        x = _max(x, lo)
    if hi is not None:
        x = _min(x, hi)
    return x


def _div(a, b, rounding_mode=None):
    if rounding_mode == "floor":
        return _scalar(a) // b
    if rounding_mode == "trunc":
        return _unary("trunc", _scalar(a) / b)
    return _scalar(a) / b


def _fmod(a, b):   # C's remainder: the sign of the dividend
    return _scalar(a) - _unary("trunc", _scalar(a) / b) * b


def _unary(fn: str, x):
    return S.Expr(ir.un(fn, S._wrap(x).term))


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _pow(a, k):
    """torch.pow: an integral exponent as products (1 / a^-k below zero), 0.5 as sqrt; otherwise exp(k log a)
    for a positive base, a negative base with an integral exponent signed by its parity, NaN else (as torch)."""
    if _is_number(k) and (k == 0.5 or k == int(k) and abs(k) <= 64):   # the spec's own powers
        return _scalar(a) ** (0.5 if k == 0.5 else int(k))
    k = _scalar(k)
    if _is_number(a):   # a number to a traced power (an ALiBi slope 2 ** (-8 h / H))
        if a > 0:
            return S.exp(k * math.log(a))
        a = S._wrap(float(a))
    magnitude = S.exp(S.log(S.abs(a)) * k)
    odd = S.where(k - 2.0 * S.floor(k * 0.5) == 1.0, -1.0, 1.0)
    zero = S.where(k == 0.0, 1.0, S.where(k > 0.0, 0.0, S.inf))
    negative = S.where(S.floor(k) == k, odd * magnitude, S.nan)
    return S.where(_scalar(a) > 0.0, magnitude, S.where(_scalar(a) == 0.0, zero, negative))


def _exp2(a):
    return _unary("exp2", a)


def _sign(a):
    a = _scalar(a)
    return S.where(a > 0, 1.0, S.where(a < 0, -1.0, 0.0))


def _softplus(a, beta=1.0, threshold=20.0):
    """torch's softplus: log(1 + exp(beta a)) / beta, the input itself where beta a passes the threshold."""
    scaled = _scalar(a) * beta
    smooth = S.softplus(scaled)
    return S.where(scaled > threshold, a, smooth if beta == 1 else smooth / beta)


def _gelu(a, approximate="none"):
    a = _scalar(a)
    if approximate == "tanh":
        return 0.5 * a * (1.0 + S.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a * a * a)))
    return 0.5 * a * (1.0 + S.erf(a / math.sqrt(2.0)))
