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


# ---- tests of a value's class and their replacements (NaN, infinities, the sign bit) ---------------------------
def _isnan(a):
    return _scalar(a) != a   # true of NaN alone (the rules never fold x != x: it holds there)


def _isinf(a, sign: int = 0):
    a = _scalar(a)
    if sign > 0:
        return a == S.inf
    if sign < 0:
        return a == -S.inf
    return S.abs(a) == S.inf


def _nan_to_num(a, largest: float, nan=None, posinf=None, neginf=None):
    """NaN to `nan` (0), +inf to `posinf` and -inf to `neginf` (by default the largest and the least finite
    value of the input's dtype, `largest`)."""
    a = _scalar(a)
    a = S.where(a == S.inf, largest if posinf is None else posinf, a)
    a = S.where(a == -S.inf, -largest if neginf is None else neginf, a)
    return S.where(_isnan(a), 0.0 if nan is None else nan, a)


def _signbit(a):
    """The sign bit: below zero, or a zero whose reciprocal is -inf (-0.0)."""
    a = _scalar(a)
    return (a < 0.0) | ((a == 0.0) & (1.0 / a < 0.0))


def _copysign(a, b):
    return S.where(_signbit(b), -S.abs(a), S.abs(a))


def _heaviside(a, at_zero):
    a = _scalar(a)
    return S.where(_isnan(a), a, S.where(a == 0.0, at_zero, S.where(a > 0.0, 1.0, 0.0)))


# ---- compositions of the registry's ops ---------------------------------------------------------------------
def _logaddexp(a, b, base_two: bool = False):
    """log(e^a + e^b) as the larger plus softplus of minus the distance; a + log 2 where they are equal (both
    infinite included, which the difference would make NaN)."""
    a, b = _scalar(a), _scalar(b)
    if base_two:   # log2(2^a + 2^b) = logaddexp(a ln 2, b ln 2) / ln 2
        return _logaddexp(a * math.log(2.0), b * math.log(2.0)) / math.log(2.0)
    return S.where(a == b, a + math.log(2.0), _max(a, b) + S.softplus(-S.abs(a - b)))


def _log_sigmoid(a):
    return -S.softplus(-_scalar(a)), None   # aten's forward returns (value, buffer)


def _lerp(a, b, weight):
    """torch.lerp's two forms: from the start below a weight of 1/2, from the end above (exact at both ends)."""
    a, b = _scalar(a), _scalar(b)
    if _is_number(weight):
        return a + (b - a) * weight if abs(weight) < 0.5 else b - (b - a) * (1.0 - weight)
    weight = _scalar(weight)
    return S.where(S.abs(weight) < 0.5, a + (b - a) * weight, b - (b - a) * (1.0 - weight))


def _hardtanh(a, lo=-1.0, hi=1.0):
    return _clamp(a, lo, hi)


def _elu(a, alpha=1.0, scale=1.0, input_scale=1.0):
    a = _scalar(a)
    return scale * S.where(a > 0.0, a, alpha * (S.exp(a * input_scale) - 1.0))


def _leaky_relu(a, slope=0.01):
    a = _scalar(a)
    return S.where(a > 0.0, a, a * slope)


def _hardsigmoid(a):
    return _clamp(_scalar(a) / 6.0 + 0.5, 0.0, 1.0)


def _mish(a):
    return _scalar(a) * S.tanh(S.softplus(a))


def _xlogy(a, b):
    """a log b, 0 where a is 0 (but NaN where b is)."""
    a, b = _scalar(a), _scalar(b)
    return S.where(_isnan(b), b, S.where(a == 0.0, 0.0, a * S.log(b)))


def _sinh(a):
    return (S.exp(a) - S.exp(-_scalar(a))) * 0.5


def _cosh(a):
    return (S.exp(a) + S.exp(-_scalar(a))) * 0.5
