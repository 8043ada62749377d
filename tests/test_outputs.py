"""Specs with several outputs (a second spec.output call): one kernel writes them all, each checked against the
float64 reference of its own term, in fp16, bf16 and fp32, at lengths that are not multiples of the block and
with rows the mask empties."""
from __future__ import annotations

import math

import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.frontend.reference import evaluate_all, random_inputs, tolerance
from neptune_eqsat.frontend.spec import SpecError
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, exp, log, sum, where
from neptune_eqsat.spec import max as smax

from conftest import DEVICE


def softmax_with_logsumexp(dtype: str) -> Spec:
    """A softmax that also writes each row's logsumexp: the output runs along the reduced axis."""
    spec = Spec(f"softmax_lse_{dtype}")
    R, N = spec.dims(R=64, N=1000)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", dtype, R, N)
    m = smax(j, x[r, j])
    s = sum(j, exp(x[r, j] - m))
    spec.output("y", dtype, exp(x[r, j] - m) / s, r, j)
    spec.output("lse", "f32", m + log(s), r)
    return spec


def attention_with_row_values(dtype: str, empty: int) -> Spec:
    """Attention that also writes the row max and row sum (what a backward pass reads); `empty` query rows
    see no key (-inf max, zero sum, zero output)."""
    spec = Spec(f"attention_rows_{dtype}_{empty}")
    B, S = spec.dims(B=1, S=256)
    b, h, i, j, d, e = spec.axes(b=B, h=2, i=S, j=S, d=16, e=16)
    q, k, v = (spec.input(n, dtype, B, 2, S, 16) for n in "qkv")
    s = where(j <= i - empty, sum(d, q[b, h, i, d] * k[b, h, j, d]) * 0.25, -math.inf)
    m = smax(j, s)
    p = exp(s - where(m == -math.inf, 0, m))
    l = sum(j, p)
    spec.output("o", dtype, sum(j, p * v[b, h, j, e]) / where(l == 0, 1, l), b, h, i, e)
    spec.output("m", "f32", m, b, h, i)
    spec.output("l", "f32", l, b, h, i)
    return spec


def _check(spec: Spec, sizes: dict[str, int]) -> list[torch.Tensor]:
    result = optimize(spec)
    module = load_module(result.source, spec.name)
    inputs = random_inputs(spec, sizes, seed=3)
    outs = module.forward(*(t.to(DEVICE) for t in inputs.values()))
    assert isinstance(outs, tuple) and len(outs) == 1 + len(spec.also)
    refs = evaluate_all(spec, {n: t.double() for n, t in inputs.items()})
    dtypes = [spec.output_dtype] + [o.dtype for o in spec.also]
    for got, want, dtype in zip(outs, refs, dtypes):
        got = got.cpu().double()
        assert got.shape == want.shape
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=tolerance(dtype), atol=tolerance(dtype))
    return [o.cpu() for o in outs]


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_softmax_and_its_logsumexp_from_one_kernel(dtype):
    _check(softmax_with_logsumexp(dtype), {"R": 3, "N": 77})


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_attention_writes_its_row_values_beside_the_output(dtype):
    out, m, l = _check(attention_with_row_values(dtype, empty=3), {"B": 1, "S": 37})
    assert torch.isinf(m[:, :, :3]).all() and (l[:, :, :3] == 0).all()   # the rows the mask empties
    assert (out[:, :, :3] == 0).all()


def test_one_kernel_and_one_reduction_serves_output_and_row_value():
    """The row sum written beside the output is the loop state the output divides by, not a second one."""
    result = optimize(attention_with_row_values("f16", empty=0))
    assert result.chosen.sched.passes == 1
    sums = [r for r in result.chosen.sched.reductions if r.attrs[0] == "sum" and r.attrs[1] == "j"]
    assert len(sums) == 2   # the weighted sum of V and the row sum, which the output and `l` share


def test_output_names_are_unique():
    spec = Spec("dup")
    R = spec.dims(R=8)
    r = spec.axes(r=R)
    x = spec.input("x", "f32", R)
    spec.output("y", "f32", x[r], r)
    with pytest.raises(SpecError, match="output y: the name is taken"):
        spec.output("y", "f32", x[r] * 2, r)


def two_marginals(dtype: str, matrix: bool, z_dtype: str = "f32") -> Spec:
    """A[i, j] contracted both ways: y over the columns j (summing the rows i, the loop) and z over the rows i,
    which runs along that loop and sums over the columns the programs divide: each program adds its share."""
    spec = Spec(f"marginals_{dtype}_{matrix}_{z_dtype}")
    N, M = spec.dims(N=512, M=512)
    i, j, d = spec.axes(i=N, j=M, d=16)
    a = spec.input("a", dtype, N, M)
    if matrix:   # matrix products on both sides (dK beside dQ)
        x, w = spec.input("x", dtype, N, 16), spec.input("w", dtype, M, 16)
        spec.output("y", dtype, sum(i, a[i, j] * x[i, d]), j, d)
        spec.output("z", z_dtype, sum(j, a[i, j] * w[j, d]) * 0.5, i, d)
    else:
        x, w = spec.input("x", dtype, N), spec.input("w", dtype, M)
        spec.output("y", dtype, sum(i, a[i, j] * x[i]), j)
        spec.output("z", z_dtype, sum(j, a[i, j] * w[j]) - sum(j, a[i, j]), i)
    return spec


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("matrix", [False, True])
def test_an_output_along_the_loop_is_accumulated_across_programs(dtype, matrix):
    spec = two_marginals(dtype, matrix)
    assert optimize(spec).chosen.sched.accumulated == (0,)
    _check(spec, {"N": 45, "M": 83})   # several programs' shares, rows and columns past the blocks' ends


@pytest.mark.parametrize("kind", ["shifted", "reciprocal"])
def test_an_output_along_the_loop_that_is_not_a_sum_of_shares_is_refused_by_name(kind):
    """Each program adds its share of an output along the loop axis: an output that is no sum of shares (the row
    shifted by its max; the reciprocal of a whole row's sum) is refused, naming it."""
    spec = Spec(f"not_shares_{kind}")
    N, M = spec.dims(N=512, M=512)
    i, j = spec.axes(i=N, j=M)
    a = spec.input("a", "f32", N, M)
    if kind == "shifted":   # rows i, a loop over j
        spec.output("rowmax", "f32", smax(j, a[i, j]), i)
        spec.output("z", "f32", a[i, j] - smax(j, a[i, j]), i, j)
    else:                   # rows j, a loop over i
        spec.output("y", "f32", sum(i, a[i, j]), j)
        spec.output("z", "f32", 1 / sum(j, a[i, j]), i)
    with pytest.raises(SpecError, match="output z runs along .* it must be linear in sums over"):
        optimize(spec)


@pytest.mark.parametrize("z_dtype", ["f16", "bf16"])
@pytest.mark.parametrize("matrix", [False, True])
def test_a_16_bit_output_accumulated_across_programs_is_summed_in_fp32_and_rounded_once(z_dtype, matrix):
    """The programs add their shares into an fp32 workspace and a second kernel rounds it (codegen/rounding.py):
    the output is the fp32 output of the same spec rounded once, not a sum of rounded shares."""
    sizes = {"N": 45, "M": 83}
    rounded = _check(two_marginals("f16", matrix, z_dtype), sizes)[1]
    in_fp32 = _check(two_marginals("f16", matrix), sizes)[1]
    assert rounded.dtype == getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[z_dtype])
    # the interpreter adds the shares in one order (the same fp32 sums); it converts to bf16 by dropping the low
    # bits, where a GPU and torch round to nearest, so bf16 is checked within its tolerance (by _check) alone
    if DEVICE == "cpu" and z_dtype == "f16":
        assert torch.equal(rounded, in_fp32.to(rounded.dtype))


def test_an_output_accumulated_across_programs_in_fp64_is_refused():
    spec = Spec("shares_in_f64")
    N, M = spec.dims(N=512, M=512)
    i, j = spec.axes(i=N, j=M)
    a = spec.input("a", "f16", N, M)
    spec.output("y", "f16", sum(i, a[i, j]), j)
    spec.output("z", "f64", sum(j, a[i, j]), i)
    with pytest.raises(SpecError, match="output z is accumulated across programs in fp32 .* not in f64"):
        optimize(spec)
