"""Specs no one kernel runs -- reductions over several long axes jointly -- are planned as stages (plan/stages.py):
each stage a spec the compiler fuses on its own, its result read back by the next; the module runs them in order.
"""
import pytest
import sympy as sp
import torch
import torch.nn.functional as F

from conftest import DEVICE, SPECS, compiled, on_device, spec_variant
from neptune_eqsat import ir
from neptune_eqsat.compiler import optimize
from neptune_eqsat.proof.symbolic import proves
from neptune_eqsat.rules.statistics import RULES as STATISTICS
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import load_spec
from neptune_eqsat.training import Differentiable

STANDARDIZE = '''
from neptune_eqsat.spec import *
spec = Spec("standardize_2d")
B, N, M = spec.dims(B=8, N=4096, M=4096)
b, i, j = spec.axes(b=B, i=N, j=M)
x = spec.input("x", f32, B, N, M)
mean = sum(i, sum(j, x[b, i, j])) / N / M
var = sum(i, sum(j, (x[b, i, j] - mean) * (x[b, i, j] - mean))) / N / M
spec.output("y", f32, (x[b, i, j] - mean) / sqrt(var + 1e-5), b, i, j)
'''


def _run(path: str, sizes: dict, prepare=None):
    result, mod = compiled(path)
    inputs = random_inputs(result.spec, sizes, seed=4)
    if prepare:
        prepare(inputs)
    out = on_device(mod.forward, *inputs.values())
    return result, inputs, out, evaluate(result.spec, inputs)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_a_softmax_over_two_long_axes_runs_as_stages(tmp_path, dtype):
    """37 x 45 per batch: neither is a multiple of a block; rows 0 and 5 of the first batch are all -inf."""
    def minus_inf_rows(inputs):
        inputs["x"][0, 0] = float("-inf")
        inputs["x"][0, 5] = float("-inf")
    path = spec_variant(tmp_path, "joint_softmax", {"f16": dtype})
    result, _, out, ref = _run(path, {"B": 2, "N": 37, "M": 45}, minus_inf_rows)
    assert len(result.stages) == 4 and result.summary().startswith("4 stages, then ")
    assert not torch.isnan(out).any()
    assert torch.all(out[0, 0] == 0) and torch.all(out[0, 5] == 0)
    assert (out.double() - ref).abs().max().item() <= tolerance(dtype) * ref.abs().max().item()
    assert torch.allclose(out.double().sum(dim=(1, 2)), torch.ones(2, dtype=torch.float64), atol=1e-2)


def test_standardizing_over_two_long_axes_matches_torch_layer_norm(tmp_path):
    path = tmp_path / "standardize_2d.py"
    path.write_text(STANDARDIZE)
    result, inputs, out, ref = _run(str(path), {"B": 3, "N": 19, "M": 33})
    assert result.stages
    x = inputs["x"].double()
    torch_ln = F.layer_norm(x, x.shape[1:], eps=1e-5)
    assert (out.double() - torch_ln).abs().max().item() < 1e-4
    assert (out.double() - ref).abs().max().item() < 1e-4


def test_explain_names_each_stage_and_its_plan():
    result, _ = compiled(str(SPECS / "joint_softmax.py"))
    text = result.explain()
    assert "no one kernel runs this spec" in text
    for name, what in (("stage0[b, i]", "max(j, x[b, i, j])"), ("stage1[b]", "max(i, stage0[b, i])"),
                       ("stage3[b]", "sum(i, stage2[b, i])")):
        assert f"{name} = {what}" in text
    assert "the last kernel:" in text


def test_a_spec_one_kernel_runs_is_not_staged():
    result, _ = compiled(str(SPECS / "softmax.py"))
    assert result.stages == ()
    assert "stages" not in result.summary()


def test_the_gradient_of_a_staged_spec_matches_float64_autograd():
    """The backward's own kernels reduce over (i, j) jointly too, and are staged the same way."""
    spec = load_spec(SPECS / "joint_softmax.py").retyped("f32")
    inputs = random_inputs(spec, {"B": 2, "N": 19, "M": 21}, seed=5)
    x = inputs["x"].clone().to(DEVICE).requires_grad_(True)
    out = Differentiable(spec)(x)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    out.backward(g.float().to(DEVICE))
    ref = inputs["x"].double().requires_grad_(True)
    evaluate(spec, {"x": ref}, differentiable=True).backward(g)
    assert (x.grad.cpu().double() - ref.grad).abs().max().item() < 1e-3 * ref.grad.abs().max().item()


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm"])
def test_a_few_very_long_rows_are_staged_so_every_kernel_fills_the_gpu(name):
    """Priced at 4 rows of 2^20: one kernel would stream 4 rows on 4 programs and cannot be split (it writes along
    its loop axis), so the row statistics become stages (each split into chunks) and the last kernel writes in
    parallel. The module runs any size: checked at 3 rows of 77."""
    result = optimize(str(SPECS / f"{name}.py"), sizes={"R": 4, "N": 1 << 20})
    assert result.stages and "writes along its loop axis j with 4 programs" in result.explain()
    assert all(r.chosen.family.startswith("split") for _, r in result.stages)
    mod = load_module(result.source, result.spec.name)
    inputs = random_inputs(result.spec, {"R": 3, "N": 77}, seed=7)
    out = on_device(mod.forward, *inputs.values()).double()
    ref = evaluate(result.spec, inputs)
    assert (out - ref).abs().max().item() <= tolerance(result.spec.output_dtype) * max(1.0, ref.abs().max().item())
    if name == "layernorm":
        x, w, b = (t.double() for t in inputs.values())
        assert (out - F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)).abs().max().item() < 1e-2


def test_a_softmax_s_statistics_are_staged_as_one_log_sum_exp():
    """Rewritten by the proved rules of rules/statistics.py, softmax and log-softmax stage m + log(sum_j exp(x -
    m)) once (its own plan rolls both in one pass) instead of the maximum and the sum as two passes; a wrong
    form of the rule is not proved."""
    for name in ("softmax", "log_softmax"):
        result = optimize(str(SPECS / f"{name}.py"), sizes={"R": 4, "N": 1 << 20})
        (stage, part), = result.stages
        assert ir.show(stage.spec.output_term).startswith("(max(j, x[r, j]) + log(sum(j, exp(")
        assert part.chosen.sched.passes == 1
    a, m = sp.symbols("a m", real=True)
    assert not proves(sp.exp(a - m) / sp.Symbol("l", positive=True),
                      sp.exp(a - (m - sp.log(sp.Symbol("l", positive=True)))))
    assert all(r.proof[1] for r in STATISTICS)


def test_a_module_of_stages_checks_its_inputs_and_takes_no_config():
    """Before, a wrong dtype was converted without a word, an extra input dropped, a config ignored."""
    result = optimize(str(SPECS / "softmax.py"), sizes={"R": 4, "N": 1 << 20})
    assert result.staged_because
    mod = load_module(result.source, "softmax_few_long_rows")
    x = torch.randn(2, 9)
    with pytest.raises(TypeError, match=r"x: expected a torch.Tensor of dtype torch.float32, got torch.float16"):
        mod.forward(x.half())
    with pytest.raises(TypeError, match=r"forward takes 1 inputs \(x\), got 2"):
        mod.forward(x, x)
    with pytest.raises(TypeError, match=r"a module of stages takes no config"):
        mod.forward(x, config={"BLOCK_J": 64})
