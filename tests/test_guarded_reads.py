"""A read at an index taken from an input's values, under a where that skips some of them (cross-entropy's
ignore_index): the call checks the indices it reads, not those the guard skips. Before, such a read was not
checked at all, and a label past the classes read memory outside the tensor (a silent wrong loss)."""
import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.runtime.loader import load_module

from conftest import SPECS, spec_variant


def _forward(path) -> object:
    result = optimize(str(path))
    return load_module(result.source, result.spec.name).forward


def test_ignored_labels_pass_and_labels_out_of_range_are_refused(tmp_path):
    forward = _forward(spec_variant(tmp_path, "cross_entropy", {   # integer labels, -100 ignored
        'target = spec.input("target", f32, R)': 'target = spec.input("target", i64, R)',
        "logsumexp - x[r, target[r]], r)": "where(target[r] == -100, 0, logsumexp - x[r, target[r]]), r)"}))
    x = torch.randn(3, 130, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([5, -100, 7])
    ref = torch.nn.functional.cross_entropy(x.double(), t, ignore_index=-100, reduction="none")
    assert (forward(x, t).double() - ref).abs().max().item() < 1e-5
    for bad in (500, 130, -5):
        t = torch.tensor([bad, -100, 7])
        with pytest.raises(IndexError, match="target"):
            forward(x, t)


def test_a_nan_label_is_named_as_such():
    forward = _forward(SPECS / "cross_entropy.py")   # labels held as floats
    with pytest.raises(IndexError, match="not whole numbers, or NaN"):
        forward(torch.randn(3, 20), torch.tensor([1.0, float("nan"), 2.0]))
