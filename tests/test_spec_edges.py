"""Specs at the edges of what the planner and the code generator assume: an output of one value (no row axis
to tile), indices that run-time sizes push outside an input, and gradients spread evenly over an axis no
gradient input carries. Each against float64."""
from pathlib import Path

import pytest
import torch

from conftest import DEVICE, assert_close, compiled, on_device
from neptune_eqsat.spec import load_spec
from neptune_eqsat.training import Differentiable

HEADER = "from neptune_eqsat.spec import *\nspec = Spec('{name}')\n"


def write(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER.format(name=name) + body)
    return str(path)


@pytest.mark.parametrize("name, body", [
    ("vector_sum", "N = spec.dims(N=4096)\nj = spec.axes(j=N)\nx = spec.input('x', f32, N)\n"
                   "spec.output('y', f32, sum(j, x[j]))\n"),
    ("vector_logsumexp", "N = spec.dims(N=4096)\nj = spec.axes(j=N)\nx = spec.input('x', f16, N)\n"
                         "m = max(j, x[j])\nspec.output('y', f32, m + log(sum(j, exp(x[j] - m))))\n"),
    ("matrix_sum_of_squares", "R, N = spec.dims(R=512, N=512)\nr, j = spec.axes(r=R, j=N)\n"
                              "x = spec.input('x', f32, R, N)\nspec.output('y', f32, sum(r, sum(j, x[r, j] * x[r, j])))\n"),
])
def test_an_output_of_one_value_compiles_and_matches(tmp_path, name, body):
    """A reduction to a single value has no row axis for a split plan's tiles: it runs rolled (before, the code
    generator failed on the split plan)."""
    path = write(tmp_path, name, body)
    sizes = {"N": 53} if "R" not in body else {"R": 7, "N": 37}
    out, _ = assert_close(path, sizes)
    assert out.shape == ()


SHIFTED = "R, N, M = spec.dims(R=64, N=64, M=63)\nr, j = spec.axes(r=R, j=M)\nx = spec.input('x', f32, R, N)\n" \
    "w = spec.input('w', f32, M)\nspec.output('y', f32, sum(j, x[r, j + 1] * w[j]), r)\n"


def test_an_index_run_time_sizes_push_outside_an_input_is_refused(tmp_path):
    """x[r, j + 1] with j over M reads inside x only where M + 1 <= N: a call with M = N raises before any
    kernel runs (before, it read the next row's first element); one with M = N - 1 runs and matches."""
    path = write(tmp_path, "shifted", SHIFTED)
    assert_close(path, {"R": 3, "N": 37, "M": 36})
    _, mod = compiled(path)
    with pytest.raises(IndexError, match=r"x: dimension 1 is read at index \(j \+ 1\), which runs from 1 to 37 "
                                         r"at these sizes, outside the 37 it has"):
        on_device(mod.forward, torch.randn(3, 37), torch.randn(37))


def test_a_gradient_spread_evenly_over_a_row_takes_its_size_from_an_input(tmp_path):
    """d(mean_j x[r, j]) / dx = g[r] / N: the gradient kernel reads g only, whose shape lacks N (before, the
    call failed with KeyError: 'N'); and cross-entropy with label smoothing, which has such a term."""
    rows = write(tmp_path, "row_mean", "R, N = spec.dims(R=4096, N=4096)\nr, j = spec.axes(r=R, j=N)\n"
                                       "x = spec.input('x', f32, R, N)\nspec.output('y', f32, sum(j, x[r, j]) / N, r)\n")
    smooth = write(tmp_path, "smoothed_ce", "R, V = spec.dims(R=4096, V=32768)\nr, j = spec.axes(r=R, j=V)\n"
                   "x = spec.input('x', f32, R, V)\nt = spec.input('t', i64, R)\nm = max(j, x[r, j])\n"
                   "lse = m + log(sum(j, exp(x[r, j] - m)))\n"
                   "spec.output('loss', f32, 0.9 * (lse - x[r, t[r]]) + 0.1 * (lse - sum(j, x[r, j]) / V), r)\n")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 41, generator=g) * 2
    labels = torch.randint(0, 41, (3,), generator=g)
    grad = torch.randn(3, generator=g, dtype=torch.float64)
    cases = [(rows, (x,), lambda x: x.mean(1)),
             (smooth, (x, labels), lambda x: torch.nn.functional.cross_entropy(x, labels, reduction="none",
                                                                                label_smoothing=0.1))]
    for path, inputs, reference in cases:
        xs = inputs[0].clone().to(DEVICE).requires_grad_()
        out = Differentiable(load_spec(path))(xs, *(t.to(DEVICE) for t in inputs[1:]))
        out.backward(grad.float().to(DEVICE))
        x64 = inputs[0].double().requires_grad_()
        want = reference(x64)
        want.backward(grad)
        assert (out.detach().cpu().double() - want.detach()).abs().max() < 1e-4
        assert (xs.grad.cpu().double() - x64.grad).abs().max() < 1e-4


RELATIVE = ("S, D, R = spec.dims(S=64, D=16, R=127)\ni, j, d = spec.axes(i=S, j=S, d=D)\n"
            "x = spec.input('x', f32, S, D)\nbias = spec.input('bias', f32, {table})\n"
            "s = x[i, 0] * x[j, 1] + bias[i - j + S - 1]\nm = max(j, s)\n"
            "spec.output('y', f32, sum(j, exp(s - m) * x[j, d]) / sum(j, exp(s - m)), i, d)\n")


def test_a_table_as_long_as_the_relative_positions(tmp_path):
    """A bias per relative position (2 S - 1 entries): a size computed from others is refused with the way to
    write it (a Dim of its own), and written so, a table too short for the sizes of a call raises."""
    with pytest.raises(Exception, match=r"input bias: shape entries must be ints or Dims, got \(\(2 \* S\) - 1\) "
                                        r"\(a size computed from others.*spec.dims\(R=...\)\)"):
        load_spec(write(tmp_path, "relative_computed", RELATIVE.format(table="2 * S - 1")))
    path = write(tmp_path, "relative", RELATIVE.format(table="R"))
    assert_close(path, {"S": 21, "D": 16, "R": 41})
    _, mod = compiled(path)
    with pytest.raises(IndexError, match=r"bias: dimension 0 .* from 0 to 40 at these sizes, outside the 39"):
        on_device(mod.forward, torch.randn(21, 16), torch.randn(39))


IGNORED = ("R, V = spec.dims(R=64, V=512)\nr, j = spec.axes(r=R, j=V)\nx = spec.input('x', f32, R, V)\n"
           "target = spec.input('target', i64, R)\nm = max(j, x[r, j])\nlse = m + log(sum(j, exp(x[r, j] - m)))\n"
           "spec.output('loss', f32, where(target[r] == -100, 0.0, lse - x[r, target[r]]), r)\n")


def test_a_label_outside_the_row_is_refused_at_every_call():
    """x[r, target[r]] reads inside x only where the labels do: a call with a label out of range raises
    IndexError naming the read (before, a label V read the next row's first element), also after the labels
    change in place between calls (a new version of the same tensor). On a GPU the check is a device-side
    assertion, as torch's cross-entropy makes (it would end the test process's CUDA context): checked on the
    CPU, where the same lines raise."""
    _, mod = compiled("specs/cross_entropy.py")
    x, target = torch.randn(5, 37), torch.tensor([1.0, 36.0, 3.0, 0.0, 20.0])
    want = torch.nn.functional.cross_entropy(x, target.long(), reduction="none")
    assert (on_device(mod.forward, x, target) - want).abs().max() < 1e-5
    assert "torch._assert_async(((_ix >= 0) & (_ix < x.shape[1])).all()" in Path(mod.__file__).read_text()
    if DEVICE != "cpu":
        return
    mod.forward(x, target)
    target[2] = 37.0   # written in place: the same tensor, a new version
    with pytest.raises(IndexError, match=r"x: dimension 1 is read at index target\[r\], which takes values 0 to 37, "
                                         r"outside the 37 it has"):
        mod.forward(x, target)
    with pytest.raises(IndexError, match=r"takes values -1 to 36"):
        mod.forward(x, torch.tensor([1.0, 36.0, -1.0, 0.0, 20.0]))


def test_a_label_read_under_a_where_is_left_to_it(tmp_path):
    """where(target == -100, 0, lse - x[r, target[r]]): the read out of range is the where's to discard
    (torch's ignore_index), so the call runs and matches torch; the kernel holds the index inside the row, so
    the address it forms for the first row's -100 stays inside x."""
    _, mod = compiled(write(tmp_path, "ignored_labels", IGNORED))
    x, target = torch.randn(7, 37), torch.tensor([-100, 2, 3, 0, -100, 36, -100])
    want = torch.nn.functional.cross_entropy(x, target, reduction="none", ignore_index=-100)
    assert (on_device(mod.forward, x, target) - want).abs().max() < 1e-5


@pytest.mark.parametrize("fn", ["tanh", "exp", "sqrt"])
def test_a_float_function_of_a_where_between_integers(tmp_path, fn):
    """where(p, 2.0 - 2.0, 2.0 - 2.0) folds to where(p, 0, 0), an int32 tile in the kernel: it was labelled fp32,
    so tanh (as a base-2 logistic), exp and sqrt of it reached Triton's float functions with an integer tile (a
    random spec found it)."""
    body = ("B, S = spec.dims(B=1, S=1024)\nb, i, j, d = spec.axes(b=B, i=S, j=S, d=16)\n"
            "q = spec.input('q', f16, B, S, 16)\nk = spec.input('k', f16, B, S, 16)\n"
            f"s = sum(d, q[b, i, d] * k[b, j, d]) / 4 + {fn}(where(i >= j + 2, (2.0 - 2.0), (2.0 - 2.0)))\n"
            "s = where(i >= j + 3, s, -inf)\nm = max(j, s)\np = exp(s - where(m == -inf, 0, m))\n"
            "spec.output('o', f32, sum(j, p) , b, i)\n")
    path = write(tmp_path, f"where_between_integers_{fn}", body)
    for seq in (1, 37):   # every row empty, and rows past the block
        assert_close(path, {"B": 1, "S": seq}, seed=seq)
