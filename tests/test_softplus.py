"""A scalar op added to the registry alone (`softplus` in ir/ops.py) runs through the whole pipeline: the spec
language and the evaluators read it, rules prove and fire around it, codegen lowers it, and the backward pass
differentiates it. `specs/softplus_attention.py` uses it: each key weighted by softplus(score), causal,
normalized by the row's weight."""
import pytest
import torch

from conftest import DEVICE, SPECS, run_against_reference, spec_variant
from neptune_eqsat import spec as language
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.plan.autodiff import differentiate
from neptune_eqsat.spec import load_spec
from neptune_eqsat.training import Differentiable

SMALL = {"H, D = 32, 128": "H, D = 2, 16"}


def test_the_spec_language_has_every_unary_op_of_the_registry():
    assert language.softplus(0.0) == pytest.approx(0.6931471805599453)
    assert "softplus" in language.__all__


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_softplus_attention_against_float64(tmp_path, dtype):
    """Rows past the first three keep nothing (`j + 3 <= i`): their output is 0, never NaN; 21 keys are not a
    multiple of the block."""
    path = spec_variant(tmp_path, "softplus_attention", {**SMALL, "j <= i": "j + 3 <= i", "f16": dtype})
    out, ref, err = run_against_reference(path, {"B": 2, "S": 21}, seed=3)
    assert not torch.isnan(out).any()
    assert torch.all(out[:, :, :3] == 0)
    assert err < tolerance(dtype) * max(1.0, ref.abs().max().item()), err


def test_softplus_is_differentiated_from_its_registry_derivative(tmp_path):
    spec = load_spec(spec_variant(tmp_path, "softplus_attention", {**SMALL, "f16": "f32"}))
    inputs = random_inputs(spec, {"B": 1, "S": 13}, seed=5)
    xs = [t.clone().to(DEVICE).requires_grad_(True) for t in inputs.values()]
    assert differentiate(spec).wrt == ("q", "k", "v")
    out = Differentiable(spec)(*xs)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    out.backward(g.float().to(DEVICE))
    ref = {n: t.detach().clone().double().requires_grad_(True) for n, t in inputs.items()}
    evaluate(spec, ref, differentiable=True).backward(g)
    for x, (n, r) in zip(xs, ref.items()):
        scale = max(1.0, r.grad.abs().max().item())
        assert (x.grad.cpu().double() - r.grad).abs().max().item() / scale < 4 * tolerance("f32"), n


def test_an_op_without_a_derivative_is_refused_by_name(monkeypatch):
    """An op that declares neither a derivative nor that it is piecewise constant is not silently given 0."""
    import dataclasses
    from neptune_eqsat.ir import ops
    monkeypatch.setitem(ops.UN, "softplus", dataclasses.replace(ops.UN["softplus"], derivative=None))
    with pytest.raises(ValueError, match="softplus has no derivative in the op registry"):
        differentiate(load_spec(SPECS / "softplus_attention.py"))
