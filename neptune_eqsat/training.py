"""The backward pass at run time: the specs `autodiff.differentiate` derives, compiled by the same compiler, run
in order (stages, then gradient kernels), with the host's part (sums over extra axes, scatters at computed
indices) done in torch.

    fn = Differentiable(load_spec("specs/softmax.py"))
    y = fn(x)                     # the forward kernel; y.backward(...) runs the derived backward kernels

Modules are generated once per spec and cached on disk beside the FlexAttention front end's (same key scheme:
the compiler's own source, the spec's terms, its inputs' dtypes and shapes).
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import lru_cache
from types import ModuleType

import torch

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.compiled import compiled_module, compiler_fingerprint, refuse_second_order, run_kernels
from neptune_eqsat.plan.autodiff import Backward, GradPart, differentiate
from neptune_eqsat.frontend.reference import Evaluator, _align, bind_sizes
from neptune_eqsat.runtime.scatter import scatter_add
from neptune_eqsat.frontend.spec import Spec, SpecError

TORCH = {d: getattr(torch, name) for d, name in ir.TORCH_NAMES.items()}


@lru_cache(maxsize=4096)
def _shown(term: Term) -> str:
    """ir.show of a term, kept: a key is asked for at every run of a spec (terms are immutable)."""
    return ir.show(term)


def spec_key(spec: Spec) -> str:
    text = "|".join([compiler_fingerprint(), spec.name, _shown(spec.root_term), ",".join(spec.output_axes),
                     spec.output_dtype or "", *(f"{o.name}:{o.dtype}:{','.join(o.axes)}" for o in spec.also),
                     *(f"{n}:{t.dtype}:{t.shape}" for n, t in spec.inputs.items()),
                     *(f"{a}:{e}" for a, e in spec.axes_.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def module_for(spec: Spec, interpret: bool) -> ModuleType:
    """The generated module of `spec`: from memory, else the disk cache, else optimized now (the FlexAttention
    front end's cache, keyed by the spec itself). The key of a spec object is hashed once: a backward runs its
    specs at every call, where hashing their terms cost 0.15 ms a call (S = 4096 on an H100: 20% of the
    kernels' time)."""
    return compiled_module(_key_of(spec), spec, interpret, spec_file=spec.name)


def _key_of(spec: Spec) -> str:
    """spec_key(spec), hashed once per spec object."""
    hit = _KEYS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        hit = _KEYS[id(spec)] = (spec, spec_key(spec))
    return hit[1]


_KEYS: dict[int, tuple[Spec, str]] = {}   # id of a spec -> the spec (kept, so the id stays its own), its key


def run_spec(spec: Spec, tensors: dict[str, torch.Tensor]):
    """Run `spec`'s kernel on the named tensors (each converted to the dtype the spec declares): its output, or
    a tuple of its outputs where it has several."""
    device = next(iter(tensors.values())).device
    args = [tensors[n].to(TORCH[t.dtype]).contiguous() for n, t in spec.inputs.items()]
    mod = module_for(spec, device.type == "cpu")
    return run_kernels(device, lambda: mod.forward(*args))


class CompiledBackward:
    """The backward of one spec: `grads(inputs, out, grad_out)` gives the gradient of every input in `wrt`."""

    def __init__(self, spec: Spec, wrt: tuple[str, ...] | None = None, accumulate: bool = False):
        self.spec = spec
        self.plan: Backward = differentiate(spec, wrt, accumulate)
        self._saved_at: dict[tuple, tuple] = {}
        self._stages: dict[frozenset, list] = {}   # the tensors at hand -> the stages to run (kept: asked every call)

    def saved_values(self, saved: dict[Term, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The backward's saved stages among the forward's further outputs (keyed by their terms). Which of the
        terms are the plan's is found once per set of term objects: equal terms that are other objects compare
        node by node (7500 comparisons, 0.35 ms a call of a causal backward)."""
        terms = tuple(saved)
        found = self._saved_at.get(tuple(map(id, terms)))
        if found is None:
            at = [(name, terms.index(t)) for name, t in self.plan.saved.items() if t in saved]
            found = self._saved_at[tuple(map(id, terms))] = (terms, at)   # (the terms kept: their ids stay theirs)
        values = list(saved.values())
        return {name: values[k] for name, k in found[1]}

    def grads(self, inputs: dict[str, torch.Tensor], out: torch.Tensor, grad_out: torch.Tensor,
              saved: dict[Term, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """`saved`: values the forward kernel wrote beside its output (forward_outputs), by term; the stages
        that compute them are skipped."""
        bw, spec = self.plan, self.spec
        tensors = dict(inputs)
        tensors[bw.grad_name] = grad_out
        tensors[bw.out_name] = out
        tensors.update(self.saved_values(saved or {}))
        provided = frozenset(tensors)
        stages = self._stages.get(provided)
        if stages is None:
            stages = self._stages[provided] = bw.stages_to_run(provided)
        for stage in stages:
            tensors[stage.name] = run_spec(stage.spec, tensors)
        sizes = None   # bound when a part is scattered on the host
        result: dict[str, torch.Tensor] = {}
        for kernel in bw.kernels:
            gs = run_spec(kernel.spec, tensors)
            for part, g in zip(kernel.parts, gs if len(kernel.parts) > 1 else (gs,)):
                x = inputs[part.input]
                if part.as_is:
                    result[part.input] = g   # the input's only part, in its dtype (autodiff._in_input_dtype)
                    continue
                if part.sole and part.groups is not None:
                    # its whole gradient: a sum over groups rounds once from its fp32 accumulator, as a
                    # buffer's cast would, without the buffer
                    result[part.input] = _summed(part, g).expand(x.shape).contiguous()
                    continue
                acc = result.get(part.input)
                if acc is None:
                    acc = result[part.input] = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
                sizes = sizes or bind_sizes(spec, inputs)
                _accumulate(spec, part, g, acc, sizes, inputs)
        for n in bw.wrt:
            x = inputs[n]
            result[n] = result[n].to(x.dtype) if n in result else torch.zeros_like(x)
        return result


def _accumulate(spec: Spec, part: GradPart, g: torch.Tensor, acc: torch.Tensor, sizes: dict[str, int],
                inputs: dict[str, torch.Tensor]) -> None:
    """acc[index] += g summed over the host axes, with repeated indices adding up (an index a where guards, out
    of acc, adds 0: scatter_add)."""
    if part.groups is not None:   # plain axes, and key heads h // G: sums over groups, no scatter
        acc += _summed(part, g)
        return
    g = _host_summed(part, g)
    read = {t.attrs[0] for x in part.index for t in ir.walk(x) if t.op == "load"}
    ev = Evaluator(spec, {n: inputs[n] for n in read}, sizes=sizes, device=acc.device)
    index = []
    for x in part.index:
        value = ev(x)
        if not value[1]:   # a constant index
            index.append(value[0].long().reshape([1] * len(part.axes)))
        else:
            index.append(_align(value, part.axes).long())
    scatter_add(acc, index, g)


def _host_summed(part: GradPart, g: torch.Tensor) -> torch.Tensor:
    """g summed over the host axes, with size 1 along the index's axes the gradient does not vary along."""
    axes = part.spec.output_axes
    present = axes[:len(axes) - len(part.host_sum)]
    if part.host_sum:
        g = g.sum(dim=tuple(range(len(present), len(axes))))
    return _align((g, present), part.axes)


def _summed(part: GradPart, g: torch.Tensor) -> torch.Tensor:
    """A part of plain axes and key heads h // G: g summed over the host axes and over its groups."""
    g = _host_summed(part, g)
    for k, c in part.groups:
        g = g.unflatten(k, (-1, c)).sum(k + 1) if g.shape[k] > 1 else g * c   # c equal terms
    return g


class _SpecFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner: "Differentiable", *xs):
        names = list(owner.spec.inputs)
        inputs = dict(zip(names, xs))
        if any(ctx.needs_input_grad[1:]):   # a training step: the forward kernel also writes the saved values
            outs, extras = forward_outputs(owner.spec, inputs)
        else:
            outs, extras = run_spec(owner.spec, inputs), []
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        ctx.owner, ctx.names, ctx.outputs = owner, names, len(outs)
        ctx.set_materialize_grads(False)   # an output the loss does not read sends None: its backward is skipped
        ctx.save_for_backward(*xs, *outs, *extras)
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grad_outs):
        refuse_second_order(f"spec {ctx.owner.spec.name}")
        n, k = len(ctx.names), ctx.outputs
        kept = ctx.saved_tensors   # once: activation checkpointing lets each saved tensor be unpacked once
        xs, outs, extras = kept[:n], kept[n:n + k], kept[n + k:]
        owner, names = ctx.owner, ctx.names
        wrt = tuple(n for n, x, need in zip(names, xs, ctx.needs_input_grad[1:]) if need)
        if not wrt or all(g is None for g in grad_outs):
            return (None,) * (1 + len(xs))
        inputs, total = dict(zip(names, xs)), {}
        for which, (out, grad_out) in enumerate(zip(outs, grad_outs)):   # each output's backward, added up
            if grad_out is None:
                continue
            saved = dict(zip(saved_terms(owner.spec), extras)) if which == 0 else None
            grads = owner.backward_for(wrt, grad_out.device, which).grads(inputs, out, grad_out.contiguous(), saved)
            for name, g in grads.items():
                total[name] = g if name not in total else total[name] + g
        return (None, *(total.get(n) for n in names))


_DERIVED: dict[str, tuple[Backward, Spec]] = {}   # spec key -> its derivation for every floating input (the
                                                    # saved values) and the forward that writes them too
_STAGED: set[str] = set()              # specs whose forward kernel cannot write the saved values too


def _derivation(spec: Spec) -> Backward:
    return _derived(spec)[0]


def _derived(spec: Spec) -> tuple[Backward, Spec]:
    """The derivation of `spec` and its forward_spec, made once per spec: a training step asks for them at every
    forward and backward call, and a forward_spec made again would be a new spec object to hash."""
    key = _key_of(spec)
    if key not in _DERIVED:
        bw = differentiate(spec)
        _DERIVED[key] = (bw, bw.forward_spec())
    return _DERIVED[key]


def saved_terms(spec: Spec) -> list[Term]:
    """The values a training step's forward gives its backward (a row max, a row sum), as forward terms, in the
    order forward_outputs returns them."""
    return list(_derivation(spec).saved.values())


def forward_outputs(spec: Spec, inputs: dict[str, torch.Tensor]) -> tuple:
    """The output (a tuple of the spec's outputs where it has several) and the values the backward of its first
    output saves (saved_terms' order), written by one forward kernel; for a
    spec that no one kernel runs with them beside its output (one planned as stages), the forward kernel and
    the backward's stages that compute them."""
    (bw, training_spec), key = _derived(spec), _key_of(spec)
    if bw.saved and key not in _STAGED:
        try:
            outs = run_spec(training_spec, inputs)
            own = 1 + len(spec.also)   # the spec's own outputs come first, then the saved values
            return (outs[0] if own == 1 else tuple(outs[:own])), list(outs[own:])
        except SpecError:
            _STAGED.add(key)
    out = run_spec(spec, inputs)
    tensors = dict(inputs)
    for stage in bw.stages_to_run(frozenset(tensors), wanted=set(bw.saved)):
        tensors[stage.name] = run_spec(stage.spec, tensors)
    return out, [tensors[n] for n in bw.saved]


def one_pass_suits(device: torch.device) -> bool:
    """May a backward on `device` add a gradient across programs (one pass, autodiff._accumulated)? On a Hopper
    GPU while torch is not asked for deterministic algorithms: there the pass adding dQ beside dK and dV is the
    warp-specialized Gluon kernel, 1.17-2.1x FlexAttention's backward where the two deterministic passes run at
    0.89-1.5x (H100, bench/results/h100/2026-11-27-bf16-packing-and-grouped-order)."""
    return (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
            and not torch.are_deterministic_algorithms_enabled())


def backward_for_device(spec: Spec, wrt: tuple[str, ...] | None, device: torch.device) -> CompiledBackward:
    """The backward a call on `device` takes: where one_pass_suits it, the one pass if every kernel of it that
    adds across programs has the Gluon kernel and adds products only; else the two deterministic passes. A
    Triton kernel adding with atomics ran at 0.55x FlexAttention against 0.96x for the two passes; the Gluon
    kernel adding ALiBi's slope gradient (a sum per query row) beside dQ at 0.70-0.82x the two passes (H100,
    bench/experiments/2026-11-27-slope-gradient-one-pass)."""
    if one_pass_suits(device):
        one = CompiledBackward(spec, wrt, accumulate=True)
        adding = [k for k in one.plan.kernels if k.adds]
        if adding and not any(k.adds_sums for k in adding) and \
                all(module_for(k.spec, False).CONFIG.get("BACKEND") == "gluon" for k in adding):
            return one
    return CompiledBackward(spec, wrt)


def only_output(spec: Spec, output: int) -> Spec:
    """The spec computing its further output number `output` (1, 2, ... in spec.also's order) alone."""
    o = spec.also[output - 1]
    return replace(spec, name=f"{spec.name}_{o.name}", output_name=o.name, output_dtype=o.dtype,
                   output_term=o.term, output_axes=o.axes, also=())


def device_backward(cache: dict, spec: Spec, wrt: tuple[str, ...], device: torch.device,
                    output: int = 0) -> CompiledBackward:
    """backward_for_device(spec, wrt, device), kept in `cache` per (inputs, device, whether torch is asked for
    deterministic algorithms, output): a process that switches that setting gets the backward matching each."""
    key = (wrt, device, torch.are_deterministic_algorithms_enabled(), output)
    if key not in cache:
        cache[key] = backward_for_device(spec, wrt, device)
    return cache[key]


class Differentiable:
    """A spec as a differentiable torch function: `fn(*inputs)` in the spec's input order runs the forward
    kernel; gradients flow to every floating input that requires them, through the derived backward kernels.
    `deterministic`: True for the two passes whose sums run in a fixed order, False for one pass adding a
    gradient across programs, None to choose by the device (backward_for_device)."""

    def __init__(self, spec: Spec, deterministic: bool | None = None):
        self.spec = spec
        self.deterministic = deterministic
        self._backwards: dict[tuple, CompiledBackward] = {}

    def backward_for(self, wrt: tuple[str, ...], device: torch.device, output: int = 0) -> CompiledBackward:
        """The backward of output `output` (0: the first; the others' are derived as specs of that output alone)."""
        spec = self.spec if output == 0 else only_output(self.spec, output)
        if self.deterministic is None:
            return device_backward(self._backwards, spec, wrt, device, output)
        key = (wrt, None, output)
        if key not in self._backwards:
            self._backwards[key] = CompiledBackward(spec, wrt, accumulate=not self.deterministic)
        return self._backwards[key]

    @torch.compiler.disable   # a torch.compile'd caller runs it as it is (dynamo cannot trace the launches)
    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        if len(xs) != len(self.spec.inputs):
            raise TypeError(f"{self.spec.name} takes {len(self.spec.inputs)} inputs "
                            f"({', '.join(self.spec.inputs)}), got {len(xs)}")
        return _SpecFunction.apply(self, *xs)
