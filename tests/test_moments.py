"""Sums of a polynomial in a value that waits for other reductions (LayerNorm's squared deviation from the
mean) roll into one pass, repaired by the prefix's lower moments; with the mean read over the prefix's own
count the loop is Welford's, so rows far from zero keep their precision."""
import pytest
import sympy as sp
import torch

from neptune_eqsat import ir
from neptune_eqsat.compiler import optimize
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.runtime.loader import load_module

from conftest import SPECS, on_device

LAYERNORM = SPECS / "layernorm.py"


def layernorm_variant(tmp_path, dtype: str):
    path = tmp_path / f"layernorm_{dtype}.py"
    path.write_text(LAYERNORM.read_text().replace("f16", dtype).replace('Spec("layernorm")', f'Spec("layernorm_{dtype}")'))
    return path


def compiled(path):
    result = optimize(path)
    return result, load_module(result.source, result.spec.name)


def test_layernorm_rolls_into_one_pass_over_the_count():
    result = optimize(LAYERNORM)
    chosen = result.chosen
    assert chosen.family == "rolled" and chosen.sched.passes == 1
    fired = result.saturation.fired
    assert fired["roll-sum-moments-square-of-sub"] and fired["roll-sum-moments-sub"] and fired["mean-as-count"]
    counts = [t for t in ir.walk(chosen.term) if t.op == "red" and t.args[0] == ir.const(1.0)]
    assert counts, "the mean is not read over the prefix's count"
    assert not any(ir.show(t) for t in ir.walk(chosen.term) if t.op == "dim"), ir.show(chosen.term)
    assert not fired["split-roll-sum-mul"], "a moment-repaired sum was split with a repair it does not have"
    assert "sum_j (u - x)**2 at r' = the sum at r" in "\n".join(result.explain().splitlines())


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_layernorm_matches_torch_and_float64_at_odd_sizes(tmp_path, dtype):
    result, mod = compiled(layernorm_variant(tmp_path, dtype))
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)
    R, N = 5, 77
    x = (torch.randn(R, N, generator=g) * 3 + 2).to(torch_dtype)
    w, b = torch.randn(N, generator=g).to(torch_dtype), torch.randn(N, generator=g).to(torch_dtype)
    out = on_device(mod.forward, x, w, b)
    ref = evaluate(result.spec, {"x": x, "w": w, "b": b})
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype)
    torch_ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), eps=1e-5)
    assert (ref - torch_ref).abs().max().item() < 1e-9   # the spec is torch's LayerNorm
    # a loop block left 0 is sized to the row by the launcher (the GPU default for rows of up to 32768)
    whole = on_device(mod.forward, x, w, b, config={"BLOCK_J": 0})
    assert (whole.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype)


def test_rows_far_from_zero_keep_their_precision(tmp_path):
    """x = 1000 + noise in fp32: a one-pass variance over the whole row's count (or E[x^2] - E[x]^2) loses
    about 0.3 here; over the prefix's own mean the error is that of torch's two-pass LayerNorm."""
    _, mod = compiled(layernorm_variant(tmp_path, "f32"))
    g = torch.Generator().manual_seed(1)
    R, N = 3, 1000
    x = torch.randn(R, N, generator=g) + 1000
    w, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
    ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), eps=1e-5)
    ours = (on_device(mod.forward, x, w, b).double() - ref).abs().max().item()
    theirs = (torch.nn.functional.layer_norm(x, (N,), w, b, eps=1e-5).double() - ref).abs().max().item()
    assert ours < max(10 * theirs, 1e-3), (ours, theirs)


def test_unbiased_variance_written_the_other_way_round_rolls(tmp_path):
    """(mean - x)^2 over N - 1, one value per row: the same moments, another body of the table."""
    path = tmp_path / "variance.py"
    path.write_text("from neptune_eqsat.spec import *\n\n"
                    "spec = Spec('unbiased_variance')\n"
                    "R, N = spec.dims(R=64, N=32768)\n"
                    "r, j = spec.axes(r=R, j=N)\n"
                    "x = spec.input('x', f32, R, N)\n"
                    "mean = sum(j, x[r, j]) / N\n"
                    "spec.output('v', f32, sum(j, (mean - x[r, j]) * (mean - x[r, j])) / (N - 1), r)\n")
    result, mod = compiled(path)
    assert result.chosen.sched.passes == 1 and result.saturation.fired["roll-sum-moments-square-of-rsub"]
    inputs = random_inputs(result.spec, {"R": 4, "N": 53}, seed=5)
    out = on_device(mod.forward, *inputs.values())
    assert torch.allclose(out.double(), inputs["x"].double().var(-1), rtol=1e-4, atol=1e-5)


def test_a_wrong_moment_is_refused(monkeypatch):
    """The obligation is the Taylor expansion on a symbolic prefix: a coefficient off by one fails it, and
    the numeric check finds a counterexample."""
    from neptune_eqsat.rules import moments
    right = moments.moments("square-of-sub")
    wrong = tuple((k, c + 1 if k == 1 else c, name) for k, c, name in right)
    monkeypatch.setattr(moments, "moments", lambda body: wrong)
    rule = next(r for r in moments.RULES if r.name == "roll-sum-moments-square-of-sub")
    statement, proved = rule.obligation()
    assert not proved, statement
    assert rule.counterexample(50) is not None
    assert right[0][1] == sp.Integer(-2)


def test_long_rows_split_into_chunks_combined_by_their_moments(tmp_path):
    """Few rows of a million elements: the variance splits over chunks of the row, and each chunk's partial
    is moved to the global mean by its count and first moment (Chan's combine, derived, not written); ragged
    chunks and rows far from zero keep their precision."""
    path = tmp_path / "row_variance.py"
    path.write_text("from neptune_eqsat.spec import *\n\n"
                    "spec = Spec('row_variance')\n"
                    "R, N = spec.dims(R=4, N=1048576)\n"
                    "r, j = spec.axes(r=R, j=N)\n"
                    "x = spec.input('x', f32, R, N)\n"
                    "mean = sum(j, x[r, j]) / N\n"
                    "spec.output('v', f32, sum(j, (x[r, j] - mean) * (x[r, j] - mean)) / N, r)\n")
    result, mod = compiled(path)
    assert result.chosen.family == "split"
    assert result.saturation.fired["split-roll-sum-moments-square-of-sub"]
    g = torch.Generator().manual_seed(2)
    for chunks, offset in ((7, 1000.0), (3, 0.0)):
        x = torch.randn(3, 1001, generator=g) * 2 + offset
        config = {**mod.INTERPRETER_CONFIG, "CHUNKS": chunks}
        ref = x.double().var(-1, unbiased=False)
        ours = (on_device(mod.forward, x, config=config).double() - ref).abs().max().item()
        assert ours < 1e-5 * ref.abs().max().item(), (chunks, offset, ours)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_linear_cross_entropy_never_stores_the_logits_and_matches_torch(tmp_path, dtype):
    """Two long axes: the log-sum-exp loops over the vocabulary, each block's logits a matrix product over the
    hidden dim reduced in blocks inside that loop (and the label's logit in a loop of its own). One pass, and
    the loss equals torch's cross-entropy of h W^T in float64, at sizes off every block."""
    path = tmp_path / f"linear_cross_entropy_{dtype}.py"
    text = (SPECS / "linear_cross_entropy.py").read_text().replace("HIDDEN = 4096", "HIDDEN = 300")
    path.write_text(text.replace("f16", dtype).replace('Spec("linear_cross_entropy")',
                                                     f'Spec("linear_cross_entropy_{dtype}")'))
    result, mod = compiled(path)
    assert result.chosen.sched.passes == 1 and result.chosen.sched.chunked == ("d",)
    assert "long axes reduced in blocks of their own inside the loop over v: d (BLOCK_D)" in result.explain()
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(3)
    T, V = 37, 201
    h = (torch.randn(T, 300, generator=g) * 0.2).to(torch_dtype)
    w = (torch.randn(V, 300, generator=g) * 0.2).to(torch_dtype)
    target = torch.randint(0, V, (T,), generator=g).float()
    loss = on_device(mod.forward, h, w, target)
    ref = torch.nn.functional.cross_entropy(h.double() @ w.double().T, target.long(), reduction="none")
    assert (loss.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype), dtype
    assert (evaluate(result.spec, {"h": h, "w": w, "target": target}) - ref).abs().max().item() < 1e-9


def test_every_plan_family_of_linear_cross_entropy_is_correct(tmp_path):
    """The split plan (chunks of the vocabulary, combined by the derived repair; the label's logit finished by
    the combine) and the rolled one give the same loss."""
    path = tmp_path / "linear_cross_entropy_plans.py"
    path.write_text((SPECS / "linear_cross_entropy.py").read_text().replace("HIDDEN = 4096", "HIDDEN = 300")
                    .replace('Spec("linear_cross_entropy")', 'Spec("linear_cross_entropy_plans")'))
    families = {c.family for c in optimize(path).candidates}
    assert {"split", "rolled"} <= families
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(23, 300, generator=g).half() * 0.2, torch.randn(150, 300, generator=g).half() * 0.2
    target = torch.randint(0, 150, (23,), generator=g).float()
    ref = torch.nn.functional.cross_entropy(h.double() @ w.double().T, target.long(), reduction="none")
    for family in ("split", "rolled"):
        result = optimize(path, plan=family)
        loss = on_device(load_module(result.source, f"lce_{family}").forward, h, w, target)
        assert (loss.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype), family
