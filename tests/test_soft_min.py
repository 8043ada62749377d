"""A soft-min under a mask of +inf (min_j s - s, exp of it): a rolled block or a split chunk whose elements are
all +inf has a partial min of +inf, and inf - inf is NaN. The rule guard-partial-min reads such a min as 0 (as
guard-partial-max does for a max of -inf) and the cost model prices the unguarded form as a risk in plans that
repair; before, every output of the rolled plan was NaN."""
import math

import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, exp, f32, inf, log, min, sum, where


def _masked(name: str, value_only: bool) -> Spec:
    spec = Spec(name)
    R, N = spec.dims(R=64, N=1024)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", f32, R, N)
    mask = spec.input("mask", "bool", R, N)
    s = where(mask[r, j], x[r, j], inf)
    mn = min(j, s)
    if value_only:   # -softmin value: -min + log sum exp(min - s), a row vector
        spec.output("y", f32, log(sum(j, exp(mn - s))) - mn, r)
    else:
        p = exp(mn - s)
        spec.output("y", f32, p / sum(j, p), r, j)
    return spec


@pytest.mark.parametrize("plan", ["rolled", "split"])
@pytest.mark.parametrize("value_only", [False, True])
def test_a_masked_soft_min_with_whole_blocks_masked_matches_torch(plan, value_only):
    spec = _masked(f"soft_min_{plan}_{int(value_only)}", value_only)
    try:
        result = optimize(spec, plan=plan)
    except Exception as e:   # a family this spec has no plan of (the split of a row-wide output)
        pytest.skip(f"no {plan} plan: {e}")
    forward = load_module(result.source, spec.name).forward
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 67, generator=g) * 3
    M = torch.rand(2, 67, generator=g) > 0.5
    M[:, :40] = False   # whole leading blocks (and chunks) of +inf
    M[:, 60] = True
    neg = (-X.double()).masked_fill(~M, -math.inf)
    ref = torch.logsumexp(neg, -1) if value_only else torch.softmax(neg, -1)
    out = forward(X, M).double()
    assert not torch.isnan(out).any()
    assert (out - ref).abs().max().item() < 1e-5
