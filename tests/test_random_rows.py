"""Property-based end-to-end tests beyond attention: hypothesis writes chains of row reductions (softmax,
logsumexp, log-softmax, layer norm, RMS norm, softmax-weighted means, max-normalized sums, min-max scaling) over
random elementwise trees of an input row and a per-column weight (+ - * tanh abs max min where over the column
index), in fp16, bf16 and fp32 with an output in any of them, at lengths that are not multiples of the block;
optimizes them, runs the kernel under the interpreter and compares with float64. The same rules that fuse
attention must fuse these. A failure prints the spec file that reproduces it.

The number of specs is NEPTUNE_RANDOM_SPECS (4 by default, 4 more in the slow pass; set it higher locally).
"""
import os

import pytest
import torch
from hypothesis import strategies as st

from conftest import check_gradients, run_against_reference
from test_random_specs import random_specs, written_spec
from neptune_eqsat.frontend.reference import tolerance
from neptune_eqsat.spec import load_spec

EXAMPLES = int(os.environ.get("NEPTUNE_RANDOM_SPECS", "4"))
SLOW_EXAMPLES = 4
GRADIENT_EXAMPLES = int(os.environ.get("NEPTUNE_RANDOM_SPECS", "2"))   # per chain

LEAVES = ["x[r, j]", "x[r, j]", "w[j]", "0.5", "2.0", "(j * 0.05)"]


def elementwise(depth: int, smooth: bool = False):
    """Random elementwise trees; `smooth`: without the ops whose gradient at a tie is a convention (max, min, abs
    and a where choosing between equal values split a gradient differently in torch)."""
    leaf = st.sampled_from(LEAVES)
    if depth == 0:
        return leaf
    sub = elementwise(depth - 1, smooth)
    kinked = [] if smooth else [
        sub.map(lambda a: f"abs({a})"),
        st.tuples(sub, sub).map(lambda t: f"max({t[0]}, {t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"min({t[0]}, {t[1]})"),
        st.tuples(st.integers(0, 40), sub, sub).map(lambda t: f"where(j >= {t[0]}, {t[1]}, {t[2]})"),
    ]
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        sub.map(lambda a: f"tanh({a})"),
        *kinked,
    )


CHAINS = {   # e: the row's values (reads x), g: a second elementwise value
    "softmax": "m = max(j, e)\nl = sum(j, exp(e - m))\nspec.output('y', OUT, exp(e - m) / l, r, j)",
    "logsumexp": "m = max(j, e)\nspec.output('y', OUT, m + log(sum(j, exp(e - m))), r)",
    "log_softmax": "m = max(j, e)\nspec.output('y', OUT, e - m - log(sum(j, exp(e - m))), r, j)",
    "layernorm": "mu = sum(j, e) / N\nvar = sum(j, (e - mu) * (e - mu)) / N\n"
                 "spec.output('y', OUT, (e - mu) / sqrt(var + 1e-5) * w[j], r, j)",
    "rmsnorm": "ms = sum(j, e * e) / N\nspec.output('y', OUT, e / sqrt(ms + 1e-5) * w[j], r, j)",
    "weighted_mean": "m = max(j, e)\nspec.output('y', OUT, sum(j, exp(e - m) * g) / sum(j, exp(e - m)), r)",
    "max_normalized": "m = max(j, abs(e))\nspec.output('y', OUT, sum(j, e / (m + 1.0)), r)",
    "min_max": "lo = min(j, e)\nhi = max(j, e)\nspec.output('y', OUT, (e - lo) / (hi - lo + 1.0), r, j)",
    # a row's value inside a sum over the row (its gradient sums over the columns it is broadcast along)
    "smoothed_nll": "m = max(j, e)\nlse = m + log(sum(j, exp(e - m)))\n"
                    "spec.output('y', OUT, sum(j, (lse - e) * g) / N, r)",
    # (a mean: an f16 output of it stays small)
    "spread": "lo = min(j, e)\nspec.output('y', OUT, sum(j, e - lo + g) / N, r)",
}


def spec_text(chain: str, e: str, g: str, dtype: str, out: str) -> str:
    if "x[r, j]" not in e:   # the row's values depend on the row (a reduction of a constant is refused)
        e = f"({e} + x[r, j])"
    return f'''"""A random chain of row reductions."""
from neptune_eqsat.spec import *

spec = Spec("random_rows")
R, N = spec.dims(R=64, N=1024)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", {dtype}, R, N)
w = spec.input("w", f32, N)
e = {e}
g = {g}
''' + CHAINS[chain].replace("OUT", out) + "\n"


ROWS = dict(chain=st.sampled_from(sorted(CHAINS)), e=elementwise(2), g=elementwise(1),
            dtype=st.sampled_from(["f16", "bf16", "f32"]), out=st.sampled_from(["f16", "bf16", "f32"]),
            rows=st.integers(1, 5), n=st.integers(1, 70))


@random_specs(EXAMPLES, ROWS)
def test_random_row_reductions_match_float64(tmp_path_factory, chain, e, g, dtype, out, rows, n):
    check_random_rows(tmp_path_factory, chain, e, g, dtype, out, rows, n)


@pytest.mark.slow
@random_specs(SLOW_EXAMPLES, ROWS)
def test_more_random_row_reductions_match_float64(tmp_path_factory, chain, e, g, dtype, out, rows, n):
    check_random_rows(tmp_path_factory, chain, e, g, dtype, out, rows, n)


GRADIENT_ROWS = dict(e=elementwise(2, smooth=True), g=elementwise(1, smooth=True), rows=st.integers(1, 4),
                     n=st.integers(1, 40))


@pytest.mark.parametrize("chain", sorted(CHAINS))   # every chain (hypothesis's draws stay near its first ones)
@random_specs(GRADIENT_EXAMPLES, GRADIENT_ROWS)
def test_random_row_gradients_match_float64(tmp_path_factory, chain, e, g, rows, n):
    """The derived backward of random row chains (fp32) against float64 autograd of the unfused spec: the
    gradients of the row's input and of the per-column weight."""
    path = written_spec(tmp_path_factory, spec_text(chain, e, g, "f32", "f32"), f"R={rows}, N={n}", "row_grads")
    check_gradients(load_spec(path), {"R": rows, "N": n}, seed=n)


def check_random_rows(tmp_path_factory, chain, e, g, dtype, out, rows, n):
    path = written_spec(tmp_path_factory, spec_text(chain, e, g, dtype, out), f"R={rows}, N={n}", "rows")
    got, ref, err = run_against_reference(path, {"R": rows, "N": n}, seed=n)
    assert not torch.isnan(got).any(), "NaN in kernel output"
    # Triton's interpreter truncates fp32 to bf16 (the GPU rounds to nearest): a bf16 output may be off by one
    # unit in its last place, 2^-7 of its size, beyond the absolute tolerance where it is large
    allowed = tolerance(out) + (ref.abs() * 2.0 ** -7 if out == "bf16" else 0)
    excess = ((got.double() - ref).abs() - allowed).max().item() if got.numel() else 0.0
    assert excess <= 0, f"{chain} R={rows} N={n}: max error {err}"
