"""Index bounds: every read of an input at a computed index stays inside that input.

A kernel reads `t[index]` with no bound check of its own, so an index outside the tensor would read other
memory silently. Before a kernel runs, each computed index is bounded over every value of its free axes:
by interval arithmetic first (cheap, and exact for sums, clamps and constant divisions of indices), and where
that cannot show the index in range, by evaluating it exactly, in slices of its longest axis so memory stays
bounded. An index that reads no input depends on the sizes only, so its check holds for every call with those
sizes; one that reads an input (`offsets[doc[i]]`) depends on that input's values and is checked per call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.reference import Evaluator
from neptune_eqsat.frontend.spec import Spec

EXACT_ELEMENTS = 1 << 22   # index values evaluated at once (a slice of the longest axis)


@dataclass(frozen=True)
class IndexCheck:
    """Dimension `position` of input `tensor` is read at `index`."""
    tensor: str
    position: int
    index: Term
    reads_data: bool   # the index reads an input, so its range depends on that input's values


def index_checks(spec: Spec, term: Term) -> list[IndexCheck]:
    """The reads in `term` whose index is not the tensor's own axis, inner reads (an index's index) first."""
    out: list[IndexCheck] = []
    for t in ir.walk(term):   # children before parents: an index's own reads are checked first
        if t.op != "load":
            continue
        shape = spec.inputs[t.attrs[0]].shape
        for pos, idx in enumerate(t.args):
            if idx.op == "axis" and spec.extent(idx.attrs[0]) == shape[pos]:
                continue   # the axis runs over exactly this dimension (the spec checked it)
            out.append(IndexCheck(t.attrs[0], pos, idx, any(x.op == "load" for x in ir.walk(idx))))
    return out


def out_of_range(spec: Spec, check: IndexCheck, sizes: dict[str, int], tensors: dict[str, torch.Tensor]
                 ) -> tuple[float, float, int] | None:
    """(lowest, highest, extent) when the index can leave [0, extent), else None."""
    ext = spec.inputs[check.tensor].shape[check.position]
    n = ext if isinstance(ext, int) else sizes[ext.name]
    ev = _Interval(spec, sizes, tensors)
    lo, hi = ev.interval(check.index)
    if 0 <= lo and hi < n:
        return None
    lo, hi = ev.exact(check.index)
    return None if 0 <= lo and hi < n else (lo, hi, n)


class _Interval:
    """Interval arithmetic over index terms, with exact evaluation where an interval is not enough."""

    def __init__(self, spec: Spec, sizes: dict[str, int], tensors: dict[str, torch.Tensor]):
        self.spec, self.sizes, self.tensors = spec, sizes, tensors
        self.device = next((t.device for t in tensors.values()), torch.device("cpu"))

    def extent(self, ax: str) -> int:
        ext = self.spec.extent(ax)
        return ext if isinstance(ext, int) else self.sizes[ext.name]

    def interval(self, t: Term) -> tuple[float, float]:
        op, at, ar = t.op, t.attrs, t.args
        if op == "axis":
            return 0.0, float(self.extent(at[0]) - 1)
        if op == "dim":
            return (float(self.sizes[at[0]]),) * 2
        if op == "const":
            return (at[0],) * 2
        if op == "load":
            return self.exact(t)
        if op == "cast":
            return self.interval(ar[0])
        if op == "un" and at[0] == "neg":
            lo, hi = self.interval(ar[0])
            return -hi, -lo
        if op == "un" and at[0] == "abs":
            lo, hi = self.interval(ar[0])
            return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        if op == "where":
            (lo1, hi1), (lo2, hi2) = self.interval(ar[1]), self.interval(ar[2])
            return min(lo1, lo2), max(hi1, hi2)
        if op == "bin" and at[0] in ("add", "sub", "mul", "max", "min", "floordiv", "mod"):
            (a, b), (c, d) = self.interval(ar[0]), self.interval(ar[1])
            fn = at[0]
            if fn == "add":
                return a + c, b + d
            if fn == "sub":
                return a - d, b - c
            if fn in ("max", "min"):
                pick = max if fn == "max" else min
                return pick(a, c), pick(b, d)
            if fn == "mul":
                products = [x * y for x in (a, b) for y in (c, d) if not (math.isinf(x) or math.isinf(y))]
                return (min(products), max(products)) if len(products) == 4 else (-math.inf, math.inf)
            if c == d and c > 0:   # by a positive constant
                if fn == "floordiv":
                    return math.floor(a / c), math.floor(b / c)
                return (a, b) if 0 <= a and b < c else (0.0, c - 1)
        return -math.inf, math.inf   # not bounded by intervals: the exact evaluation decides

    def exact(self, t: Term) -> tuple[float, float]:
        axes = sorted(t.free, key=self.extent)
        if not axes:
            v = Evaluator(self.spec, self.tensors, self.sizes, self.device)(t)[0]
            return float(v.min()), float(v.max())
        longest, rest = axes[-1], math.prod(self.extent(a) for a in axes[:-1])
        n = self.extent(longest)
        step = max(1, EXACT_ELEMENTS // max(rest, 1))
        lo, hi = math.inf, -math.inf
        for start in range(0, n, step):
            ev = Evaluator(self.spec, self.tensors, self.sizes, self.device, {longest: (start, min(start + step, n))})
            v = ev(t)[0]
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
        return lo, hi
