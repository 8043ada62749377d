"""A FlexAttention-compatible front end: score_mod / mask_mod callables traced into a spec, optimized through the
e-graph, compiled once and cached.

    from neptune_eqsat import flex_attention
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + bias[h], mask_mod=causal)

The callables run once on symbolic values: `score` is the scaled dot product, `b, h, q_idx, kv_idx` are the
batch, query-head, query and key indices (0-based positions in the query and key tensors, as in
FlexAttention). Tensors they capture and index (`bias[h]`, `doc_id[q_idx]`) become inputs of the kernel, so new
values do not recompile. The resulting spec is the plain attention math with the score modified and masked
elements at -inf; the compiler finds the fused plan (rolled for prefill, split-K for decode).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import math
import os
import sys
import tempfile
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from . import aten_trace, bounds, ir, spec as S
from .spec import Spec, SpecError

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # no GPU: Triton can only interpret here, and it fixes that choice when it is first imported
    os.environ["TRITON_INTERPRET"] = "1"

DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
DECODE_ROWS = 16   # query lengths up to this are priced as decode (split-K), longer ones as prefill


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
            self.spec.input(name, DTYPES.get(t.dtype, "f32"), *(int(n) for n in t.shape),
                            source=f"the tensor of shape {tuple(t.shape)} that {self.fn_name} captures")
        tensor = self.spec.inputs[name]
        # indices come as `i + 0`: an index may be an axis whose extent is a run-time size, and the tensor's
        # extent is fixed, so it is read at a computed index (checked at run time, bounds.py)
        return tensor[tuple(index)] if index else S.Expr(ir.load(name))

    def error(self, what: str, line: str = "") -> TraceError:
        return TraceError(f"{self.fn_name}{' (' + line + ')' if line else ''}: {what}")


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
        if not isinstance(s, S.Expr):
            s = S._wrap(float(s)) + 0 * S.sum(d, q[b, h, i, d] * k[b, hk, j, d])
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
    spec.name = "flex_" + hashlib.sha256(_problem_text(spec, problem).encode()).hexdigest()[:12]
    return spec, tr.captures


# ---- compiled kernels, cached in memory and on disk -------------------------------------------------------------
_MEMORY: dict[tuple, ModuleType] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("NEPTUNE_EQSAT_CACHE", Path(tempfile.gettempdir()) / "neptune_eqsat_cache"))


def _store(source: str, key: str) -> Path:
    """The module's source in the disk cache, written atomically: processes sharing the cache see the old file
    or the new one."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"flex_{key}.py"
    if not path.exists() or path.read_text() != source:
        tmp = folder / f".flex_{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(source)
        tmp.replace(path)
    return path


def cached_source(key: str, spec: Spec, spec_file: str = "flex_attention") -> Path:
    """The generated module of a traced spec in the disk cache, optimized now if it is not there yet; not
    imported (a machine without a GPU can fill the cache for one with). `spec_file` names where the spec came
    from in the module's header."""
    path = cache_dir() / f"flex_{key}.py"
    if not path.exists():
        from .compiler import optimize
        _store(optimize(spec, spec_file=spec_file, out_file=path.name).source, key)
    return path


def _load(source: str, key: str, interpret: bool) -> ModuleType:
    """Import a generated module; kernels are interpreted (CPU tensors) when `interpret` is set."""
    import importlib.util
    path = _store(source, key)
    name = f"neptune_flex_{key}_{'interpreted' if interpret else 'compiled'}"
    with _triton_interpret(interpret):   # Triton decides interpreted or compiled when a kernel is defined
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@functools.lru_cache(maxsize=None)
def _compiler_fingerprint() -> str:
    """A hash of the compiler's own source: a cached kernel from another version of it is not reused."""
    import importlib.util
    here = Path(__file__).resolve().parent
    folders = [here]
    for sub in ("codegen", "rules"):   # installed as subpackages, or beside the package in a source tree
        found = importlib.util.find_spec(f"neptune_eqsat.{sub}")
        folders.append(Path(list(found.submodule_search_locations)[0]) if found else here.parent / sub)
    h = hashlib.sha256()
    for folder in folders:
        for f in sorted(folder.glob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def plan_key(spec: Spec, problem: Problem) -> str:
    """The cache key: the traced expressions, the inputs' dtypes and shapes (as dims), the problem (dtype, head
    dims, GQA ratio, scale, decode or prefill), not the sequence lengths."""
    text = f"{_compiler_fingerprint()}|{_problem_text(spec, problem)}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _problem_text(spec: Spec, problem: Problem) -> str:
    return f"{problem}|{ir.show(spec.output_term)}|" + "|".join(
        f"{n}:{t.dtype}:{t.shape}" for n, t in spec.inputs.items())


def compiled_module(key: str, spec: Spec, interpret: bool, spec_file: str = "flex_attention") -> ModuleType:
    """The generated module for a traced spec: from memory, else from the disk cache, else optimized now."""
    mod = _MEMORY.get((key, interpret))
    if mod is not None:
        return mod
    with _LOCK:
        mod = _MEMORY.get((key, interpret))
        if mod is None:
            source = cached_source(key, spec, spec_file).read_text()
            mod = _MEMORY[(key, interpret)] = _load(source, key, interpret)
    return mod


# ---- the torch operator ---------------------------------------------------------------------------------------
# A plan names traced callables and a problem; the operator runs its kernels. Under torch.compile the plan is
# made while the model is traced (its name is a constant of the graph) and the operator is one opaque node.
_CAPTURES: dict[str, list[torch.Tensor]] = {}
_CALLABLES: dict[str, tuple] = {}   # plan -> (score_mod, mask_mod, scale, enable_gqa)
_VARIANTS: dict[tuple, _Compiled] = {}   # (plan, problem, interpreted) -> module and its index checks
_PLAN_IDS = itertools.count()
_BY_SHAPE: dict[tuple, _Compiled] = {}
_TRACED: OrderedDict = OrderedDict()   # (callables' ids, problem) -> (weak refs to the callables, plan)


def run_plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, captures: list[torch.Tensor],
             plan: str) -> torch.Tensor:
    """Run a plan on real tensors: the problem (heads, head dims, decode or prefill) is read from them here,
    at run time, so a traced model may change any of them."""
    compiled = _module_for(plan, query, key, value)
    if captures:
        captures = [_as_kernel_input(c, query.device) for c in captures]
    compiled.check_indices(query, key, captures)
    return run_kernels(query.device, lambda: compiled.module.forward(query, key, value, *captures))


def run_kernels(device: torch.device, call):
    """call(), which runs generated kernels: as it is on a GPU, under Triton's interpreter on the CPU (which
    reads the setting while it runs, too)."""
    if device.type != "cpu":
        return call()
    _check_interpreter()
    with _triton_interpret(True):
        return call()


_CONVERTED: dict[int, tuple] = {}   # id of a captured tensor -> (weak ref, version, device, converted tensor)


def _as_kernel_input(c: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A captured tensor as the kernel reads it: floats as they are, other dtypes (ids, flags) as fp32, on the
    query's device. A conversion is kept while the tensor lives unchanged (same version), so the same input
    object reaches the kernel call after call and tables built from its values can be reused."""
    if c.dtype in DTYPES and c.device == device:
        return c
    hit = _CONVERTED.get(id(c))
    if hit is not None and hit[0]() is c and hit[1] == c._version and hit[2] == device:
        return hit[3]
    out = (c if c.dtype in DTYPES else c.float()).to(device)
    if len(_CONVERTED) > 1024:
        _CONVERTED.clear()
    _CONVERTED[id(c)] = (weakref.ref(c), c._version, device, out)
    return out


class _Compiled:
    """A traced problem's module, with the checks that its reads of captured tensors stay inside them: those
    whose index reads only positions are checked once per sequence lengths, those that read a captured
    tensor's values (offsets[doc[q_idx]]) at every call. Its backward passes (one per set of inputs that need
    a gradient) are derived from the same spec when first asked for."""

    def __init__(self, module: ModuleType, spec: Spec):
        self.module, self.spec = module, spec
        self.checks = bounds.index_checks(spec, spec.output_term)
        self.lengths_checked: set[tuple[int, int, int]] = set()
        self.backwards: dict[tuple[str, ...], object] = {}

    def backward(self, wrt: tuple[str, ...]):
        if wrt not in self.backwards:
            from .training import CompiledBackward
            self.backwards[wrt] = CompiledBackward(self.spec, wrt)
        return self.backwards[wrt]

    def check_indices(self, query, key, captures) -> None:
        if not self.checks:
            return
        lengths = (query.shape[0], query.shape[2], key.shape[2])
        first_time = lengths not in self.lengths_checked
        due = [c for c in self.checks if first_time or c.reads_data]
        if not due:
            return
        sizes = dict(zip(("B", "L", "S"), lengths))
        tensors = {f"capture{k}": c for k, c in enumerate(captures)}
        for check in due:
            bad = bounds.out_of_range(self.spec, check, sizes, tensors)
            if bad is not None:
                lo, hi, n = bad
                raise IndexError(f"{self.spec.inputs[check.tensor].source} is indexed out of range: index "
                                 f"{_index_text(check.index)} in dimension {check.position} (size {n}) takes "
                                 f"values {lo:g} to {hi:g} (query length {lengths[1]}, key length {lengths[2]})")
        self.lengths_checked.add(lengths)


_FLEX_NAMES = {"b": "b", "h": "h", "i": "q_idx", "j": "kv_idx"}


def _index_text(t: ir.Term) -> str:
    """An index in the callables' own names (q_idx, kv_idx), without the tracer's `+ 0`."""
    def clean(x: ir.Term) -> ir.Term:
        if x.op == "axis":
            return ir.axis(_FLEX_NAMES.get(x.attrs[0], x.attrs[0]))
        if x.op == "bin" and x.attrs[0] == "add" and x.args[1] == ir.const(0):
            return clean(x.args[0])
        return ir.Term(x.op, x.attrs, tuple(clean(a) for a in x.args)) if x.args else x
    return ir.show(clean(t))


def _module_for(plan: str, query, key, value) -> _Compiled:
    shapes = (plan, query.shape, key.shape, value.shape, query.dtype, query.device.type)
    compiled = _BY_SHAPE.get(shapes)   # the common case: the same call again, validated before
    if compiled is None:
        compiled = _BY_SHAPE[shapes] = _resolve(plan, query, key, value)
        if len(_BY_SHAPE) > 4096:
            _BY_SHAPE.clear()
    return compiled


def _resolve(plan: str, query, key, value) -> _Compiled:
    score_mod, mask_mod, scale, enable_gqa, lse = _CALLABLES[plan]
    problem = _problem(query, key, value, scale, enable_gqa, lse)
    variant = (plan, problem, query.device.type == "cpu")
    compiled = _VARIANTS.get(variant)
    if compiled is None:
        spec = trace(score_mod, mask_mod, problem)[0]
        module = compiled_module(plan_key(spec, problem), spec, interpret=variant[2])
        compiled = _VARIANTS[variant] = _Compiled(module, spec)
    return compiled


attention_op = torch.library.custom_op("neptune_eqsat::flex_attention", run_plan, mutates_args=())


def run_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
                 grad: torch.Tensor, captures: list[torch.Tensor], plan: str, wrt: str) -> list[torch.Tensor]:
    """The gradients of the inputs named in `wrt` ("q,k,v,capture0"), by the backward kernels derived from the
    plan's spec (autodiff.py), in that order."""
    compiled = _module_for(plan, query, key, value)
    names = tuple(wrt.split(","))
    inputs = {"q": query, "k": key, "v": value}
    inputs.update({f"capture{k}": _as_kernel_input(c, query.device) for k, c in enumerate(captures)})
    grads = compiled.backward(names).grads(inputs, out, grad.contiguous())   # each kernel run by run_kernels
    return [grads[n] for n in names]


backward_op = torch.library.custom_op("neptune_eqsat::flex_attention_backward", run_backward, mutates_args=())


def _wrt_tensors(query, key, value, captures, wrt: str) -> list[torch.Tensor]:
    by_name = {"q": query, "k": key, "v": value, **{f"capture{k}": c for k, c in enumerate(captures)}}
    return [by_name[n] for n in wrt.split(",")]


@backward_op.register_fake
def _(query, key, value, out, grad, captures, plan, wrt):
    return [torch.empty_like(t) for t in _wrt_tensors(query, key, value, captures, wrt)]


def _setup_backward(ctx, inputs, output) -> None:
    query, key, value, captures, plan = inputs
    ctx.plan = plan
    ctx.wants = [t.requires_grad for t in (query, key, value)] + \
        [c.requires_grad and c.dtype in DTYPES for c in captures]
    ctx.save_for_backward(query, key, value, output, *captures)


def _backward(ctx, grad):
    query, key, value, out, *captures = ctx.saved_tensors
    names = [n for n, want in zip(["q", "k", "v"] + [f"capture{k}" for k in range(len(captures))], ctx.wants)
             if want]
    if not names:
        return None, None, None, None, None
    grads = dict(zip(names, backward_op(query, key, value, out, grad, captures, ctx.plan, ",".join(names))))
    return (grads.get("q"), grads.get("k"), grads.get("v"),
            [grads.get(f"capture{k}") for k in range(len(captures))], None)


attention_op.register_autograd(_backward, setup_context=_setup_backward)


@attention_op.register_fake
def _(query, key, value, captures, plan):
    if plan.endswith(":lse"):
        return query.new_empty(*query.shape[:3], dtype=torch.float32)
    return query.new_empty(*query.shape[:3], value.shape[-1])


_VALUES = (int, float, bool, complex, str, bytes, type(None))
_OPAQUE = (ModuleType, type, torch.dtype, torch.device)


def reads(fn) -> tuple:
    """What a callable reads besides its arguments and could change between calls: Python numbers and strings
    by value, tensors by identity, found in its closure, the globals and attributes it names, its defaults, and
    the same of the functions it reaches through them (helpers, and_masks' list of masks). The trace bakes
    numbers into the kernel and binds tensors as inputs, so a call whose reads differ is traced again."""
    out: list = []
    _reads_of(fn, out, set(), frozenset(), 0)
    return tuple(out)


def _code_names(code) -> frozenset:
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):   # a nested function or lambda: what it names is read when it runs
            names |= _code_names(c)
    return frozenset(names)


def _reads_of(v, out: list, seen: set, names: frozenset, depth: int) -> None:
    if isinstance(v, _VALUES):
        out.append(repr(v))
        return
    if isinstance(v, torch.Tensor):
        out.append(("tensor", id(v)))
        return
    if depth > 6 or id(v) in seen or isinstance(v, _OPAQUE):
        return
    seen.add(id(v))
    if isinstance(v, functools.partial):
        parts = [v.func, *v.args, *v.keywords.values()]
    elif isinstance(v, (list, tuple, set, frozenset)):
        parts = list(v)[:64]
    elif isinstance(v, dict):
        parts = list(v.values())[:64]
    elif hasattr(v, "__func__") and hasattr(v, "__self__"):   # a bound method
        parts = [v.__func__, v.__self__]
    elif hasattr(v, "__code__") and hasattr(v, "__globals__"):   # a Python function
        names = _code_names(v.__code__)
        cells = [c.cell_contents for c in v.__closure__ or () if _filled(c)]
        parts = cells + [v.__globals__[n] for n in sorted(names) if n in v.__globals__]
        parts += list(v.__defaults__ or ()) + list((v.__kwdefaults__ or {}).values())
    elif callable(v) and not hasattr(v, "__dict__"):   # a builtin
        return
    else:   # an object: the attributes of it that the code names (self.scale, cfg.window)
        parts = [getattr(v, n) for n in sorted(names) if n in getattr(v, "__dict__", {})]
        call = getattr(type(v), "__call__", None)
        if call is not None and hasattr(call, "__code__"):
            parts.append(call)
    for p in parts:
        _reads_of(p, out, seen, names, depth + 1)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # a cell not yet assigned
        return False
    return True


def _ref(fn):
    try:
        return weakref.ref(fn)
    except TypeError:   # None, or a callable that takes no weak references: keep it alive
        return lambda: fn


# a stand-in problem for finding what the callables capture (the captures do not depend on the shapes)
_PROBE = Problem("f16", 2, 1, 16, 16, 0.25)


@torch._dynamo.assume_constant_result
def _plan(score_mod, mask_mod, scale, enable_gqa, lse=False) -> str:
    """The plan's name for these callables. Under torch.compile this runs while the model is traced and its
    result is a constant, so it takes no shapes (they may be dynamic there); it traces the callables once to
    find the tensors they capture."""
    memo = (id(score_mod), id(mask_mod), scale, enable_gqa, lse, reads(score_mod), reads(mask_mod))
    hit = _TRACED.get(memo)
    if hit is not None and hit[0][0]() is score_mod and hit[0][1]() is mask_mod:
        _TRACED.move_to_end(memo)
        return hit[1]
    probe = dataclasses.replace(_PROBE, lse=lse)
    spec, captures = trace(score_mod, mask_mod, probe)
    # one per callables (their own captures); ":lse" tells the operator's fake output from the attention's
    name = f"{plan_key(spec, probe)}:{scale}:{enable_gqa}:{next(_PLAN_IDS)}" + (":lse" if lse else "")
    _CAPTURES[name], _CALLABLES[name] = captures, (score_mod, mask_mod, scale, enable_gqa, lse)
    _TRACED[memo] = ((_ref(score_mod), _ref(mask_mod)), name)
    if len(_TRACED) > 256:
        _TRACED.popitem(last=False)
    return name


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None, block_mask=None,
                   scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options: dict | None = None, *, mask_mod=None):
    """torch.nn.attention.flex_attention's signature and semantics: softmax(score_mod(q k^T * scale)) v over the
    keys the mask keeps; a query that keeps no key gets 0. q [B, Hq, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv];
    Hq != Hkv needs enable_gqa. The mask comes from `block_mask` (create_block_mask's BlockMask: its mask_mod
    and sequence lengths are used, the block table is derived again) or from `mask_mod` directly. With
    return_lse, also the row logsumexp of the scores [B, Hq, L] (fp32, natural log, -inf for empty rows).
    kernel_options are FlexAttention's tuning knobs: accepted and ignored."""
    if block_mask is not None:
        if mask_mod is not None:
            raise ValueError("pass either block_mask or mask_mod, not both")
        mask_mod = _mask_of(block_mask, query, key)
    if kernel_options:
        _warn_once("kernel_options", f"flex_attention: kernel_options {sorted(kernel_options)} are FlexAttention's "
                   "tuning knobs and are ignored here (configs come from the module's CONFIG and tuning)")
    args = (None if scale is None else float(scale), bool(enable_gqa))
    out = _run(query, key, value, _plan(score_mod, mask_mod, *args))
    if return_lse:
        return out, _run(query, key, value, _plan(score_mod, mask_mod, *args, True))
    return out


def _run(query, key, value, plan):
    captures = _CAPTURES[plan]
    if torch.compiler.is_compiling() or _needs_grad(query, key, value, captures):
        return attention_op(query, key, value, captures, plan)   # one opaque node; differentiable
    return run_plan(query, key, value, captures, plan)   # eager: skip the operator's dispatch cost


def _needs_grad(query, key, value, captures) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, *captures))


def _mask_of(block_mask, query, key):
    """The mask_mod of a BlockMask, checked against the call's lengths as FlexAttention does; a plain callable
    passed in block_mask's place is taken as the mask_mod."""
    if callable(block_mask) and not hasattr(block_mask, "seq_lengths"):
        return block_mask
    lengths = tuple(int(n) for n in block_mask.seq_lengths)
    if lengths != (query.shape[-2], key.shape[-2]):
        raise ValueError(f"block_mask was created for query and key lengths {lengths}, but the query has "
                         f"{query.shape[-2]} and the key {key.shape[-2]}: create the block mask for these lengths")
    return block_mask.mask_mod


_WARNED: set[str] = set()


def _warn_once(topic: str, message: str) -> None:
    if topic not in _WARNED:
        _WARNED.add(topic)
        warnings.warn(message, stacklevel=3)


def _problem(query, key, value, scale, enable_gqa, lse=False) -> Problem:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions [B, H, L, D], got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} is not supported (float16, bfloat16, float32)")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"query has {hq} heads and key {hkv}: pass enable_gqa=True for grouped-query attention")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    d = query.shape[-1]
    return Problem(DTYPES[query.dtype], hq, hkv, d, value.shape[-1], scale if scale is not None else 1.0 / math.sqrt(d),
                   query.shape[2] <= DECODE_ROWS, lse)


def _check_interpreter() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.standard.max, InterpretedFunction):
        raise RuntimeError("CPU tensors run the kernels under Triton's interpreter, which Triton enables only when "
                           "TRITON_INTERPRET=1 is set before it is first imported; set it before importing torch "
                           "or triton")


@contextlib.contextmanager
def _triton_interpret(on: bool):
    """TRITON_INTERPRET set to `on` for the duration, then restored."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


__all__ = ["flex_attention", "trace", "Problem", "TraceError", "cache_dir"]
