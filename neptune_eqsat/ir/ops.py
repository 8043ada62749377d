"""Every scalar operation of the IR (the fn of a `un` or `bin` term), declared once.

Each evaluator and emitter reads its form from here: sympy (proofs), Python floats (numeric rule checks,
constant folding of specs), torch (the float64 reference), numpy (the check that skipping a masked block is
sound), the Triton and Gluon lowerings, and the work the cost models charge. An op added here is added to
all of them; tests/test_ops.py checks the forms agree.

This module imports nothing from the package (term.py builds its tuples of op names from it) and no numeric
library at import: a form takes its library as first argument (`sp`, `torch`, `np`), and `forms(kind,
library)` binds it, so importing the spec language never imports torch.

Not read from here: codegen/intervals.py, whose tables are copied as text into generated modules, and the
ATen translation of aten_trace.py (it maps ATen's names, several to compositions of these ops).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

NO_GLUON = "no Gluon lowering"
LN2 = math.log(2.0)   # the `gluon` of an op a warp-specialized Gluon kernel cannot emit


@dataclass(frozen=True)
class Op:
    name: str
    kind: str                       # "un" (one operand) or "bin" (two)
    sympy: Callable                 # (sympy, *operands): its meaning over the reals, where every value is finite
    python: Callable                # (*floats)
    torch: Callable                 # (torch, *float64 tensors)
    numpy: Callable                 # (numpy, *float64 arrays)
    triton: str                     # expression template, operands as {0}, {1} (or {} in order)
    gluon: str | None = None        # template where Gluon differs from the Triton one in gl (codegen/values.py)
    work: float = 1.0               # relative cost per element, for extraction (extract.py)
    transcendental: bool = False    # runs on the special-function unit (cost.py)
    group: str = "unary"            # bin: "arith", "compare", "logic" or "integer"
    bitwise: bool = False           # operands are taken to integers first (ids stored as floats)
    keeps_integer: bool = False     # un: an integer operand gives an integer
    keeps_nonnegative: bool = False   # bin: nonnegative operands give a nonnegative result (index arithmetic)
    infix: str | None = None        # how ir.show writes it between its operands
    negation: str | None = None     # compare: the comparison that is its negation (never NaN on indices)
    # the adjoint of each operand given the op's value t and its adjoint A: un (d, a, t, A) -> adjoint of a, bin
    # (d, a, b, t, A) -> (adjoint of a, adjoint of b); `d` builds terms (plan/derivatives.py: d.times, d.over,
    # d.minus, d.keep_if, d.const, d.un, d.bin, d.where, d.ZERO, d.ONE). None: no gradient flows (an integer,
    # a truth value or a piecewise constant, as in torch)
    derivative: Callable | None = None
    flat: bool = False              # piecewise constant (rounding, comparisons, integer ops): no gradient flows
    aten: tuple[str, ...] = ()      # ATen operators that are exactly this op (the FlexAttention tracer maps them)

    @property
    def arity(self) -> int:
        return 1 if self.kind == "un" else 2


def _finite_or_zero(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _or_zero(f: Callable, x: float) -> float:
    try:
        return _finite_or_zero(f(x))
    except OverflowError:   # math.exp and ** raise where the value is inf
        return 0.0


def _indicator(sp, condition):
    """A condition as the number the evaluators give it: 1 where it holds, else 0."""
    return sp.Piecewise((1, condition), (0, True))


def _sympy_round(sp, a):
    """Half to even, as the Triton form: floor(a + 1/2), less one where a + 1/2 is an odd integer."""
    up = sp.floor(a + sp.Rational(1, 2))
    return sp.Piecewise((up - 1, sp.And(sp.Eq(up, a + sp.Rational(1, 2)), sp.Eq(sp.Mod(up, 2), 1))), (up, True))


@lru_cache(maxsize=None)
def _sympy_integer_function(sp, name: str, fn: Callable):
    """A sympy function of two integers that sympy has no symbol for (bit operations): it evaluates on
    integer arguments and stays unevaluated otherwise."""
    def evaluate(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sp.Integer(fn(int(a), int(b)))
        return None
    return type(name, (sp.Function,), {"eval": classmethod(evaluate)})


def _np_integers(np, fn: str, a, b):
    return getattr(np, fn)(np.int64(a), np.int64(b)).astype(np.float64)


def _torch_integers(torch, fn: str, a, b):
    """A bit operation of values held as float64 (every value of the reference is)."""
    return getattr(torch, fn)(a.long(), b.long()).to(torch.float64)


def _where_finite(lib, x, zero):
    """x where it is finite, else zero, in torch or numpy (the same names in both)."""
    return lib.where(lib.isfinite(x), x, zero)


_UNARY = [
    Op("neg", "un", lambda sp, a: -a, lambda a: -a, lambda torch, x: torch.neg(x), lambda np, x: np.negative(x),
       "-({})", keeps_integer=True,
       derivative=lambda d, a, t, A: d.minus(A)),
    Op("exp", "un", lambda sp, a: sp.exp(a), math.exp, lambda torch, x: torch.exp(x), lambda np, x: np.exp(x),
       "tl.exp({})", work=8.0, transcendental=True, aten=("exp",),
       derivative=lambda d, a, t, A: d.times(A, t)),
    Op("log", "un", lambda sp, a: sp.log(a), math.log, lambda torch, x: torch.log(x), lambda np, x: np.log(x),
       "tl.log({})", work=4.0, transcendental=True, aten=("log",),
       # 0 where a is: the log of an empty row's sum (-inf, a logsumexp every element of which is masked) passes
       # back no gradient, as torch's logsumexp passes none, rather than A / 0 (NaN once a mask multiplies it)
       derivative=lambda d, a, t, A: d.where(d.bin("eq", a, d.ZERO), d.ZERO, d.over(A, a))),
    Op("tanh", "un", lambda sp, a: sp.tanh(a), math.tanh, lambda torch, x: torch.tanh(x), lambda np, x: np.tanh(x),
       "(2.0 * tl.sigmoid(2.0 * {}) - 1.0)",
       # Gluon has no sigmoid: tanh(x) = 2 / (1 + 2^(-2x log2 e)) - 1
       gluon="(2.0 / (1.0 + gl.exp2(-2.8853900817779268 * {})) - 1.0)", work=6.0, transcendental=True,
       aten=("tanh",),
       derivative=lambda d, a, t, A: d.times(A, d.bin("sub", d.ONE, d.times(t, t)))),
    Op("sqrt", "un", lambda sp, a: sp.sqrt(a), math.sqrt, lambda torch, x: torch.sqrt(x), lambda np, x: np.sqrt(x),
       "tl.sqrt({})", work=2.0, transcendental=True, aten=("sqrt",),
       derivative=lambda d, a, t, A: d.over(A, d.times(d.const(2.0), t))),
    Op("abs", "un", lambda sp, a: sp.Abs(a), abs, lambda torch, x: torch.abs(x), lambda np, x: np.abs(x),
       "tl.abs({})", keeps_integer=True, aten=("abs",),
       derivative=lambda d, a, t, A: d.where(d.bin("gt", a, d.ZERO), A,
                                             d.where(d.bin("lt", a, d.ZERO), d.minus(A), d.ZERO))),
    Op("recip", "un", lambda sp, a: 1 / a, lambda a: 1 / a, lambda torch, x: torch.reciprocal(x),
       lambda np, x: np.reciprocal(x), "(1.0 / {})", work=2.0, transcendental=True,
       derivative=lambda d, a, t, A: d.minus(d.times(A, d.times(t, t)))),
    # the "_or_zero" ops are 0 where the value would be inf or NaN; over the reals they are the value itself
    Op("finite_or_zero", "un", lambda sp, a: a, _finite_or_zero,
       lambda torch, x: _where_finite(torch, x, torch.zeros_like(x)), lambda np, x: _where_finite(np, x, 0.0),
       "tl.where(tl.abs({0}) < float('inf'), {0}, 0.0)",
       derivative=lambda d, a, t, A: A),
    Op("exp_or_zero", "un", lambda sp, a: sp.exp(a), partial(_or_zero, math.exp),
       lambda torch, x: _where_finite(torch, torch.exp(x), torch.zeros_like(x)),
       lambda np, x: _where_finite(np, np.exp(x), 0.0),
       "tl.where(tl.exp({0}) < float('inf'), tl.exp({0}), 0.0)", work=9.0, transcendental=True,
       derivative=lambda d, a, t, A: d.times(A, t)),
    Op("exp2", "un", lambda sp, a: 2 ** a, lambda a: 2.0 ** a, lambda torch, x: torch.exp2(x),
       lambda np, x: np.exp2(x), "tl.math.exp2({})", work=2.0, transcendental=True,
       derivative=lambda d, a, t, A: d.times(A, d.times(t, d.const(LN2)))),
    Op("exp2_or_zero", "un", lambda sp, a: 2 ** a, partial(_or_zero, partial(pow, 2.0)),
       lambda torch, x: _where_finite(torch, torch.exp2(x), torch.zeros_like(x)),
       lambda np, x: _where_finite(np, np.exp2(x), 0.0),
       "tl.where(tl.math.exp2({0}) < float('inf'), tl.math.exp2({0}), 0.0)", work=3.0, transcendental=True,
       derivative=lambda d, a, t, A: d.times(A, d.times(t, d.const(LN2)))),
    Op("not", "un", lambda sp, a: _indicator(sp, sp.Eq(a, 0)), lambda a: float(a == 0),
       lambda torch, x: torch.logical_not(x), lambda np, x: np.logical_not(x), "({} == 0)", keeps_integer=True,
       flat=True),
    # logistic2(x) = 1 / (1 + 2^x), the logistic function in base 2: 1 at -inf, 0 at +inf
    Op("logistic2", "un", lambda sp, a: 1 / (1 + 2 ** a), lambda a: 1 / (1 + 2.0 ** a) if a < 1024 else 0.0,
       lambda torch, x: torch.sigmoid(-x * math.log(2.0)), lambda np, x: 1.0 / (1.0 + np.exp2(x)),
       "(1.0 / (1.0 + tl.math.exp2({})))",   # 2^x overflows to inf only where the result is 0
       work=3.0, transcendental=True,
       derivative=lambda d, a, t, A: d.times(A, d.times(d.const(-LN2), d.times(t, d.bin("sub", d.ONE, t))))),
    Op("erf", "un", lambda sp, a: sp.erf(a), math.erf, lambda torch, x: torch.erf(x),
       lambda np, x: np.vectorize(math.erf)(x), "tl.erf({})", gluon=NO_GLUON, work=8.0, aten=("erf", "special_erf"),
       derivative=lambda d, a, t, A: d.times(A, d.times(d.const(2.0 / math.sqrt(math.pi)),
                                                        d.un("exp", d.minus(d.times(a, a)))))),
    # periodic (a relative position's phase in a bias): block classification takes their values as unbounded
    Op("sin", "un", lambda sp, a: sp.sin(a), math.sin, lambda torch, x: torch.sin(x), lambda np, x: np.sin(x),
       "tl.sin({})", gluon=NO_GLUON, work=8.0, transcendental=True, aten=("sin",),
       derivative=lambda d, a, t, A: d.times(A, d.un("cos", a))),
    Op("cos", "un", lambda sp, a: sp.cos(a), math.cos, lambda torch, x: torch.cos(x), lambda np, x: np.cos(x),
       "tl.cos({})", gluon=NO_GLUON, work=8.0, transcendental=True, aten=("cos",),
       derivative=lambda d, a, t, A: d.minus(d.times(A, d.un("sin", a)))),
    # softplus(x) = log(1 + e^x), computed as max(x, 0) + log(1 + e^-|x|): no overflow, exact for large |x|
    Op("softplus", "un", lambda sp, a: sp.log(1 + sp.exp(a)), lambda a: max(a, 0.0) + math.log1p(math.exp(-abs(a))),
       lambda torch, x: torch.logaddexp(x, torch.zeros_like(x)), lambda np, x: np.logaddexp(x, 0.0),
       "(tl.maximum({0}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({0}))))", gluon=NO_GLUON, work=10.0,
       transcendental=True, derivative=lambda d, a, t, A: d.times(A, d.bin("sub", d.ONE, d.un("exp", d.minus(t))))),
    Op("floor", "un", lambda sp, a: sp.floor(a), math.floor, lambda torch, x: torch.floor(x),
       lambda np, x: np.floor(x), "tl.floor({})", gluon=NO_GLUON, flat=True),
    Op("ceil", "un", lambda sp, a: sp.ceiling(a), math.ceil, lambda torch, x: torch.ceil(x),
       lambda np, x: np.ceil(x), "tl.ceil({})", gluon=NO_GLUON, flat=True),
    # half to even, as torch.round: floor(x + 1/2), less one where x + 1/2 is an odd integer
    Op("round", "un", _sympy_round, round, lambda torch, x: torch.round(x), lambda np, x: np.round(x),
       "(tl.floor({0} + 0.5) - tl.where((tl.floor({0} + 0.5) == {0} + 0.5) & (tl.floor({0} + 0.5) % 2 != 0), "
       "1.0, 0.0))", gluon=NO_GLUON, work=4.0, flat=True),
    Op("trunc", "un", lambda sp, a: sp.Piecewise((sp.ceiling(a), a < 0), (sp.floor(a), True)), math.trunc,
       lambda torch, x: torch.trunc(x), lambda np, x: np.trunc(x), "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
       gluon=NO_GLUON, work=2.0, flat=True),
]


def _arith(name, sympy, python, torch, numpy, triton, infix=None, **flags) -> Op:
    return Op(name, "bin", sympy, python, torch, numpy, triton, group="arith", infix=infix, **flags)


def _compare(name, infix, negation, relation: str, np_name: str) -> Op:
    """A comparison: 1 where `a infix b` holds, else 0."""
    test = getattr(operator, name)
    return Op(name, "bin", lambda sp, a, b: _indicator(sp, getattr(sp, relation)(a, b)),
              lambda a, b: float(test(a, b)), lambda torch, a, b: getattr(torch, name)(a, b),
              lambda np, a, b: getattr(np, np_name)(a, b), f"({{}} {infix} {{}})", group="compare", infix=infix,
              negation=negation, flat=True)


def _logic(name, infix, sympy_connective: str) -> Op:
    return Op(name, "bin", lambda sp, a, b: _indicator(sp, getattr(sp, sympy_connective)(sp.Ne(a, 0), sp.Ne(b, 0))),
              lambda a, b: float(getattr(operator, f"{name}_")(a != 0, b != 0)),
              lambda torch, a, b: getattr(torch, f"logical_{name}")(a, b),
              lambda np, a, b: getattr(np, f"logical_{name}")(a, b), f"({{}} {infix} {{}})", group="logic",
              infix=infix, flat=True)


def _bitwise(name, symbol, python_op, sympy_form, torch_fn: str, np_fn: str) -> Op:
    """A bit operation of integers (ids stored as floats are taken to integers first)."""
    return Op(name, "bin", sympy_form, lambda a, b: float(python_op(int(a), int(b))),
              lambda torch, a, b: _torch_integers(torch, torch_fn, a, b),
              lambda np, a, b: _np_integers(np, np_fn, a, b), f"({{}} {symbol} {{}})", gluon=NO_GLUON,
              group="integer", bitwise=True, keeps_nonnegative=True, flat=True)


def _sympy_bitwise(name: str, python_op):
    return lambda sp, a, b: _sympy_integer_function(sp, name, python_op)(a, b)


_BINARY = [
    _arith("add", lambda sp, a, b: a + b, lambda a, b: a + b, lambda torch, a, b: torch.add(a, b),
           lambda np, a, b: np.add(a, b), "({} + {})", "+", keeps_nonnegative=True,
           derivative=lambda d, a, b, t, A: (A, A)),
    _arith("sub", lambda sp, a, b: a - b, lambda a, b: a - b, lambda torch, a, b: torch.sub(a, b),
           lambda np, a, b: np.subtract(a, b), "({} - {})", "-",
           derivative=lambda d, a, b, t, A: (A, d.minus(A))),
    _arith("mul", lambda sp, a, b: a * b, lambda a, b: a * b, lambda torch, a, b: torch.mul(a, b),
           lambda np, a, b: np.multiply(a, b), "({} * {})", "*", keeps_nonnegative=True,
           derivative=lambda d, a, b, t, A: (d.times(A, b), d.times(A, a))),
    _arith("div", lambda sp, a, b: a / b, lambda a, b: a / b, lambda torch, a, b: torch.div(a, b),
           lambda np, a, b: np.divide(a, b), "({} / {})", "/", work=2.0,
           derivative=lambda d, a, b, t, A: (d.over(A, b), d.minus(d.over(d.times(A, t), b)))),
    _arith("max", lambda sp, a, b: sp.Max(a, b), max, lambda torch, a, b: torch.maximum(a, b),
           lambda np, a, b: np.maximum(a, b), "tl.maximum({}, {})", keeps_nonnegative=True,
           derivative=lambda d, a, b, t, A: (d.keep_if(d.bin("ge", a, b), A), d.keep_if(d.bin("lt", a, b), A))),
    _arith("min", lambda sp, a, b: sp.Min(a, b), min, lambda torch, a, b: torch.minimum(a, b),
           lambda np, a, b: np.minimum(a, b), "tl.minimum({}, {})", keeps_nonnegative=True,
           derivative=lambda d, a, b, t, A: (d.keep_if(d.bin("le", a, b), A), d.keep_if(d.bin("gt", a, b), A))),
    _compare("lt", "<", "ge", "Lt", "less"),
    _compare("le", "<=", "gt", "Le", "less_equal"),
    _compare("gt", ">", "le", "Gt", "greater"),
    _compare("ge", ">=", "lt", "Ge", "greater_equal"),
    _compare("eq", "==", "ne", "Eq", "equal"),
    _compare("ne", "!=", "eq", "Ne", "not_equal"),
    _logic("and", "&", "And"),
    _logic("or", "|", "Or"),
    # floor division and its remainder, as torch (Triton's integer // and % truncate: kernel.flooring)
    Op("floordiv", "bin", lambda sp, a, b: sp.floor(a / b), lambda a, b: a // b,
       lambda torch, a, b: torch.div(a, b, rounding_mode="floor"), lambda np, a, b: np.floor_divide(a, b),
       "({} // {})", group="integer", keeps_nonnegative=True, infix="//", flat=True),
    Op("mod", "bin", lambda sp, a, b: sp.Mod(a, b), lambda a, b: a % b, lambda torch, a, b: torch.remainder(a, b),
       lambda np, a, b: np.mod(a, b), "({} % {})", group="integer", keeps_nonnegative=True, infix="%",
       flat=True),
    _bitwise("bitand", "&", operator.and_, _sympy_bitwise("bitand", operator.and_), "bitwise_and", "bitwise_and"),
    _bitwise("bitor", "|", operator.or_, _sympy_bitwise("bitor", operator.or_), "bitwise_or", "bitwise_or"),
    _bitwise("bitxor", "^", operator.xor, _sympy_bitwise("bitxor", operator.xor), "bitwise_xor", "bitwise_xor"),
    _bitwise("shl", "<<", operator.lshift, lambda sp, a, b: a * 2 ** b, "bitwise_left_shift", "left_shift"),
    _bitwise("shr", ">>", operator.rshift, lambda sp, a, b: sp.floor(a / 2 ** b), "bitwise_right_shift",
             "right_shift"),
]

UN: dict[str, Op] = {op.name: op for op in _UNARY}
BIN: dict[str, Op] = {op.name: op for op in _BINARY}
OPS: dict[str, dict[str, Op]] = {"un": UN, "bin": BIN}


def named(kind: str, **flags) -> tuple[str, ...]:
    """The names of the ops of `kind` whose fields equal `flags`, in declaration order."""
    return tuple(name for name, op in OPS[kind].items() if all(getattr(op, f) == v for f, v in flags.items()))


def forms(kind: str, form: str, library) -> dict[str, Callable]:
    """fn -> the `form` ("sympy", "torch", "numpy") of every op of `kind`, bound to the imported library."""
    return {name: partial(getattr(op, form), library) for name, op in OPS[kind].items()}
