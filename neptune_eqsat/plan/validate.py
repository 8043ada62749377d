"""Translation validation of an extracted term: its value and the spec's, in float64 at small sizes on random
inputs, must agree before the term becomes a plan.

Every rewrite is an identity, proved or checked when it is written; but an e-graph merges e-classes for good,
and one wrong merge (a rule sound for the values it was proved over and not for these, a fact left from
another term) makes every term of the merged class look equal. This check does not trust the e-graph: a
term whose value differs from the spec's is rejected like a malformed one, and the compiler saturates
afresh. It costs milliseconds (dims of 5 to 7, constant extents as declared).

A rolled or split reduction's final value is the plain reduction of its body (its repair only fixes partial
results), so the reference evaluator reads plans of every family.
"""
from __future__ import annotations

import torch

from neptune_eqsat.ir import Term, walk
from neptune_eqsat.frontend.reference import Evaluator, output_value, random_inputs, unshifted
from neptune_eqsat.frontend.spec import Dim, Spec

SIZES = (5, 7, 6)   # the dims, in turn: small, unequal, not multiples of one another
SEEDS = (11, 12)    # two draws of inputs: one can leave a mask that reads them all kept or all masked
CLOSE = {"rtol": 1e-6, "atol": 1e-9, "equal_nan": True}


class Validation:
    """The spec's outputs in float64 at small sizes on random inputs, computed once; each extracted term is
    compared with them (one evaluator: the terms share most of their sub-terms with the spec's)."""

    def __init__(self, spec: Spec):
        self.sizes = _sizes(spec)
        self.outputs = [(spec.output_name, spec.output_axes, spec.output_term)] + \
            [(o.name, o.axes, o.term) for o in spec.also]
        self.draws = []   # (evaluator, the spec's outputs) per draw of inputs
        try:
            for seed in SEEDS:
                inputs = {n: t.double() for n, t in random_inputs(spec, self.sizes, seed=seed).items()}
                ev = Evaluator(spec, inputs, sizes=self.sizes)
                self.draws.append((ev, [output_value(ev, t, axes) for _, axes, t in self.outputs]))
        except Exception:   # an op or size the reference does not evaluate: no verdicts
            self.draws = []

    def disagreement(self, term: Term) -> str:
        """Why `term` (the extracted root) is not the spec's value, or "" when they agree or the reference
        cannot evaluate the spec. A term the reference cannot evaluate where it evaluates the spec is not the
        spec's value either (a mask's test merged with a loaded value, say: it gains the load's axes)."""
        got = term.args if term.op == "pack" else (term,)
        for ev, wants in self.draws:
            for (name, axes, _), want, have in zip(self.outputs, wants, got):
                try:
                    b = output_value(ev, have, axes)
                except Exception as e:   # noqa: BLE001 - any failure to evaluate it is a verdict against it
                    return f"its {name} cannot be evaluated as the spec's is ({type(e).__name__}: {str(e)[:120]})"
                if b.shape != want.shape:
                    return f"its {name} has shape {tuple(b.shape)}, the spec's {tuple(want.shape)}"
                if not torch.allclose(want, b, **CLOSE):
                    at = tuple(int(x) for x in (~torch.isclose(want, b, **CLOSE)).nonzero()[0])
                    return (f"its {name} differs from the spec's at {dict(zip(axes, at))} ({b[at].item():.6g} "
                            f"against {want[at].item():.6g}, float64, sizes {self.sizes})")
        return ""


def _sizes(spec: Spec) -> dict[str, int]:
    """Small unequal sizes for the dims, each no larger than a fixed extent an axis over it indexes (a table
    of two batches read at b: a batch of 5 would read past it, and every draw would compare NaN with NaN)."""
    sizes = {d: SIZES[k % len(SIZES)] for k, d in enumerate(sorted(spec.dims_))}
    for t in walk(spec.root_term):
        if t.op != "load" or t.attrs[0] not in spec.inputs:
            continue
        for index, extent in zip(t.args, spec.inputs[t.attrs[0]].shape):
            index = unshifted(index)
            dim = spec.axes_.get(index.attrs[0]) if index.op == "axis" else None
            if isinstance(extent, int) and isinstance(dim, Dim):
                sizes[dim.name] = min(sizes[dim.name], extent)
    return sizes


def disagreement(spec: Spec, term: Term) -> str:
    """Validation(spec).disagreement(term), for one term."""
    return Validation(spec).disagreement(term)
