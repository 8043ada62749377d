"""Specs written without the empty-row guard `where(m == -inf, 0, m)`: a rolled block or a split chunk whose
elements are all -inf has a partial maximum of -inf, and exp(x - max) there must be 0, not NaN
(-inf - -inf). The rule guard-partial-max adds the guarded form and the cost model prices the unguarded one
as a risk in plans that repair, so every plan of such a spec matches float64 wherever the spec is defined."""
import pytest
import torch

from conftest import on_device, spec_variant
from neptune_eqsat.compiler import optimize
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.ir import walk
from neptune_eqsat.runtime.loader import load_module

DTYPES = ["f16", "bf16", "f32"]
UNGUARDED_WINDOW = {"H, HKV, D = 32, 8, 128": "H, HKV, D = 2, 1, 16", "CAP, WINDOW = 50.0, 4096": "CAP, WINDOW = 50.0, 5",
                    "p = exp(s - where(m == -inf, 0, m))": "p = exp(s - m)", "/ where(l == 0, 1, l)": "/ l"}


def _check(path: str, plan: str, sizes: dict, config: dict | None = None, prepare=None):
    result = optimize(path, plan=plan)
    assert result.chosen.family == plan
    assert any(t.op == "where" and t.args[0].attrs == ("eq",) for t in walk(result.chosen.term)), "no guarded max"
    mod = load_module(result.source, result.spec.name)
    inputs = random_inputs(result.spec, sizes, seed=2)
    if prepare:
        prepare(inputs)
    ref = evaluate(result.spec, inputs)
    out = on_device(mod.forward, *inputs.values(), **({"config": config} if config else {}))
    assert not torch.isnan(ref).any()
    assert not torch.isnan(out).any(), f"{torch.isnan(out).sum().item()} NaN in the {plan} plan's output"
    infinite = torch.isinf(ref)   # log-softmax of a -inf logit
    assert torch.equal(out.double()[infinite], ref[infinite])
    out, ref = out.double()[~infinite], ref[~infinite]
    err = (out - ref).abs().max().item()
    assert err <= tolerance(result.spec.output_dtype) * max(1.0, ref.abs().max().item()), err


@pytest.mark.parametrize("plan", ["rolled", "split"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_windowed_attention_without_the_guard(tmp_path, plan, dtype):
    """Keys i-4 .. i: past the first block, a row's first visited blocks (and most chunks) hold no key."""
    path = spec_variant(tmp_path, "window_pf", {**UNGUARDED_WINDOW, "f16": dtype})
    _check(path, plan, {"B": 1, "S": 40}, {"CHUNKS": 3} if plan == "split" else None)


def _minus_inf_prefix(inputs):
    """Rows 1 and 3 start with 21 logits of -inf: their first block of 16 is empty, the next one is not."""
    x = inputs["x"]
    x[1, :21] = float("-inf")
    x[3, :21] = float("-inf")
    if "target" in inputs:   # the label's logit is finite
        inputs["target"].fill_(30.0)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cross_entropy"])
def test_row_softmaxes_whose_first_block_is_minus_inf(tmp_path, name):
    path = spec_variant(tmp_path, name, {f'Spec("{name}")': f'Spec("{name}_inf_prefix")'})
    _check(path, "rolled", {"R": 5, "N": 45, "V": 45}, {"BLOCK_J": 16}, _minus_inf_prefix)


def test_cross_entropy_split_with_an_empty_chunk(tmp_path):
    path = spec_variant(tmp_path, "cross_entropy", {'Spec("cross_entropy")': 'Spec("cross_entropy_empty_chunk")'})
    _check(path, "split", {"R": 5, "V": 45}, {"BLOCK_J": 16, "CHUNKS": 3}, _minus_inf_prefix)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_attention_then_a_norm_of_its_output_split(tmp_path, dtype):
    """An RMSNorm of causal attention's output: in a split plan the early rows' later chunks are empty."""
    path = spec_variant(tmp_path, "attention_rmsnorm", {
        "H, D = 32, 128": "H, D = 2, 16", "f16": dtype,
        "s = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)":
            "s = where(j <= i, sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D), -inf)"})
    _check(path, "split", {"B": 1, "S": 37}, {"CHUNKS": 3})
