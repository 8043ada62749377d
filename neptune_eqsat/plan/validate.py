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

from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.reference import Evaluator, output_value, random_inputs
from neptune_eqsat.frontend.spec import Spec

SIZES = (5, 7, 6)   # the dims, in turn: small, unequal, not multiples of one another
CLOSE = {"rtol": 1e-6, "atol": 1e-9, "equal_nan": True}


class Validation:
    """The spec's outputs in float64 at small sizes on random inputs, computed once; each extracted term is
    compared with them (one evaluator: the terms share most of their sub-terms with the spec's)."""

    def __init__(self, spec: Spec):
        self.sizes = {d: SIZES[k % len(SIZES)] for k, d in enumerate(sorted(spec.dims_))}
        self.outputs = [(spec.output_name, spec.output_axes, spec.output_term)] + \
            [(o.name, o.axes, o.term) for o in spec.also]
        try:
            inputs = {n: t.double() for n, t in random_inputs(spec, self.sizes, seed=11).items()}
            self.ev = Evaluator(spec, inputs, sizes=self.sizes)
            self.want = [output_value(self.ev, t, axes) for _, axes, t in self.outputs]
        except Exception:   # an op or size the reference does not evaluate: no verdicts
            self.ev = None

    def disagreement(self, term: Term) -> str:
        """Why `term` (the extracted root) is not the spec's value, or "" when they agree or the reference
        cannot evaluate it."""
        if self.ev is None:
            return ""
        got = term.args if term.op == "pack" else (term,)
        try:
            for (name, axes, _), want, have in zip(self.outputs, self.want, got):
                b = output_value(self.ev, have, axes)
                if not torch.allclose(want, b, **CLOSE):
                    at = tuple(int(x) for x in (~torch.isclose(want, b, **CLOSE)).nonzero()[0])
                    return (f"its {name} differs from the spec's at {dict(zip(axes, at))} ({b[at].item():.6g} "
                            f"against {want[at].item():.6g}, float64, sizes {self.sizes})")
        except Exception:
            return ""
        return ""


def disagreement(spec: Spec, term: Term) -> str:
    """Validation(spec).disagreement(term), for one term."""
    return Validation(spec).disagreement(term)
