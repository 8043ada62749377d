"""Float64 evaluation of a spec, unfused: the ground truth for every test.

Values are torch tensors with named axes; a reduction reduces its axis; sum of a product is an einsum so the
product over all axes is never materialized. Casts are ignored (the math is exact); the output is float64.
"""
from __future__ import annotations

import functools
import math
import string

import torch

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term, walk
from neptune_eqsat.frontend.spec import Spec, SpecError

Value = tuple[torch.Tensor, tuple[str, ...]]  # data, the axis of each dimension


def bind_sizes(spec: Spec, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    """Run-time dims from the input shapes, checked for agreement."""
    sizes: dict[str, int] = {}
    for name, t in spec.inputs.items():
        if name not in inputs:
            raise SpecError(f"spec {spec.name}: missing input {name}")
        x = inputs[name]
        if x.dim() != len(t.shape):
            raise SpecError(f"input {name}: expected {len(t.shape)} dimensions {list(t.shape)}, got shape "
                            f"{tuple(x.shape)}")
        for pos, (want, got) in enumerate(zip(t.shape, x.shape)):
            if isinstance(want, int):
                if want != got:
                    raise SpecError(f"input {name}, dimension {pos}: expected {want}, got {got}")
            elif sizes.setdefault(want.name, got) != got:
                raise SpecError(f"input {name}, dimension {pos}: {want.name} = {got} disagrees with "
                                f"{want.name} = {sizes[want.name]} from another input")
    return sizes


def _align(v: Value, axes: tuple[str, ...]) -> torch.Tensor:
    """View v with dimensions in the order `axes` (size 1 where v lacks an axis)."""
    data, have = v
    perm = [have.index(a) for a in axes if a in have]
    data = data.permute(*perm) if perm else data
    shape = [data.shape[[a for a in axes if a in have].index(a)] if a in have else 1 for a in axes]
    return data.reshape(shape)


def _union(*vals: Value) -> tuple[str, ...]:
    out: list[str] = []
    for _, axes in vals:
        out += [a for a in axes if a not in out]
    return tuple(out)


_UN = ops.forms("un", "torch", torch)
_BIN = ops.forms("bin", "torch", torch)


class Evaluator:
    """Values of a spec's terms over all values of their free axes. `sizes` (run-time dims) are read from the
    inputs unless given, in which case `inputs` need only hold the tensors the evaluated terms read; `ranges`
    limits axes to a slice [start, stop) of their extent; `device` is where the arithmetic runs."""

    def __init__(self, spec: Spec, inputs: dict[str, torch.Tensor], sizes: dict[str, int] | None = None,
                 device: str | torch.device = "cpu", ranges: dict[str, tuple[int, int]] | None = None,
                 differentiable: bool = False):
        self.spec = spec
        self.sizes = bind_sizes(spec, inputs) if sizes is None else sizes
        self.device = device
        # differentiable: inputs keep their autograd graph, so torch's own backward of the unfused math is the
        # oracle of the derived backward kernels
        self.inputs = {k: (v if differentiable else v.detach()).to(device, torch.float64) for k, v in inputs.items()}
        self.ranges = ranges or {}
        self.memo: dict[Term, Value] = {}

    def extent(self, ax: str) -> int:
        ext = self.spec.extent(ax)
        return ext if isinstance(ext, int) else self.sizes[ext.name]

    def __call__(self, t: Term) -> Value:
        if t not in self.memo:
            self.memo[t] = self._eval(t)
        return self.memo[t]

    def _eval(self, t: Term) -> Value:
        op, at, ar = t.op, t.attrs, t.args
        if op == "axis":
            start, stop = self.ranges.get(at[0], (0, self.extent(at[0])))
            return torch.arange(start, stop, dtype=torch.float64, device=self.device), (at[0],)
        if op == "dim":
            return torch.tensor(float(self.sizes[at[0]]), dtype=torch.float64, device=self.device), ()
        if op == "const":
            return torch.tensor(at[0], dtype=torch.float64, device=self.device), ()
        if op == "load":
            idx = [self(a) for a in ar]
            axes = _union(*idx)
            index = [_align(v, axes).long() for v in idx]
            x = self.inputs[at[0]]
            inside = functools.reduce(torch.logical_and, [(i >= 0) & (i < n) for i, n in zip(index, x.shape)],
                                      torch.ones((), dtype=torch.bool, device=self.device))
            if bool(inside.all()):
                return x[tuple(index)], axes
            # an index outside the tensor reads NaN: a where that discards it (a label of -100 under
            # ignore_index) gives its other branch, and a read that is kept makes the result NaN
            index = [i.clamp(0, n - 1) for i, n in zip(index, x.shape)]
            return torch.where(inside, x[tuple(index)], float("nan")), axes
        if op == "cast":
            return self(ar[0])
        if op == "un":
            d, axes = self(ar[0])
            return _UN[at[0]](d).to(torch.float64), axes
        if op == "bin":
            a, b = self(ar[0]), self(ar[1])
            axes = _union(a, b)
            return _BIN[at[0]](_align(a, axes), _align(b, axes)).to(torch.float64), axes
        if op == "where":
            vals = [self(a) for a in ar]
            axes = _union(*vals)
            c, x, y = (_align(v, axes) for v in vals)
            return torch.where(c.bool(), x, y), axes
        if op in ("red", "roll", "split"):
            return self._reduce(at[0], at[1], ar[0])
        raise SpecError(f"cannot evaluate {op} in the reference")

    def _reduce(self, reducer: str, ax: str, body: Term) -> Value:
        if reducer == "sum" and body.op == "bin" and body.attrs[0] == "mul":
            a, b = self(body.args[0]), self(body.args[1])
            axes = _union(a, b)
            if ax not in axes:  # the body does not vary along ax
                return self._reduce_dense(reducer, ax, body)
            letters = dict(zip(axes, string.ascii_letters))
            out = tuple(x for x in axes if x != ax)
            eq = f"{''.join(letters[x] for x in a[1])},{''.join(letters[x] for x in b[1])}->" \
                 f"{''.join(letters[x] for x in out)}"
            return torch.einsum(eq, a[0], b[0]), out
        return self._reduce_dense(reducer, ax, body)

    def _reduce_dense(self, reducer: str, ax: str, body: Term) -> Value:
        data, axes = self(body)
        if ax not in axes:
            start, stop = self.ranges.get(ax, (0, self.extent(ax)))
            n = stop - start
            return (data * n if reducer == "sum" else data), axes
        dim = axes.index(ax)
        rest = axes[:dim] + axes[dim + 1:]
        if reducer == "sum":
            return data.sum(dim), rest
        if reducer == "max":
            return data.amax(dim), rest
        if reducer == "min":
            return data.amin(dim), rest
        raise SpecError(f"unknown reducer {reducer}")


def evaluate(spec: Spec, inputs: dict[str, torch.Tensor], differentiable: bool = False) -> torch.Tensor:
    """The spec's output in float64, dimensions in the output's axis order (differentiable: with the inputs'
    autograd graph)."""
    return evaluate_all(spec, inputs, differentiable)[0]


def evaluate_all(spec: Spec, inputs: dict[str, torch.Tensor], differentiable: bool = False) -> list[torch.Tensor]:
    """Every output of the spec (the first, then spec.also's), as `evaluate` gives the first."""
    ev = Evaluator(spec, inputs, differentiable=differentiable)
    return [output_value(ev, term, axes)
            for term, axes in [(spec.output_term, spec.output_axes)] + [(o.term, o.axes) for o in spec.also]]


def output_value(ev: Evaluator, term: Term, axes: tuple[str, ...]) -> torch.Tensor:
    """term's value as an output over `axes`, in their order (broadcast along those it does not vary along)."""
    value = ev(term)
    full = torch.zeros([ev.extent(a) for a in axes], dtype=torch.float64)
    return (full + _align(value, axes)) if value[1] or axes else value[0]


def unshifted(idx: Term) -> Term:
    """An index without the `+ 0` the FlexAttention tracer adds to it (i + 0 is i)."""
    while idx.op == "bin" and idx.attrs[0] == "add" and idx.args[1].op == "const" and idx.args[1].attrs[0] == 0:
        idx = idx.args[0]
    return idx


def index_roles(spec: Spec, sizes: dict[str, int]) -> dict[str, int]:
    """Inputs read as an index of another input (labels, token ids: x[r, target[r]]), with the extent of the
    dimension they index."""
    roles: dict[str, int] = {}
    for t in walk(spec.output_term):
        if t.op != "load":
            continue
        for pos, idx in enumerate(t.args):
            idx = unshifted(idx)
            if idx.op == "load":
                ext = spec.inputs[t.attrs[0]].shape[pos]
                n = ext if isinstance(ext, int) else sizes[ext.name]
                roles[idx.attrs[0]] = min(roles.get(idx.attrs[0], n), n)
    return roles


def random_inputs(spec: Spec, sizes: dict[str, int], seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Random inputs of the declared dtypes (never zeros): normal, or uniform in [0.5, 2] for positive inputs;
    an input read as an index (a label) takes integers in range of the dimension it indexes."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    roles = index_roles(spec, sizes)
    for name, t in spec.inputs.items():
        shape = [s if isinstance(s, int) else sizes[s.name] for s in t.shape]
        if name in roles:
            x = torch.randint(0, roles[name], shape, generator=g).to(torch.float64)
        elif t.dtype == "bool":
            x = torch.rand(shape, generator=g) < 0.5
        elif t.dtype in ir.INT_DTYPES:   # integers around the positions (a length per row compared with j
            # keeps some keys and masks others), both signs where the dtype holds them
            top = min(max(sizes.values(), default=17) + 3, 127)
            x = torch.randint(0 if t.dtype == "u8" else -3, top, shape, generator=g)
        else:
            x = torch.rand(shape, generator=g) * 1.5 + 0.5 if t.positive else torch.randn(shape, generator=g)
        out[name] = x.to(getattr(torch, ir.TORCH_NAMES[t.dtype])).to(device)
    return out


def tolerance(dtype: str) -> float:
    return {"f16": 2e-2, "bf16": 5e-2, "f32": 2e-4, "f64": 1e-9}[dtype] if dtype else math.inf
