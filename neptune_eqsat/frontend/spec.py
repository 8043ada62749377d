"""The spec language: plain index-notation math, written as Python.

    from neptune_eqsat.spec import *
    spec = Spec("softmax")
    R, N = spec.dims("R", "N")                 # sizes known only at run time
    r, j = spec.axes(r=R, j=N)                 # loop indices and their extents
    x = spec.input("x", f32, R, N)
    m = max(j, x[r, j])                        # a reduction over j
    spec.output("y", f32, exp(x[r, j] - m) / sum(j, exp(x[r, j] - m)), r, j)

A second call of spec.output adds an output the same kernel writes.
Every expression remembers the spec line that wrote it, so errors name it.
"""
from __future__ import annotations

import functools

import builtins
import keyword
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.conditions import index_max, is_index_condition, negate
from neptune_eqsat.frontend.spec_checks import extent_problem, fractional_part, misnamed, size_of_no_input

__all__ = ["Spec", "Dim", "SpecError", "f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "inf", "nan", "sum", "max", "min", "where", "cast",
           "load_spec"]

f16, bf16, f32, f64 = "f16", "bf16", "f32", "f64"
i8, u8, i16, i32, i64 = "i8", "u8", "i16", "i32", "i64"   # inputs only (ids, labels, offsets); "bool" too
inf, nan = math.inf, math.nan


class SpecError(ValueError):
    """A malformed spec; the message names the spec line."""


def _origin() -> str | None:
    f = sys._getframe(1)
    here = __file__
    while f is not None and f.f_code.co_filename == here:
        f = f.f_back
    return f"{Path(f.f_code.co_filename).name}:{f.f_lineno}" if f is not None else None


def _fail(msg: str, origin: str | None = None) -> SpecError:
    origin = origin or _origin()
    return SpecError(f"{origin}: {msg}" if origin else msg)


@dataclass(frozen=True)
class Dim:
    """A size known only at run time (taken from the input shapes)."""
    name: str

    def __repr__(self) -> str:
        return self.name

    def _term(self) -> Term:
        return ir.dim(self.name)

    def __float__(self):
        raise _fail(f"{self.name} is a size known only at run time, not a Python number: use it in the expression "
                    f"itself (x / {self.name}, {self.name} - 1)")
    __int__ = __float__


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod",
            "rmod", "pow", "neg", "pos"):   # arithmetic of sizes: expressions
    setattr(Dim, f"__{_op}__", lambda self, *o, _op=_op: getattr(_wrap(self), f"__{_op}__")(*o))

Extent = int | Dim


class Expr:
    """A scalar expression; arithmetic builds IR terms."""
    __slots__ = ("term",)
    __array_priority__ = 1000

    def __init__(self, term: Term):
        self.term = term

    def __repr__(self) -> str:
        return ir.show(self.term)

    def __bool__(self):
        raise _fail("a spec expression has no truth value here: use where(cond, a, b) instead of if/and/or")

    def _bin(self, fn: str, other, swap: bool = False) -> Expr:
        a, b = _wrap(self), _wrap(other)
        if swap:
            a, b = b, a
        return Expr(Term("bin", (fn,), (a.term, b.term), _origin()))

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("floordiv", o)
    def __rfloordiv__(self, o): return self._bin("floordiv", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __rmod__(self, o): return self._bin("mod", o, True)
    def __pos__(self): return self
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __eq__(self, o): return self._bin("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._bin("ne", o)  # type: ignore[override]
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def __pow__(self, p):   # x ** n: n - 1 products (1 / x ** -n below zero); x ** 0.5: sqrt
        if p == 0.5 and not isinstance(p, bool):
            return Expr(Term("un", ("sqrt",), (self.term,), _origin()))
        if not isinstance(p, int) or isinstance(p, bool) or abs(p) > 64:
            raise _fail(f"x ** {p!r}: the exponent must be an integer (at most 64 in size) or 0.5; write "
                        "exp(p * log(x)) for another power of a positive x")
        out = functools.reduce(lambda a, _: a * self, range(abs(p) - 1), self) if p else _wrap(1.0)
        return out if p >= 0 else 1.0 / out

    def __neg__(self): return Expr(Term("un", ("neg",), (self.term,), _origin()))
    def __invert__(self): return Expr(Term("un", ("not",), (self.term,), _origin()))
    __hash__ = None  # type: ignore[assignment]


class Axis(Expr):
    """A loop index with its extent."""
    __slots__ = ("name", "extent")

    def __init__(self, name: str, extent: Extent):
        super().__init__(ir.axis(name))
        self.name, self.extent = name, extent


def _wrap(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, Dim):
        return Expr(x._term())
    if isinstance(x, bool):
        raise _fail("booleans are not values in a spec")
    if isinstance(x, (int, float)):
        return Expr(ir.const(x))
    raise _fail(f"cannot use {type(x).__name__} {x!r} in a spec expression")


class Tensor:
    """An input tensor; indexing it reads one element."""

    def __init__(self, spec: Spec, name: str, dtype: str, shape: tuple[Extent, ...], positive: bool,
                 source: str = ""):
        self.spec, self.name, self.dtype, self.shape, self.positive = spec, name, dtype, shape, positive
        self.source = source or f"input {name}"   # what the tensor is, for messages

    def __getitem__(self, idx) -> Expr:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise _fail(f"tensor {self.name} has {len(self.shape)} dimensions {list(self.shape)}, "
                        f"indexed with {len(idx)}")
        terms = []
        for pos, (x, ext) in enumerate(zip(idx, self.shape)):
            e = _wrap(x)
            self.spec._check_index(self.name, pos, e.term, ext)
            terms.append(e.term)
        return Expr(Term("load", (self.name,), tuple(terms), _origin()))


@dataclass(frozen=True)
class Output:
    """A further output, computed by the same kernel as the first (a row statistic a backward pass reads)."""
    name: str
    dtype: str
    term: Term
    axes: tuple[str, ...]


@dataclass
class Spec:
    """A computation: run-time dims, axes, inputs and its outputs (the first, and any further ones)."""
    name: str
    dims_: dict[str, Dim] = field(default_factory=dict)
    typical: dict[str, int] = field(default_factory=dict)
    axes_: dict[str, Extent] = field(default_factory=dict)
    inputs: dict[str, Tensor] = field(default_factory=dict)
    output_name: str | None = None
    output_dtype: str | None = None
    output_term: Term | None = None
    output_axes: tuple[str, ...] = ()
    doc: str = ""
    # set by layout rewrites (layout.py): where each output element is stored when the kernel's axes are not
    # the output's own, the output's shape, and sizes the launcher derives as factor * dim
    output_index: tuple[Term, ...] | None = None
    output_shape: tuple[Extent, ...] | None = None
    derived: dict[str, tuple[int, str]] = field(default_factory=dict)
    also: tuple[Output, ...] = ()   # further outputs, in the order spec.output named them

    def dims(self, *names: str, **typical: int):
        """Sizes known only at run time. Keyword form gives a typical size, used to price plans:
        spec.dims(B=1, S=4096). Positional names get 1024."""
        out = []
        for n, size in [(n, 1024) for n in names] + list(typical.items()):
            if extent_problem(size, ()):
                raise _fail(f"dim {n}: the typical size must be a positive int, got {size!r}")
            self.dims_[n] = Dim(n)
            self.typical[n] = size
            out.append(self.dims_[n])
        return out[0] if len(out) == 1 else out

    def axes(self, **extents: Extent):
        out = []
        for n, ext in extents.items():
            if why := extent_problem(ext, Dim):
                raise _fail(f"axis {n}: extent {why}")
            self.axes_[n] = ext
            out.append(Axis(n, ext))
        return out[0] if len(out) == 1 else out

    def input(self, name: str, dtype: str, *shape: Extent, positive: bool = False, source: str = "") -> Tensor:
        dtype = "bool" if dtype is bool else dtype   # Python's bool names the bool dtype too
        if name in self.inputs:
            raise _fail(f"input {name}: declared twice (each input needs a name of its own)")
        if dtype not in ir.DTYPES:
            raise _fail(f"input {name}: unknown dtype {dtype!r} (one of {', '.join(ir.DTYPES)})")
        for s in shape:
            if why := extent_problem(s, Dim, "ints or Dims"):
                hint = " (a size computed from others, as 2 * S - 1, is a Dim of its own: spec.dims(R=...))"
                raise _fail(f"input {name}: shape entries {why}{hint * isinstance(s, Expr)}")
        t = Tensor(self, name, dtype, tuple(shape), positive, source)
        self.inputs[name] = t
        return t

    def output(self, name: str, dtype: str, value, *axes: Axis) -> None:
        if dtype not in ir.FLOAT_DTYPES:
            raise _fail(f"output {name}: dtype {dtype!r} is not a floating-point dtype "
                        f"(one of {', '.join(ir.FLOAT_DTYPES)})")
        e = _wrap(value)
        for a in axes:
            if not isinstance(a, Axis):
                raise _fail(f"output {name}: {a!r} is not an axis (pass the axis objects spec.axes returned)")
        names = tuple(a.name for a in axes)
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise _fail(f"output {name}: axis {', '.join(repeated)} is named more than once among the output axes "
                        f"{list(names)} (each output dimension needs an axis of its own)")
        extra = e.term.free - set(names)
        if extra:
            raise _fail(f"output {name}: the value depends on axes {sorted(extra)} that are not output axes "
                        f"{list(names)} (reduce over them or add them)")
        if self.output_term is None:
            self.output_name, self.output_dtype, self.output_term, self.output_axes = name, dtype, e.term, names
            return
        self.also += (_further_output(self, name, dtype, e.term, names),)

    @property
    def root_term(self) -> Term:
        """What the compiler optimizes: the output's term, or every output's in one `pack`."""
        return ir.pack(self.output_term, *(o.term for o in self.also)) if self.also else self.output_term

    # ---- checks -------------------------------------------------------------------------------------------
    def _check_index(self, tensor: str, pos: int, t: Term, ext: Extent) -> None:
        for a in t.free:
            if a not in self.axes_:
                raise _fail(f"tensor {tensor}, dimension {pos}: unknown axis {a}")
        fractional = fractional_part(t)
        if fractional is not None:
            raise _fail(f"tensor {tensor}, dimension {pos}: index {ir.show(t)} is not a whole number "
                        f"({ir.show(fractional)} can be fractional; round it with floor, or use // for a division)")
        if t.op == "axis":
            aext = self.axes_[t.attrs[0]]
            if aext != ext:
                raise _fail(f"tensor {tensor}, dimension {pos} has extent {ext} but axis {t.attrs[0]} "
                            f"runs over {aext}")
            return
        hi = index_max(self.axes_, t)
        if hi is not None and isinstance(ext, int) and hi >= ext:
            raise _fail(f"tensor {tensor}, dimension {pos}: index {ir.show(t)} reaches {hi}, beyond extent {ext}")

    def retyped(self, dtype: str) -> Spec:
        """The same computation with its 16-bit floating-point inputs, casts and output in `dtype` (bf16 for
        an fp16 spec, say); inputs of other dtypes (fp32 slopes, integer ids) keep theirs."""
        if dtype not in ir.FLOAT_DTYPES:
            raise SpecError(f"cannot retype to {dtype!r} (one of {', '.join(ir.FLOAT_DTYPES)})")
        if self.output_term is None:
            raise SpecError(f"spec {self.name}: no output to retype")
        sixteen = ("f16", "bf16")

        def new(old: str) -> str:
            return dtype if old in sixteen else old
        def cast_to_new(x: Term) -> Term:
            return Term("cast", (new(x.attrs[0]),), x.args, x.origin) if x.op == "cast" else x
        out = replace(self, inputs={}, derived=dict(self.derived), output_dtype=new(self.output_dtype or ""),
                      output_term=ir.bottom_up(self.output_term, cast_to_new),
                      also=tuple(replace(o, dtype=new(o.dtype), term=ir.bottom_up(o.term, cast_to_new))
                                 for o in self.also))
        for n, t in self.inputs.items():
            out.inputs[n] = Tensor(out, n, new(t.dtype), t.shape, t.positive, t.source)
        return out

    def extent(self, ax: str) -> Extent:
        return self.axes_[ax]

    @property
    def axis_dims(self) -> dict[str, str]:
        """Axis -> the name of the run-time dim it runs over (axes of a fixed extent left out)."""
        return {a: e.name for a, e in self.axes_.items() if isinstance(e, Dim)}

    def validate(self) -> None:
        if self.output_term is None:
            raise SpecError(f"spec {self.name}: no output (call spec.output(name, dtype, value, *axes))")
        for t in ir.walk(self.root_term):
            if ir.is_reduction(t) and t.attrs[1] not in t.args[0].free:
                raise _fail(f"{t.attrs[0]} over {t.attrs[1]}: the reduced value does not depend on {t.attrs[1]}",
                            t.origin)
        if problem := misnamed(self):
            raise SpecError(f"spec {self.name}: {problem}")
        problem = size_of_no_input(self)
        if problem is not None:
            message, origin = problem
            raise _fail(message, origin) if origin else SpecError(f"spec {self.name}: {message}")


def _further_output(spec: Spec, name: str, dtype: str, term: Term, axes: tuple[str, ...]) -> Output:
    """A further output, written by the kernel of the first: which axes it may run along and reduce over is
    the schedule's to check (schedule.py)."""
    if name in [spec.output_name, *(o.name for o in spec.also)] or name in spec.inputs:
        raise _fail(f"output {name}: the name is taken")
    return Output(name, dtype, term, axes)


def _un(fn: str, x) -> Expr:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return ops.UN[fn].python(x)
    return Expr(Term("un", (fn,), (_wrap(x).term,), _origin()))


def _elementwise(fn: str):
    def apply(x):
        return _un(fn, x)
    apply.__name__ = apply.__qualname__ = fn
    apply.__doc__ = f"{fn}(x), elementwise: the op registry's {fn!r} (a number in gives a number out)."
    return apply


# every unary op of the registry is a function of the language (exp, log, tanh, sqrt, abs, erf, floor, ...)
ELEMENTWISE = {fn: _elementwise(fn) for fn in ops.UN if fn.isidentifier() and not keyword.iskeyword(fn)}
globals().update(ELEMENTWISE)
__all__ += sorted(ELEMENTWISE)


def where(cond, a, b) -> Expr:
    """cond ? a : b. A mask written with the constant first (where(j > i, -inf, s)) is stored as where(j <= i,
    s, -inf): the kept value first and the constant it is replaced by second, the one form of a mask."""
    c, x, y = _wrap(cond).term, _wrap(a).term, _wrap(b).term
    if x.op == "const" and y.op != "const" and is_index_condition(c):
        c, x, y = negate(c), y, x
    return Expr(Term("where", (), (c, x, y), _origin()))


def cast(x, dtype: str) -> Expr:
    if dtype not in ir.FLOAT_DTYPES:
        what = "an integer dtype" if dtype in ir.INT_DTYPES else "unknown dtype"
        raise _fail(f"cast to {what} {dtype!r}: casts are to a floating-point dtype ({', '.join(ir.FLOAT_DTYPES)})")
    return Expr(Term("cast", (dtype,), (_wrap(x).term,), _origin()))


def _reduce(reducer: str, builtin, args, kwargs):
    if args and isinstance(args[0], Axis):
        if len(args) != 2 or kwargs:
            raise _fail(f"{reducer}(axis, value) takes exactly an axis and a value")
        ax, body = args
        b = _wrap(body)
        if ax.name not in b.term.free:
            raise _fail(f"{reducer} over {ax.name}: the value does not depend on {ax.name}")
        return Expr(Term("red", (reducer, ax.name), (b.term,), _origin()))
    if reducer != "sum" and len(args) == 2 and any(isinstance(a, (Expr, Dim)) for a in args):
        return _wrap(args[0])._bin(reducer, args[1])
    if any(isinstance(a, Expr) for a in args):
        raise _fail(f"{reducer}(...) of spec values needs an axis first: {reducer}(j, value)")
    return builtin(*args, **kwargs)


def sum(*args, **kwargs):  # noqa: A001
    """sum(axis, value): reduction. On plain Python values: the builtin."""
    return _reduce("sum", builtins.sum, args, kwargs)


def max(*args, **kwargs):  # noqa: A001
    """max(axis, value): reduction; max(a, b): elementwise. On plain Python values: the builtin."""
    return _reduce("max", builtins.max, args, kwargs)


def min(*args, **kwargs):  # noqa: A001
    return _reduce("min", builtins.min, args, kwargs)


from neptune_eqsat.frontend.spec_file import load_spec  # noqa: E402  (it runs files of this language)
