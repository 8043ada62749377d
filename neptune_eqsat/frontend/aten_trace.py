"""score_mod / mask_mod callables traced by torch itself, then translated from ATen into spec expressions.

The callables run once under torch's proxy tracing (make_fx) on 0-d index tensors, the way FlexAttention
traces them: every method form, helper function, combinator (and_masks builds its masks with new_ones) and
operator overload reaches the graph as the ATen operation it dispatches to, and `t[idx]` with a traced index
becomes aten.index (TransformGetItemToIndex). The values are fake, so Python control flow on a traced value
fails instead of silently following one branch. The graph's nodes are translated by ATEN below, one entry per
ATen operation (keyed by its name, whatever overload); an operation without an entry stops the trace with a
TraceError naming it and the callable's line.
"""
from __future__ import annotations

import math
import traceback
from pathlib import Path

import torch
import torch._guards
from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.frontend import spec as S
from neptune_eqsat.frontend import aten_math as M
from neptune_eqsat.frontend.aten_casts import (_compared, _dtype, _is_float, _logic, _logical, _not, _pow_node,
                                               _to, _truth, _where)
from neptune_eqsat.frontend.aten_math import (_clamp, _div, _exp2, _fmod, _gelu, _max, _min, _scalar, _sign,
                                              _softplus, _unary)

LN2 = math.log(2.0)


class Untranslatable(Exception):
    """An ATen operation the spec language cannot express (with why)."""


class View:
    """A captured tensor indexed in some of its dimensions so far (None where not yet)."""

    def __init__(self, tensor: torch.Tensor, fixed: tuple):
        self.tensor, self.fixed = tensor, fixed

    def index(self, indices, read) -> View | S.Expr:
        """Fill the dimensions still open, in order, with `indices` (None keeps one open)."""
        fixed, it = list(self.fixed), iter(indices)
        for pos, have in enumerate(fixed):
            if have is None:
                nxt = next(it, None)
                fixed[pos] = nxt
        if next(it, None) is not None:
            raise Untranslatable(f"indexes a captured tensor of shape {tuple(self.tensor.shape)} with too many indices")
        if any(f is None for f in fixed):
            return View(self.tensor, tuple(fixed))
        return read(self.tensor, tuple(fixed))


def _power_of_two(k) -> int | None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return None
    return k


def _shift(a, k, left: bool):
    n = _power_of_two(k)
    if n is None:   # by a traced amount: the shift itself
        return _scalar(a)._bin("shl" if left else "shr", k)
    return _scalar(a) * (2 ** n) if left else _scalar(a) // (2 ** n)


def _bitwise(name: str):
    """On booleans: logic. On integers: the bit operations (~x is -x - 1 in two's complement)."""
    def translate(node, a, b=None):
        if _dtype(node) == torch.bool:
            return _not(a) if name == "not" else _logic(name, a, b)
        if name == "not":
            return -_scalar(a) - 1
        return _scalar(a)._bin("bit" + name, b)
    return translate


def _integral(name: str):
    def translate(node, x, *args, decimals=0):
        if not _is_float(_dtype(node.args[0])):
            return x   # floor, ceil, round or trunc of an integer is itself
        if decimals or args:
            raise Untranslatable(f"{name} to {decimals or args[0]} decimals has no spec form")
        return _unary(name, x)
    return translate


def _of_floats(test, otherwise):
    """A test of a float's class (NaN, infinite, the sign bit); on integers and truth values `otherwise`."""
    def translate(node, a, *args):
        return test(a, *args) if _is_float(_dtype(node.args[0])) else otherwise(a)
    return translate


def _nan_to_num(node, a, nan=None, posinf=None, neginf=None):
    dtype = _dtype(node.args[0])
    if not _is_float(dtype):
        return a
    return M._nan_to_num(a, torch.finfo(dtype).max, nan, posinf, neginf)


def _fill(value):
    return lambda *args, **kwargs: S._wrap(float(value) if not isinstance(value, bool) else value)


def _literal(value):
    """A constant as the trace holds it: a truth value as a Python bool (_evaluated), a number as a spec value."""
    return value if isinstance(value, bool) else S._wrap(value)


def _full(*args, **kwargs):
    return _literal(kwargs.get("fill_value", args[1] if len(args) > 1 else args[0]))


def _same(x, *args, **kwargs):
    return x


# ATen operation name -> translation. Entries taking `node` first read the dtypes traced with the values.
ATEN = {
    "add": lambda a, b, alpha=1: _scalar(a) + (b if alpha == 1 else _scalar(b) * alpha),
    "sub": lambda a, b, alpha=1: _scalar(a) - (b if alpha == 1 else _scalar(b) * alpha),
    "rsub": lambda a, b, alpha=1: _scalar(b) - (a if alpha == 1 else _scalar(a) * alpha),
    "mul": lambda a, b: _scalar(a) * b,
    "div": _div,
    "true_divide": lambda a, b: _scalar(a) / b,
    "floor_divide": lambda a, b: _scalar(a) // b,
    "remainder": lambda a, b: _scalar(a) % b,
    "neg": lambda a: -_scalar(a),
    "exp2": _exp2,
    "log2": lambda a: S.log(a) / LN2, "log10": lambda a: S.log(a) / math.log(10.0),
    "rsqrt": lambda a: 1.0 / S.sqrt(a), "reciprocal": lambda a: 1.0 / _scalar(a),
    "sigmoid": lambda a: 1.0 / (1.0 + S.exp(-_scalar(a))),
    "log1p": lambda a: S.log(1.0 + _scalar(a)), "expm1": lambda a: S.exp(a) - 1.0,
    "softplus": _softplus, "silu": lambda a: _scalar(a) / (1.0 + S.exp(-_scalar(a))), "gelu": _gelu,
    "masked_fill": lambda a, mask, value: _where(mask, value, a),
    "pow": ("node", _pow_node), "fmod": _fmod, "relu": lambda a: _max(a, 0.0), "square": lambda a: _scalar(a) * a,
    "sign": _sign, "sgn": _sign,
    "clamp": _clamp, "clip": _clamp,
    "clamp_min": lambda a, lo: _clamp(a, lo=lo), "clamp_max": lambda a, hi: _clamp(a, hi=hi),
    "maximum": _max, "minimum": _min, "fmax": _max, "fmin": _min,
    "where": _where,
    "eq": _compared(lambda a, b: a == b), "ne": _compared(lambda a, b: a != b),
    "lt": lambda a, b: _scalar(a) < b, "le": lambda a, b: _scalar(a) <= b,
    "gt": lambda a, b: _scalar(a) > b, "ge": lambda a, b: _scalar(a) >= b,
    "logical_and": ("node", _logical("and")), "logical_or": ("node", _logical("or")),
    "logical_not": ("node", _logical("not")), "logical_xor": ("node", _logical("xor")),
    "bitwise_and": ("node", _bitwise("and")), "bitwise_or": ("node", _bitwise("or")),
    "bitwise_xor": ("node", _bitwise("xor")), "bitwise_not": ("node", _bitwise("not")),
    "__and__": ("node", _bitwise("and")), "__or__": ("node", _bitwise("or")), "__xor__": ("node", _bitwise("xor")),
    "__rshift__": lambda a, k: _shift(a, k, False), "bitwise_right_shift": lambda a, k: _shift(a, k, False),
    "__lshift__": lambda a, k: _shift(a, k, True), "bitwise_left_shift": lambda a, k: _shift(a, k, True),
    "floor": ("node", _integral("floor")), "ceil": ("node", _integral("ceil")),
    "round": ("node", _integral("round")), "trunc": ("node", _integral("trunc")),
    "_to_copy": ("node", _to), "to": ("node", _to), "type_as": ("node", _to),
    "scalar_tensor": lambda v, **kwargs: _literal(v), "full": _full,
    "new_full": lambda this, size, fill_value=None, **kwargs: _literal(fill_value), "full_like": _full,
    "new_ones": _fill(1), "ones_like": _fill(1), "new_zeros": _fill(0), "zeros_like": _fill(0),
    "lift_fresh_copy": _same, "clone": _same, "alias": _same, "detach": _same, "detach_": _same, "view": _same, "reshape": _same,
    "_unsafe_view": _same, "expand": _same, "squeeze": _same, "unsqueeze": _same, "permute": _same,
    "contiguous": _same, "expand_as": _same, "view_as": _same,
    "getitem": lambda seq, k: seq[k],   # of an operator's tuple of results
    "isnan": ("node", _of_floats(M._isnan, lambda a: False)),
    "isinf": ("node", _of_floats(M._isinf, lambda a: False)),
    "isposinf": ("node", _of_floats(lambda a: M._isinf(a, 1), lambda a: False)),
    "isneginf": ("node", _of_floats(lambda a: M._isinf(a, -1), lambda a: False)),
    "signbit": ("node", _of_floats(M._signbit, lambda a: _scalar(a) < 0)),
    "nan_to_num": ("node", _nan_to_num), "copysign": M._copysign, "heaviside": M._heaviside,
    "logaddexp": M._logaddexp, "logaddexp2": lambda a, b: M._logaddexp(a, b, base_two=True),
    "log_sigmoid_forward": M._log_sigmoid, "lerp": M._lerp, "xlogy": M._xlogy,
    "addcmul": lambda a, b, c, value=1: _scalar(a) + _scalar(b) * c * value,
    "addcdiv": lambda a, b, c, value=1: _scalar(a) + _scalar(b) / c * value,
    "hardtanh": M._hardtanh, "elu": M._elu, "leaky_relu": M._leaky_relu, "hardsigmoid": M._hardsigmoid,
    "hardswish": lambda a: _scalar(a) * M._hardsigmoid(a), "mish": M._mish,
    "erfc": lambda a: 1.0 - S.erf(a), "special_erfc": lambda a: 1.0 - S.erf(a),
    "sinh": M._sinh, "cosh": M._cosh,
}
# ATen operators that are exactly an op of the registry (its `aten` names)
for _op in ops.UN.values():
    ATEN.update({name: S.ELEMENTWISE[_op.name] for name in _op.aten})
for _op in ops.BIN.values():
    ATEN.update({name: (lambda fn: lambda a, b: S.Expr(ir.bin(fn, _truth(a).term, _truth(b).term)))(_op.name)
                 for name in _op.aten})


def trace(fn, inputs: list[S.Expr], read, dtypes: list[torch.dtype], describe):
    """fn traced and translated: `inputs` are the spec expressions of its arguments (with the dtypes their
    example tensors take), `read(tensor, index)` reads a captured tensor, `describe(what, line)` makes the
    TraceError. Returns a spec expression, or a Python bool for a constant result."""
    try:
        gm = _graph(fn, dtypes)
    except Exception as e:   # the callable did something that cannot be traced
        raise describe(_traced_failure(e), _user_line(traceback.extract_tb(e.__traceback__))) from e
    env: dict = {}
    placeholders = iter(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "get_attr":
            tensor = getattr(gm, node.target)
            if all(getattr(u.target, "__name__", "") == "lift_fresh_copy.default" for u in node.users):
                env[node] = _evaluated(tensor)   # a literal of the callable (torch.tensor(2.0), an int index)
            else:   # a tensor the callable captures: an input of the kernel, read at run time
                env[node] = read(tensor, ()) if tensor.dim() == 0 else View(tensor, (None,) * tensor.dim())
        elif node.op == "call_function":
            try:
                env[node] = _translate(node, env, read)
            except Untranslatable as e:
                raise describe(str(e), _line_of(fn, dtypes, node.target)) from None
        elif node.op == "output":
            out = node.args[0]
            value = env[out] if isinstance(out, torch.fx.Node) else out
            if isinstance(value, View):
                raise describe(f"returns a captured tensor of shape {tuple(value.tensor.shape)} without indexing it",
                               "")
            return _constant(value)
    raise describe("returns nothing", "")


def _translate(node, env, read):
    def value(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return [value(x) for x in a]
        return a

    target = node.target
    name = getattr(getattr(target, "overloadpacket", None), "__name__", None) or getattr(target, "__name__", str(target))
    args, kwargs = value(list(node.args)), {k: value(v) for k, v in node.kwargs.items()}
    if name == "index":
        base, indices = args[0], args[1]
        if not isinstance(base, View):
            raise Untranslatable("indexes a traced value (only captured tensors can be indexed)")
        return base.index([None if i is None else _index(i) for i in indices], read)
    if name == "select":
        base, dim, at = args
        if not isinstance(base, View):
            raise Untranslatable("indexes a traced value (only captured tensors can be indexed)")
        open_dims = [k for k, f in enumerate(base.fixed) if f is None]
        size = base.tensor.shape[open_dims[dim]]
        return base.index([None] * (dim % len(open_dims)) + [S._wrap(at + size if at < 0 else at)], read)
    if name in ("lift_fresh_copy", "clone", "alias", "detach") and isinstance(args[0], (View, bool, int, float)):
        return args[0]   # a table made inside the callable (torch.tensor([0.5, -1.0])[h]), read where indexed; a
        # literal already evaluated (torch.tensor(True))
    if not any(isinstance(a, (S.Expr, View)) for a in _flat(args) + _flat(list(kwargs.values()))):
        return _evaluated(target(*args, **kwargs))   # made from constants only (torch.ones(4)): run it
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, View):
            raise Untranslatable(f"uses a captured tensor of shape {tuple(a.tensor.shape)} without indexing it "
                                 f"(in aten.{name})")
    entry = ATEN.get(name)
    if entry is None:
        raise Untranslatable(f"aten.{name} has no translation into the spec language")
    if isinstance(entry, tuple):
        return entry[1](node, *args, **kwargs)
    return entry(*args, **kwargs)


def _flat(xs) -> list:
    out = []
    for x in xs:
        out += _flat(x) if isinstance(x, (list, tuple)) else [x]
    return out


def _evaluated(t):
    """A tensor computed while tracing: a constant when it is one number, else a tensor the kernel reads."""
    if not isinstance(t, torch.Tensor):
        return S._wrap(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else t
    if t.dim() == 0:   # a truth value stays a Python bool, which the logic folds (a mask of constant True)
        value = t.item()
        return value if isinstance(value, bool) else S._wrap(value)
    return View(t, (None,) * t.dim())


def _index(i) -> S.Expr:
    return S._wrap(i) + 0 if isinstance(i, S.Expr) else S._wrap(int(i))


def _constant(value):
    """A result that does not depend on the inputs as a Python number, else the expression."""
    if isinstance(value, S.Expr) and value.term.op == "const":
        return value.term.attrs[0]
    return value


_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve().parents[1])   # the package: its frames are not the user's


def _user_line(frames) -> str:
    """file:line: text of the innermost frame outside torch and this package (the user's code)."""
    for f in reversed(frames):
        path = str(Path(f.filename).resolve())
        if not path.startswith((_TORCH_DIR, _HERE)) and "/importlib/" not in path:
            return f"{Path(f.filename).name}:{f.lineno}: {(f.line or '').strip()}"
    return ""


class _Found(Exception):
    pass


class _StopAt(TorchDispatchMode):
    """Stops a trace at the first call of one ATen operation, keeping the Python stack of that call."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func == self.target:
            raise _Found(traceback.extract_stack())
        return func(*args, **(kwargs or {}))


def _line_of(fn, dtypes, target) -> str:
    """The user's line that called ATen operation `target`, found by tracing again up to it."""
    def stopping(*args):
        with _StopAt(target):
            return fn(*args)
    try:
        _graph(stopping, dtypes)
    except _Found as found:
        return _user_line(found.args[0])
    except Exception:
        return ""
    return ""


def _graph(fn, dtypes):
    """fn traced on fake 0-d tensors of `dtypes` into an ATen graph, outside any tracing already under way (a
    model being compiled calls flex_attention while torch.compile traces it)."""
    examples = [torch.zeros((), dtype=d) for d in dtypes]

    def positional(*args):   # make_fx binds one input per parameter: defaults (flags=flags) and *args get theirs
        return fn(*args)
    with torch._guards.tracing(None), _disable_current_modes(), TransformGetItemToIndex():
        return make_fx(positional, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)


def _traced_failure(e: Exception) -> str:
    text = str(e)
    if "data-dependent" in text or "DataDependent" in type(e).__name__:
        return ("Python control flow (if / and / or / while) or a Python number taken from a traced value: "
                "use torch.where, &, | and ~ instead")
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
