"""A read at an index taken from an input's values, under a where that skips some of them (cross-entropy's
ignore_index): the call checks the indices it reads, not those the guard skips. Before, such a read was not
checked at all, and a label past the classes read memory outside the tensor (a silent wrong loss)."""
import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, exp, f32, i64, log, max, sum, where


def _cross_entropy():
    spec = Spec("cross_entropy_ignoring_labels")
    R, V = spec.dims(R=4096, V=32768)
    r, j = spec.axes(r=R, j=V)
    x = spec.input("x", f32, R, V)
    target = spec.input("target", i64, R)
    m = max(j, x[r, j])
    lse = m + log(sum(j, exp(x[r, j] - m)))
    spec.output("loss", f32, where(target[r] == -100, 0, lse - x[r, target[r]]), r)
    return load_module(optimize(spec).source, spec.name).forward


def test_ignored_labels_pass_and_labels_out_of_range_are_refused():
    forward = _cross_entropy()
    x = torch.randn(3, 130, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([5, -100, 7])
    ref = torch.nn.functional.cross_entropy(x.double(), t, ignore_index=-100, reduction="none")
    assert (forward(x, t).double() - ref).abs().max().item() < 1e-5
    for bad in (500, 130, -5):
        t = torch.tensor([bad, -100, 7])
        with pytest.raises(IndexError, match="target"):
            forward(x, t)


def test_a_nan_label_is_named_as_such():
    spec = Spec("cross_entropy_float_labels")
    R, V = spec.dims(R=4096, V=32768)
    r, j = spec.axes(r=R, j=V)
    x = spec.input("x", f32, R, V)
    target = spec.input("target", f32, R)
    m = max(j, x[r, j])
    spec.output("loss", f32, m + log(sum(j, exp(x[r, j] - m))) - x[r, target[r]], r)
    forward = load_module(optimize(spec).source, spec.name).forward
    with pytest.raises(IndexError, match="not whole numbers, or NaN"):
        forward(torch.randn(3, 20), torch.tensor([1.0, float("nan"), 2.0]))
