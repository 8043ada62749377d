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
from neptune_eqsat.frontend.reference import Evaluator, _align, random_inputs
from neptune_eqsat.frontend.spec import Spec

SIZES = (5, 7, 6)   # the dims, in turn: small, unequal, not multiples of one another


def disagreement(spec: Spec, term: Term) -> str:
    """Why `term` (the extracted root) is not the spec's value at small sizes, or "" when they agree or the
    reference cannot evaluate one of them."""
    sizes = {d: SIZES[k % len(SIZES)] for k, d in enumerate(sorted(spec.dims_))}
    outputs = [(spec.output_name, spec.output_term, spec.output_axes)] + [(o.name, o.term, o.axes) for o in spec.also]
    got = term.args if term.op == "pack" else (term,)
    try:
        inputs = {n: t.double() for n, t in random_inputs(spec, sizes, seed=11).items()}
        for (name, want, axes), have in zip(outputs, got):
            values = []
            for t in (want, have):
                ev = Evaluator(spec, inputs, sizes=sizes)
                v = ev(t)
                values.append(torch.zeros([ev.extent(a) for a in axes], dtype=torch.float64) + _align(v, axes))
            a, b = values
            if not torch.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True):
                bad = ~torch.isclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True)
                at = tuple(int(x) for x in bad.nonzero()[0])
                return (f"its {name} differs from the spec's at {dict(zip(axes, at))} ({b[at].item():.6g} against "
                        f"{a[at].item():.6g}, float64, sizes {sizes})")
    except Exception:   # an op or size the reference does not evaluate: no verdict
        return ""
    return ""
