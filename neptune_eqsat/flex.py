"""The FlexAttention-compatible API: score_mod / mask_mod callables traced into a spec (frontend/flex_trace.py),
optimized through the e-graph, compiled once and cached, run as one torch operator (with its backward).

    from neptune_eqsat import flex_attention
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + bias[h], mask_mod=causal)

The compiler is imported on a miss of the module cache, and the backward's machinery when a gradient is first
asked for: a machine whose cache another filled runs the forward with torch and triton alone.
"""
from __future__ import annotations

import math
import warnings
import weakref
from types import ModuleType

import torch

from neptune_eqsat.compiled import cache_dir, compiled_module, refuse_second_order, run_kernels
from neptune_eqsat.frontend import bounds
from neptune_eqsat.frontend.flex_trace import CAPTURE_DTYPES, DTYPES, Problem, TraceError, index_text, trace
from neptune_eqsat.frontend.spec import Spec
from neptune_eqsat.flex_plans import BOUND_TO_PLANS, callables_of, captures_of, check_reads, make_plan, plan_key

DECODE_ROWS = 16   # query lengths up to this are priced as decode (split-K), longer ones as prefill


# ---- compiled kernels, cached in memory and on disk -------------------------------------------------------------
_VARIANTS: dict[tuple, _Compiled] = {}   # (plan, problem, interpreted) -> module and its index checks
_BY_SHAPE: dict[tuple, _Compiled] = {}
BOUND_TO_PLANS += [_VARIANTS, _BY_SHAPE]
_plan = make_plan   # (the name tests and tools use)


def run_plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, captures: list[torch.Tensor],
             plan: str) -> torch.Tensor:
    """Run a plan on real tensors: the problem (heads, head dims, decode or prefill) is read from them here,
    at run time, so a traced model may change any of them. As the operator (a compiled graph's node), the
    callables' reads are checked against the plan's first."""
    check_reads(plan)
    return _run_plan(query, key, value, captures, plan)


def _run_plan(query, key, value, captures, plan):
    compiled = _module_for(plan, query, key, value)
    if captures:
        captures = [_as_kernel_input(c, query.device) for c in captures]
    compiled.check_indices(query, key, captures)
    return run_kernels(query.device, lambda: compiled.module.forward(query, key, value, *captures))


_CONVERTED: dict[int, tuple] = {}   # id of a captured tensor -> (weak ref, version, device, converted tensor)


def _as_kernel_input(c: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A captured tensor as the kernel reads it, on the query's device: fp16, bf16, fp32, integers and bools as
    stored (CAPTURE_DTYPES), other dtypes as fp32. A conversion is kept while the tensor lives unchanged (same
    version), so the same input object reaches the kernel call after call and tables built from its values can
    be reused."""
    if c.dtype in CAPTURE_DTYPES and c.device == device:
        return c
    if c.is_inference():   # no version counter to tell a write: converted at every call
        return (c if c.dtype in CAPTURE_DTYPES else c.float()).to(device)
    hit = _CONVERTED.get(id(c))
    if hit is not None and hit[0]() is c and hit[1] == c._version and hit[2] == device:
        return hit[3]
    out = (c if c.dtype in CAPTURE_DTYPES else c.float()).to(device)
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
        self.backwards: dict[tuple, object] = {}   # (inputs, device, deterministic) -> its backward

    def backward(self, wrt: tuple[str, ...], device: torch.device):
        """The backward kernels for the inputs `wrt` on `device` (one pass or two: training.backward_for_device)."""
        from neptune_eqsat.training import device_backward   # the compiler's side: only for gradients
        return device_backward(self.backwards, self.spec, wrt, device)

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
                                 f"{index_text(check.index)} in dimension {check.position} (size {n}) takes "
                                 f"values {lo:g} to {hi:g} (query length {lengths[1]}, key length {lengths[2]})")
        self.lengths_checked.add(lengths)


def _module_for(plan: str, query, key, value) -> _Compiled:
    shapes = (plan, query.shape, key.shape, value.shape, query.dtype, query.device.type)
    compiled = _BY_SHAPE.get(shapes)   # the common case: the same call again, validated before
    if compiled is None:
        compiled = _BY_SHAPE[shapes] = _resolve(plan, query, key, value)
        if len(_BY_SHAPE) > 4096:
            _BY_SHAPE.clear()
    return compiled


def _resolve(plan: str, query, key, value) -> _Compiled:
    score_mod, mask_mod, scale, enable_gqa, lse = callables_of(plan)
    problem = _problem(query, key, value, scale, enable_gqa, lse)
    variant = (plan, problem, query.device.type == "cpu")
    compiled = _VARIANTS.get(variant)
    if compiled is None:
        spec = trace(score_mod, mask_mod, problem)[0]
        module = compiled_module(plan_key(spec, problem), spec, interpret=variant[2])
        compiled = _VARIANTS[variant] = _Compiled(module, spec)
    return compiled


attention_op = torch.library.custom_op("neptune_eqsat::flex_attention", run_plan, mutates_args=())


def run_train_plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, captures: list[torch.Tensor],
                   plan: str) -> list[torch.Tensor]:
    """run_plan for a training step: the output, then the values its backward reads (a row max, a row sum),
    written by the same forward kernel (training.forward_outputs). As the operator, the reads checked first."""
    check_reads(plan)
    return _run_train_plan(query, key, value, captures, plan)


def _run_train_plan(query, key, value, captures, plan):
    from neptune_eqsat.training import forward_outputs   # the compiler's side: only for gradients
    compiled = _module_for(plan, query, key, value)
    inputs = _named_inputs(query, key, value, captures)
    compiled.check_indices(query, key, [inputs[f"capture{k}"] for k in range(len(captures))])
    out, saved = forward_outputs(compiled.spec, inputs)
    return [out, *saved]


def _named_inputs(query, key, value, captures) -> dict[str, torch.Tensor]:
    inputs = {"q": query, "k": key, "v": value}
    inputs.update({f"capture{k}": _as_kernel_input(c, query.device) for k, c in enumerate(captures)})
    return inputs


train_op = torch.library.custom_op("neptune_eqsat::flex_attention_train", run_train_plan, mutates_args=())


def run_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
                 grad: torch.Tensor, captures: list[torch.Tensor], saved: list[torch.Tensor], plan: str,
                 wrt: str) -> list[torch.Tensor]:
    """The gradients of the inputs named in `wrt` ("q,k,v,capture0"), by the backward kernels derived from the
    plan's spec (autodiff.py), in that order; `saved`: what the training forward wrote beside the output (none
    after a forward without it: the backward computes them)."""
    from neptune_eqsat.training import saved_terms
    compiled = _module_for(plan, query, key, value)
    names = tuple(wrt.split(","))
    by_term = dict(zip(saved_terms(compiled.spec), saved)) if saved else {}
    backward = compiled.backward(names, query.device)
    grads = backward.grads(_named_inputs(query, key, value, captures), out, grad.contiguous(),
                           by_term)   # each kernel run by run_kernels
    # a capture the kernels read converted (float64 read as fp32) gets its gradient in its own dtype and place
    # (contiguous, as the operator's fake says, whatever the inputs' layout)
    return [(g if g.dtype == t.dtype and g.device == t.device else g.to(device=t.device, dtype=t.dtype)).contiguous()
            for g, t in zip((grads[n] for n in names), _wrt_tensors(query, key, value, captures, wrt))]


backward_op = torch.library.custom_op("neptune_eqsat::flex_attention_backward", run_backward, mutates_args=())


def _wrt_tensors(query, key, value, captures, wrt: str) -> list[torch.Tensor]:
    by_name = {"q": query, "k": key, "v": value, **{f"capture{k}": c for k, c in enumerate(captures)}}
    return [by_name[n] for n in wrt.split(",")]


@backward_op.register_fake
def _(query, key, value, out, grad, captures, saved, plan, wrt):
    wrt_tensors = _wrt_tensors(query, key, value, captures, wrt)
    return [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in wrt_tensors]


def _setup_backward(ctx, inputs, output) -> None:
    query, key, value, captures, plan = inputs
    ctx.plan, ctx.callables = plan, callables_of(plan)[:2]   # (alive until the backward has run)
    ctx.wants = [t.requires_grad for t in (query, key, value)] + \
        [c.requires_grad and c.is_floating_point() for c in captures]
    out, saved = (output[0], output[1:]) if isinstance(output, (list, tuple)) else (output, [])
    ctx.saved_count = len(saved)
    ctx.save_for_backward(query, key, value, out, *saved, *captures)


def _backward(ctx, grad, run=backward_op):
    """The gradients of a call's inputs, by `run` (the backward operator, or run_backward itself in eager mode):
    (query, key, value, [captures], None)."""
    refuse_second_order("flex_attention")
    if isinstance(grad, (list, tuple)):   # the training operator's: only its output carries a gradient
        grad = grad[0]
    kept = ctx.saved_tensors   # once: activation checkpointing lets each saved tensor be unpacked once
    query, key, value, out = kept[:4]
    saved = list(kept[4:4 + ctx.saved_count])
    captures = list(kept[4 + ctx.saved_count:])
    names = [n for n, want in zip(["q", "k", "v"] + [f"capture{k}" for k in range(len(captures))], ctx.wants)
             if want]
    if not names or grad is None:
        return None, None, None, [None] * len(captures), None
    grads = dict(zip(names, run(query, key, value, out, grad, captures, saved, ctx.plan, ",".join(names))))
    return (grads.get("q"), grads.get("k"), grads.get("v"),
            [grads.get(f"capture{k}") for k in range(len(captures))], None)


attention_op.register_autograd(_backward, setup_context=_setup_backward)
train_op.register_autograd(_backward, setup_context=_setup_backward)


class _EagerTraining(torch.autograd.Function):
    """train_op and its backward for an eager training step, without the custom operators' dispatch: their
    wrappers (argument flattening, the autograd and dynamo-disabled layers) cost about as much host time as
    the rest of a call's Python. torch.compile traces the operators instead (_run)."""

    @staticmethod
    def forward(ctx, query, key, value, plan, *captures):
        captures = list(captures)
        out, *saved = _run_train_plan(query, key, value, captures, plan)   # (its plan made just before)
        _setup_backward(ctx, (query, key, value, captures, plan), [out, *saved])
        return out

    @staticmethod
    def backward(ctx, grad):
        gq, gk, gv, gcaptures, _ = _backward(ctx, grad, run=run_backward)
        return gq, gk, gv, None, *gcaptures


@train_op.register_fake
def _(query, key, value, captures, plan):
    from neptune_eqsat.training import saved_terms
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    score_mod, mask_mod, scale, enable_gqa, lse = callables_of(plan)
    with unset_fake_temporarily():   # the callables read their real captured tensors while they are traced
        # under dynamic shapes a size is symbolic: the problem takes the traced example's (how many values the
        # forward saves does not hang on the sizes)
        shaped = [torch.empty([_size_hint(n) for n in t.shape], dtype=t.dtype, device="meta")
                  for t in (query, key, value)]
        spec = trace(score_mod, mask_mod, _problem(*shaped, scale, enable_gqa, lse))[0]
    rows = query.shape[:3]
    return [query.new_empty(*rows, value.shape[-1])] + \
        [query.new_empty(*rows, dtype=torch.float32) for _ in saved_terms(spec)]


def _size_hint(n) -> int:
    """A size as an int: a symbolic one's value in the example traced, read without adding a guard."""
    if isinstance(n, int):
        return n
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:   # an older torch: the size is read with a guard (compiled as that constant)
        return int(n)
    return int(optimization_hint(n))


@attention_op.register_fake
def _(query, key, value, captures, plan):
    if plan.endswith(":lse"):
        return query.new_empty(*query.shape[:3], dtype=torch.float32)
    return query.new_empty(*query.shape[:3], value.shape[-1])


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None, block_mask=None,
                   scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options: dict | None = None, *, mask_mod=None, return_aux=None):
    """torch.nn.attention.flex_attention's signature and semantics: softmax(score_mod(q k^T * scale)) v over the
    keys the mask keeps; a query that keeps no key gets 0. q [B, Hq, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv];
    Hq != Hkv needs enable_gqa. The mask comes from `block_mask` (create_block_mask's BlockMask: its mask_mod
    and sequence lengths are used, the block table is derived again) or from `mask_mod` directly. With
    return_lse, also the row logsumexp of the scores [B, Hq, L] (fp32, natural log, -inf for empty rows).
    kernel_options are FlexAttention's tuning knobs: accepted and ignored. return_aux=AuxRequest(lse=True)
    returns (out, AuxOutput(lse=...)), torch's newer form of return_lse; under autocast the inputs take its dtype."""
    if query.device.type not in ("cpu", "cuda"):
        raise ValueError(f"flex_attention runs on CPU and CUDA tensors; query is on {query.device}")
    if torch.is_autocast_enabled(query.device.type):   # as torch's flex_attention: in the autocast dtype
        low = torch.get_autocast_dtype(query.device.type)
        query, key, value = (x.to(low) if x.is_floating_point() else x for x in (query, key, value))
    if query.dim() == key.dim() == value.dim() == 4 and query.shape[0] > 1 and key.shape[0] == value.shape[0] == 1:
        # one key/value batch for every query batch (a shared prefix cache): broadcast, as torch's does
        key, value = (x.expand(query.shape[0], *x.shape[1:]) for x in (key, value))
    if return_aux is not None:
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("flex_attention: return_aux max_scores is not computed here (lse is)")
        if return_lse:
            raise ValueError("flex_attention: pass return_lse or return_aux, not both")
        from torch.nn.attention.flex_attention import AuxOutput
        wants = bool(getattr(return_aux, "lse", False))
        result = flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, wants, kernel_options,
                                mask_mod=mask_mod)
        return (result[0], AuxOutput(lse=result[1])) if wants else (result, AuxOutput())
    if block_mask is not None:
        if mask_mod is not None:
            raise ValueError("pass either block_mask or mask_mod, not both")
        mask_mod = _mask_of(block_mask, query, key)
    if kernel_options:
        _warn_once("kernel_options", f"flex_attention: kernel_options {sorted(kernel_options)} are FlexAttention's "
                   "tuning knobs and are ignored here (configs come from the module's CONFIG and tuning)")
    args = (None if scale is None else float(scale), bool(enable_gqa))
    out = _run(query, key, value, make_plan(score_mod, mask_mod, *args))
    if query.dim() == 4 and query.stride(1) < query.stride(2) and out.shape[2] > 1:
        # query held as [B, L, H, D] (a model's projection, transposed): the output in that layout too, as
        # torch's flex_attention gives it (out.transpose(1, 2).view(B, L, H * D) then works)
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
    if return_lse:
        return out, _run(query, key, value, make_plan(score_mod, mask_mod, *args, True))
    return out


def _run(query, key, value, plan):
    captures = captures_of(plan)
    if _needs_grad(query, key, value, captures) and not plan.endswith(":lse"):
        # the forward writes what the backward reads
        if torch.compiler.is_compiling():
            return train_op(query, key, value, captures, plan)[0]
        return _EagerTraining.apply(query, key, value, plan, *captures)
    if torch.compiler.is_compiling() or _needs_grad(query, key, value, captures):
        return attention_op(query, key, value, captures, plan)   # one opaque node; differentiable
    return _run_plan(query, key, value, captures, plan)   # eager: skip the operator's dispatch cost


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
    if getattr(block_mask.mask_mod, "__name__", "") == "noop_mask" and not torch.compiler.is_compiling() \
            and not bool(_every_block(block_mask)):   # (a warning read from the tables: eager calls alone)
        _warn_once("block_tables", "flex_attention: this BlockMask has no mask_mod (made from block tables, as "
                   "from_kv_blocks makes it): the kernels derive their blocks from a mask_mod, so every key is kept, "
                   "as torch's eager flex_attention keeps them; pass the mask as a mask_mod to skip blocks")
    return block_mask.mask_mod


def _every_block(block_mask):
    """Does the block table keep every block (a mask of no blocks skipped)?"""
    kv, full = block_mask.kv_num_blocks, block_mask.full_kv_num_blocks
    blocks = -(-int(block_mask.seq_lengths[1]) // int(block_mask.BLOCK_SIZE[1]))
    return ((kv + (full if full is not None else 0)) >= blocks).all()


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


__all__ = ["flex_attention", "trace", "Problem", "TraceError", "cache_dir"]
