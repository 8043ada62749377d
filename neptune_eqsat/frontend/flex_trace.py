"""FlexAttention's score_mod / mask_mod callables traced into an attention spec.

The callables run once on symbolic values: `score` is the scaled dot product, `b, h, q_idx, kv_idx` are the
batch, query-head, query and key indices (0-based positions in the query and key tensors, as in
FlexAttention). Tensors they capture and index (`bias[h]`, `doc_id[q_idx]`) become inputs of the kernel, so new
values do not recompile. The resulting spec is the plain attention math with the score modified and masked
elements at -inf; the compiler finds the fused plan (rolled for prefill, split-K for decode). `reads` says what a
callable reads besides its arguments, so a caller knows when to trace it again.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import math
import types
import weakref
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch

from neptune_eqsat import ir
from neptune_eqsat.frontend import aten_trace
from neptune_eqsat.frontend import spec as S
from neptune_eqsat.frontend.spec import Spec, SpecError


DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
# captured tensors the kernels read as they are stored: these floats, and integers and truth values exactly (ids
# beyond 2^24 stay distinct); any other dtype (float64, fp8) is read as float32
CAPTURE_DTYPES = {**DTYPES, **{getattr(torch, ir.TORCH_NAMES[d]): d for d in ir.INT_DTYPES}}


class TraceError(SpecError):
    """A score_mod / mask_mod that cannot be traced; names the callable, the line and the construct."""


@dataclass
class _Trace:
    spec: Spec
    fn_name: str = ""
    captures: list[torch.Tensor] = field(default_factory=list)

    def capture(self, t: torch.Tensor, index: tuple) -> S.Expr:
        """A captured tensor read at `index` (spec expressions; `+ 0` on each, see below)."""
        for k, c in enumerate(self.captures):
            if c is t:
                name = f"capture{k}"
                break
        else:
            name = f"capture{len(self.captures)}"
            self.captures.append(t)
        if t.dim() != len(index):
            raise self.error(f"indexes captured tensor of shape {tuple(t.shape)} with {len(index)} indices")
        if name not in self.spec.inputs:   # its shape is part of the kernel (a new shape compiles a new one)
            self.spec.input(name, CAPTURE_DTYPES.get(t.dtype, "f32"), *(int(n) for n in t.shape),
                            source=f"the tensor of shape {tuple(t.shape)} that {self.fn_name} captures")
        tensor = self.spec.inputs[name]
        # a constant index below zero counts from the end, as torch's indexing does (t[-1])
        index = [S._wrap(c + n) if (c := _constant_of(x.term)) is not None and c < 0 else x
                 for x, n in zip(index, t.shape)]
        # indices come as `i + 0`: an index may be an axis whose extent is a run-time size, and the tensor's
        # extent is fixed, so it is read at a computed index (checked at run time, bounds.py)
        try:
            return tensor[tuple(index)] if index else S.Expr(ir.load(name))
        except SpecError as e:   # an index the problem's sizes take outside the tensor (bias[h] of fewer heads)
            detail = str(e).split(f"tensor {name}, ", 1)[-1]
            raise IndexError(f"{tensor.source} is read out of range: {detail}") from None

    def error(self, what: str, line: str = "") -> TraceError:
        return TraceError(f"{self.fn_name}{' (' + line + ')' if line else ''}: {what}")


def _constant_of(t: ir.Term):
    """The number an index term is where it is one (a literal, or the tracer's `c + 0`), else None."""
    if t.op == "const":
        return t.attrs[0]
    if t.op == "bin" and t.attrs[0] == "add":
        a, b = (_constant_of(x) for x in t.args)
        return None if a is None or b is None else a + b
    return None


def _call(tr: _Trace, fn, args: list[S.Expr], dtypes: list[torch.dtype]):
    """fn traced by torch and translated into a spec expression (aten_trace.py)."""
    tr.fn_name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None), "__qualname__", repr(fn))
    return aten_trace.trace(fn, args, tr.capture, dtypes, tr.error)


@dataclass(frozen=True)
class Problem:
    """What a compiled kernel depends on (not the sequence lengths)."""
    dtype: str
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    scale: float
    decode: bool = False
    lse: bool = False   # the output is the row logsumexp of the scores (return_lse), not the weighted values


def trace(score_mod, mask_mod, problem: Problem) -> tuple[Spec, list[torch.Tensor]]:
    """The attention spec with the callables traced in, and the tensors they capture (kernel inputs)."""
    p = problem
    spec = Spec("flex")
    B, L, Skv = spec.dims(B=1, L=1 if p.decode else 4096, S=32768 if p.decode else 4096)
    b, h, i, j, d, e = spec.axes(b=B, h=p.heads, i=L, j=Skv, d=p.head_dim, e=p.value_dim)
    q = spec.input("q", p.dtype, B, p.heads, L, p.head_dim)
    k = spec.input("k", p.dtype, B, p.kv_heads, Skv, p.head_dim)
    v = spec.input("v", p.dtype, B, p.kv_heads, Skv, p.value_dim)
    hk = h // (p.heads // p.kv_heads) if p.heads != p.kv_heads else h
    tr = _Trace(spec)
    s = S.sum(d, q[b, h, i, d] * k[b, hk, j, d]) * p.scale
    index = [torch.int32] * 4   # FlexAttention's index tensors
    if score_mod is not None:
        s = _call(tr, score_mod, [s, b, h, i, j], [torch.float32] + index)
        if not isinstance(s, S.Expr) or j.name not in s.term.free:   # a score of neither the keys nor q k^T
            s = S._wrap(s if isinstance(s, S.Expr) else float(s)) + 0 * S.sum(d, q[b, h, i, d] * k[b, hk, j, d])
    if mask_mod is not None:
        keep = _call(tr, mask_mod, [b, h, i, j], index)
        if not isinstance(keep, S.Expr):
            keep = bool(keep)
        if keep is not True:
            if keep is False:
                keep = S._wrap(0.0) > 1.0
            s = S.where(keep, s, -math.inf)
    m = S.max(j, s)
    p_ = S.exp(s - S.where(m == -math.inf, 0, m))
    l_ = S.sum(j, p_)
    if p.lse:   # natural logarithm, -inf where a row keeps no key (FlexAttention's return_lse)
        spec.output("lse", "f32", S.where(l_ == 0, -math.inf, S.where(m == -math.inf, 0, m) + S.log(l_)), b, h, i)
    else:
        o = S.sum(j, S.cast(p_, p.dtype) * v[b, hk, j, e]) / S.where(l_ == 0, 1, l_)
        spec.output("o", p.dtype, o, b, h, i, e)
    spec.validate()
    # one name per traced problem: the tuning database keys its measurements by spec name
    spec.name = "flex_" + hashlib.sha256(problem_text(spec, problem).encode()).hexdigest()[:12]
    return spec, tr.captures


# ---- compiled kernels, cached in memory and on disk -------------------------------------------------------------


def problem_text(spec: Spec, problem: Problem) -> str:
    return f"{problem}|{ir.show(spec.output_term)}|" + "|".join(
        f"{n}:{t.dtype}:{t.shape}" for n, t in spec.inputs.items())


_FLEX_NAMES = {"b": "b", "h": "h", "i": "q_idx", "j": "kv_idx"}


def index_text(t: ir.Term) -> str:
    """An index in the callables' own names (q_idx, kv_idx), without the tracer's `+ 0`."""
    def clean(x: ir.Term) -> ir.Term:
        if x.op == "axis":
            return ir.axis(_FLEX_NAMES.get(x.attrs[0], x.attrs[0]))
        if x.op == "bin" and x.attrs[0] == "add" and x.args[1] == ir.const(0):
            return clean(x.args[0])
        return ir.Term(x.op, x.attrs, tuple(clean(a) for a in x.args)) if x.args else x
    return ir.show(clean(t))


_VALUES = (int, float, bool, complex, str, bytes, type(None), np.generic)   # numbers numpy's among them


_OPAQUE = (type, torch.dtype, torch.device)
CONTAINER_LIMIT = 256   # elements of a list, a dict or a module list read (their values or identities)
_MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential, torch.nn.ParameterList,
                      torch.nn.ParameterDict)


def reads(fn) -> tuple:
    """What a callable reads besides its arguments and could change between calls: Python numbers and strings
    by value, tensors by identity, found in its closure, the globals and attributes it names, its defaults, and
    the same of the functions it reaches through them (helpers, and_masks' list of masks). The trace bakes
    numbers into the kernel and binds tensors as inputs, so a call whose reads differ is traced again."""
    # the attribute names the code reaching an object uses, over every function and method it reaches (a
    # method or a helper taking the object reads cache.pos where the callable names only cache and mask): grown
    # until the walk finds no new one, kept per callable so that a call walks once
    known = _NAMES.get(id(fn))
    names = set(known[1]) if known is not None and known[0]() is fn else set()
    for _ in range(4):
        size, out = len(names), []
        _reads_of(fn, out, set(), names, 0)
        if len(names) == size:
            break
    try:
        _NAMES[id(fn)] = (weakref.ref(fn), frozenset(names))
    except TypeError:   # (a callable without weak references: walked afresh each call)
        pass
    if len(_NAMES) > 4096:
        _NAMES.clear()
    return tuple(out)


_NAMES: dict[int, tuple] = {}   # id of a callable -> (weak ref, the attribute names its code reaches)


def _code_names(code) -> frozenset:
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):   # a nested function or lambda: what it names is read when it runs
            names |= _code_names(c)
    return frozenset(names)


def _reads_of(v, out: list, seen: set, names: set, depth: int) -> None:
    if isinstance(v, _VALUES):
        out.append(repr(v))
        return
    if isinstance(v, torch.Tensor):   # (bound as an input: read again at every call, unless replaced or retyped)
        out.append(("tensor", id(v), v.dtype, v.device, v.dim()))
        return
    if depth > 6 or id(v) in seen or isinstance(v, _OPAQUE):
        return
    seen.add(id(v))
    if isinstance(v, functools.partial):
        parts = [v.func, *v.args, *v.keywords.values()]
    elif isinstance(v, (list, tuple, set, frozenset)):
        parts = list(v)[:CONTAINER_LIMIT]
    elif isinstance(v, dict):
        parts = list(v.values())[:CONTAINER_LIMIT]
    elif isinstance(v, torch.nn.Module) and isinstance(v, _MODULE_CONTAINERS):   # layers[1], blocks["a"]
        parts = list(v._modules.values())[:CONTAINER_LIMIT] + list(v._parameters.values())[:CONTAINER_LIMIT]
    elif hasattr(v, "__func__") and hasattr(v, "__self__"):   # a bound method
        parts = [v.__func__, v.__self__]
    elif hasattr(v, "__code__") and hasattr(v, "__globals__"):   # a Python function
        names |= _code_names(v.__code__)
        cells = [c.cell_contents for c in v.__closure__ or () if _filled(c)]
        parts = cells + [v.__globals__[n] for n in sorted(names) if n in v.__globals__]
        parts += list(v.__defaults__ or ()) + list((v.__kwdefaults__ or {}).values())
    elif isinstance(v, ModuleType):   # a module: the values the code names in it (cfg.WINDOW), not its functions
        found = [v.__dict__[n] for n in sorted(names) if n in v.__dict__]
        parts = [x for x in found if not callable(x) and not isinstance(x, ModuleType)]
    elif callable(v) and not hasattr(v, "__dict__"):   # a builtin
        return
    else:   # an object: the attributes of it that the code names (self.scale, cfg.window), and those its own
        # __call__ (or an nn.Module's forward) reads through self when it is the callable itself
        methods = [m for m in (getattr(type(v), "__call__", None), getattr(type(v), "forward", None))
                   if m is not None and hasattr(m, "__code__")]
        methods += [m for m in (inspect.getattr_static(type(v), n, None) for n in sorted(names))   # cache.mask
                    if isinstance(m, types.FunctionType)]
        for m in methods:
            names |= _code_names(m.__code__)
        parts = [x for x in (_attribute(v, n) for n in sorted(names)) if x is not _ABSENT] + methods
    for p in parts:
        _reads_of(p, out, seen, names, depth + 1)


_ABSENT = object()


def _attribute(v, name: str):
    """The attribute `name` of object v where reading it runs no code of v's own beyond a property: its
    instance dict, an nn.Module's parameters, buffers and submodules (kept outside that dict), a slot, or a
    property; _ABSENT for methods and anything else."""
    own = getattr(v, "__dict__", {})
    if name in own:
        return own[name]
    for store in ("_parameters", "_buffers", "_modules"):
        if isinstance(own.get(store), dict) and name in own[store]:
            return own[store][name]
    static = inspect.getattr_static(type(v), name, _ABSENT)
    if static is not _ABSENT and not callable(static) and not hasattr(static, "__get__"):   # a class attribute
        return static
    if isinstance(static, (property, functools.cached_property, types.MemberDescriptorType)):
        try:
            return getattr(v, name)
        except Exception:   # a property that fails here fails in the callable too, where it says why
            return _ABSENT
    return _ABSENT


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # a cell not yet assigned
        return False
    return True
