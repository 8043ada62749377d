"""The backward pass derived from a spec (autodiff.py) and run by the generated kernels (training.py), checked
against torch's autograd of the unfused math in float64; each op's declared derivative checked against sympy."""
from __future__ import annotations

import math
import pytest
import sympy as sp
import torch

from neptune_eqsat.plan import derivatives
from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.proof import symbolic as proof
from neptune_eqsat.plan.autodiff import differentiate
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.spec import Spec, exp, load_spec, log, sqrt, sum
from neptune_eqsat.spec import max as max_, min as min_, where as where_
from neptune_eqsat.training import Differentiable
from conftest import check_gradients, gradient_tolerance, spec_variant
from hopper_checks import attention_spec

# ---- each op's derivative, proved --------------------------------------------------------------------------------
A, X, Y = sp.symbols("A x y", real=True)
_SYMPY_FORM = proof.SymOps.UN   # the op registry's sympy forms


def _to_sympy(t: ir.Term, env: dict) -> sp.Expr:
    if t in env:
        return env[t]
    op, at, ar = t.op, t.attrs, t.args
    if op == "const":   # the float constants of derivatives are ln 2 and 2 / sqrt(pi), written in floats
        return sp.nsimplify(at[0], [sp.pi, sp.log(2)])
    if op == "un":
        return _SYMPY_FORM[at[0]](_to_sympy(ar[0], env))
    if op == "bin":
        a, b = (_to_sympy(x, env) for x in ar)
        rel = {"gt": sp.Gt, "lt": sp.Lt, "ge": sp.Ge, "le": sp.Le, "eq": sp.Eq}
        return rel[at[0]](a, b) if at[0] in rel else proof.SymOps.BIN[at[0]](a, b)
    if op == "where":
        c, a, b = (_to_sympy(x, env) for x in ar)
        return sp.Piecewise((a, c), (b, True))
    raise AssertionError(f"no sympy form for {op}")


def _equal_on_both_sides(e: sp.Expr, var: sp.Symbol) -> bool:
    """e = 0 proved for var > 0 and for var < 0 (piecewise derivatives: abs, max, min)."""
    p = sp.Symbol("p", positive=True)
    return all(sp.simplify(sp.piecewise_fold(e.subs(var, s))) == 0 for s in (p, -p))


@pytest.mark.parametrize("fn", sorted(n for n, op in ops.UN.items() if op.derivative))
def test_unary_derivative_is_sympys(fn):
    a, t, adj = ir.load("a"), ir.un(fn, ir.load("a")), ir.load("A")
    f = _SYMPY_FORM[fn](X)
    env = {a: X, t: f, adj: A}
    got = _to_sympy(derivatives.unary_adjoint(fn, a, t, adj), env)
    want = A * sp.diff(f, X)
    assert sp.simplify(got - want) == 0 or _equal_on_both_sides(got - want, X), (fn, got, want)


@pytest.mark.parametrize("fn", sorted(n for n, op in ops.BIN.items() if op.derivative))
def test_binary_derivative_is_sympys(fn):
    a, b, adj = ir.load("a"), ir.load("b"), ir.load("A")
    t = ir.bin(fn, a, b)
    f = proof.SymOps.BIN[fn](X, Y)
    env = {a: X, b: Y, t: f, adj: A}
    for got, var in zip(derivatives.binary_adjoints(fn, a, b, t, adj), (X, Y)):
        got = _to_sympy(got, env)
        want = A * sp.diff(f, var)
        gap = sp.simplify(got - want)
        if gap != 0:   # max / min: one argument wins on each side of x = y
            d = sp.Symbol("d", real=True)
            gap = (got - want).subs(X, Y + d)
            assert _equal_on_both_sides(gap, d), (fn, var, got, want)


def test_shift_invariance_is_proved_or_refused():
    spec = load_spec("specs/softmax.py")
    m = next(t for t in ir.walk(spec.output_term) if t.op == "red" and t.attrs[0] == "max")
    assert derivatives.shift_invariant(spec.output_term, m)
    ratio = load_spec("specs/max_normalized_sum.py")   # sum_j x / max_j x depends on the max itself
    m = next(t for t in ir.walk(ratio.output_term) if t.op == "red" and t.attrs[0] == "max")
    assert not derivatives.shift_invariant(ratio.output_term, m)


# ---- gradients of specs against float64 autograd ---------------------------------------------------------------
@pytest.mark.parametrize("name,sizes", [("softmax", {"R": 3, "N": 37}), ("log_softmax", {"R": 2, "N": 45}),
                                        ("cross_entropy", {"R": 3, "V": 37}),
                                        ("max_normalized_sum", {"R": 3, "N": 29})])
def test_row_reductions(name, sizes):
    check_gradients(load_spec(f"specs/{name}.py"), sizes)


def test_cross_entropy_gradient_scatters_at_the_label():
    bw = differentiate(load_spec("specs/cross_entropy.py"))
    assert bw.wrt == ("x",)   # the label is read only as an index: no gradient
    assert any(not p.direct for p in bw.parts)


def test_attention_backward_is_flashattentions():
    """The derivation recomputes the probabilities from saved row statistics and reads the output: no
    tensor of the forward larger than the output is saved, and D_i = sum_e dO * O is a stage of its own."""
    bw = differentiate(attention_spec())
    for stage in bw.stages:
        assert set(stage.axes) <= {"b", "h", "i"}
    assert any("d_o" in {t.attrs[0] for t in ir.walk(s.spec.output_term) if t.op == "load"} for s in bw.stages)
    loops = {p.input: "".join(sorted({t.attrs[1] for t in ir.walk(p.spec.output_term) if t.op == "red"} & {"i", "j"}))
             for p in bw.parts}
    assert loops == {"q": "j", "k": "i", "v": "i"}
    assert any("invariant" in n for n in bw.notes)   # the row max gets no subgradient: its adjoint is 0
    # dK and dV share their loop over the queries: one kernel with two outputs; dQ loops over the keys
    assert sorted(sorted(p.input for p in k.parts) for k in bw.kernels) == [["k", "v"], ["q"]]
    both = next(k for k in bw.kernels if len(k.parts) == 2)
    assert [o.name for o in both.spec.also] == [both.parts[1].spec.output_name]
    # the saved values are further outputs the forward kernel writes too: the row sum (its zero test guards the
    # statistic of empty rows) and the row's logsumexp in base 2, m log2 e + log2 l
    forward = bw.forward_spec()
    assert [o.name for o in forward.also] == list(bw.saved) and len(bw.saved) == 2
    assert all(set(o.axes) == {"b", "h", "i"} for o in forward.also)


def _reads(spec: Spec) -> set[str]:
    return {t.attrs[0] for t in ir.walk(spec.output_term) if t.op == "load"}


@pytest.mark.parametrize("causal", [False, True])
def test_the_row_sum_moves_into_the_exponent(causal):
    """P = exp(s - m) / l and dS = (dP / l + stat) * exp(s - m), as derived, divide by the row sum l in every
    step of the gradient kernels' loops. l is a sum of exponentials, so not negative: the derivation moves it
    into the exponent, P = exp(s - (m + log l)), dS = (dP + stat l) P, and the kernels read one saved row
    value (the logsumexp, in base 2, which the forward writes) and one statistic (-D_i = -sum_e dO * O), as
    FlashAttention's backward does, and compute no reciprocal."""
    bw = differentiate(attention_spec(causal=causal))
    assert any("absorbed" in n for n in bw.notes)
    lse = [n for n, t in bw.saved.items() if any(x.op == "un" and x.attrs[0] == "log" for x in ir.walk(t))]
    assert len(lse) == 1
    stages = {s.name: s for s in bw.stages}
    for kernel in bw.kernels:
        read = set(kernel.spec.inputs) & set(stages)
        assert read == {lse[0], next(n for n in read if n.startswith("stat"))}, read
        assert not any(t.op == "bin" and t.attrs[0] == "div" and t.args[1].op == "load" and t.args[1].attrs[0] in stages
                       for o in (kernel.spec.output_term, *(a.term for a in kernel.spec.also)) for t in ir.walk(o))
    statistic = next(n for n in bw.kernels[0].spec.inputs if n.startswith("stat"))
    # the training forward writes the logsumexp in base 2 from the row max its own loop keeps (scaled by
    # log2 e): no second, unscaled row max beside it
    from neptune_eqsat.compiler import optimize
    plan = optimize(bw.forward_spec(), sizes={"B": 1, "S": 256}).source.split('"""')[1]
    assert plan.count("max(j,") == 1, plan
    assert "d_o" in _reads(stages[statistic].spec)   # -sum_e dO * O itself, not divided by l and multiplied back
    assert not any(t.op == "bin" and t.attrs[0] == "div" for t in ir.walk(stages[statistic].spec.output_term))


def _scaled_by(divisor_of: str) -> Spec:
    """out[r, e] = sum_n exp(x[r, n]) * v[n, e] / g(x[r]) with g a row sum of exp(x) (not negative) or of x
    itself (either sign)."""
    spec = Spec(f"scaled_{divisor_of}")
    R, N = spec.dims(R=4, N=64)
    r, n, e = spec.axes(r=R, n=N, e=16)
    x = spec.input("x", "f32", R, N)
    v = spec.input("v", "f32", N, 16)
    g = sum(n, exp(x[r, n]) if divisor_of == "exp" else x[r, n])
    spec.output("o", "f32", sum(n, exp(x[r, n]) * v[n, e]) / g, r, e)
    spec.validate()
    return spec


def test_a_row_divisor_of_either_sign_stays_a_division():
    """exp(u) / g = exp(u - log g) holds only for g > 0: a row sum of x itself is divided by (its reciprocal
    computed once per row), a row sum of exponentials moves into the exponent; both give float64's gradients."""
    for divisor_of, absorbed in (("x", False), ("exp", True)):
        spec = _scaled_by(divisor_of)
        bw = differentiate(spec)
        assert any("absorbed" in n for n in bw.notes) == absorbed, bw.notes
        check_gradients(spec, {"R": 3, "N": 37})


def test_a_slopes_gradient_is_an_output_of_the_kernel_that_loops_over_its_keys():
    """The ALiBi slope's gradient sums dS * (j - i) over the keys (then over batch and queries on the host): a
    further output of dQ's kernel, which loops over the keys too, not a kernel recomputing dS again."""
    bw = differentiate(attention_spec(slope=True))
    assert sorted(sorted(p.input for p in k.parts) for k in bw.kernels) == [["k", "v"], ["q", "slope"]]
    both = next(k for k in bw.kernels if "slope" in {p.input for p in k.parts})
    assert both.parts[0].input == "q" and set(both.spec.also[0].axes) == {"h", "b", "i"}


def test_atomic_backward_adds_dq_in_the_kernel_of_dk_and_dv():
    """With accumulate, dQ (a loop over the keys, rows over the queries) becomes a further output of the dK and
    dV kernel (a loop over the queries, rows over the keys), added to in fp32 by each key block's program; the
    slope's gradient, which joined dQ's kernel, comes along."""
    bw = differentiate(attention_spec(slope=True), accumulate=True)
    assert len(bw.kernels) == 1
    kernel = bw.kernels[0]
    assert [p.input for p in kernel.parts] == ["v", "k", "q", "slope"]
    assert [o.dtype for o in kernel.spec.also[1:]] == ["f32", "f32"]
    # dQ is added as a product's tile, the slope's gradient as a value per query row
    assert [(p.added, p.added_sum) for p in kernel.parts] == [(False, False)] * 2 + [(True, False), (True, True)]
    assert kernel.adds and kernel.adds_sums


def test_an_added_value_per_row_is_told_by_its_axes_as_the_gluon_kernel_tells_it():
    """An added output is a value per row of the host's loop when all its axes are the host's grid axes or that
    loop, whatever their order; one with a column of the host's tiles is a product's tile. Before, the last axis
    decided (long: a sum), which called dQ laid out [b, h, d, i] a sum and a slope's gradient laid out [b, i, h]
    a product, against the Gluon kernel's own test."""
    from dataclasses import replace
    from neptune_eqsat.plan.autodiff import _value_per_row
    kernel = differentiate(attention_spec(slope=True), accumulate=True).kernels[0]
    host = [p for p in kernel.parts if not p.added]
    dq, slope = (next(p for p in kernel.parts if p.input == n) for n in ("q", "slope"))

    def laid_out(part, axes):
        assert sorted(axes) == sorted(part.spec.output_axes)
        return replace(part, spec=replace(part.spec, output_axes=axes))
    assert not _value_per_row(dq, host) and _value_per_row(slope, host)
    assert not _value_per_row(laid_out(dq, ("b", "h", "d", "i")), host)
    assert _value_per_row(laid_out(slope, ("b", "i", "h")), host)


@pytest.mark.parametrize("options,sizes", [
    ({"kv_heads": 2, "heads": 4, "slope": True, "empty_row": 5}, {"S": 21, "B": 2}),
    pytest.param({"softcap": 20.0, "causal": False}, {"S": 19}, marks=pytest.mark.slow),
])
def test_attention_gradients_added_atomically(options, sizes):
    check_gradients(attention_spec(**options), sizes, deterministic=False)


@pytest.mark.parametrize("options,sizes", [
    pytest.param({}, {"S": 37}, marks=pytest.mark.slow),   # plain causal: the next case adds to it
    ({"kv_heads": 2, "heads": 4, "slope": True, "empty_row": 5}, {"S": 21, "B": 2}),
    ({"softcap": 20.0, "causal": False}, {"S": 19}),
])
def test_attention_gradients(options, sizes):
    check_gradients(attention_spec(**options), sizes)


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("f32", marks=pytest.mark.slow)])
def test_attention_gradients_in_other_dtypes(dtype):   # fp32 gradients: also test_flex_backward's fp32 case
    check_gradients(attention_spec(kv_heads=1, heads=2), {"S": 21}, dtype=dtype)


@pytest.mark.slow   # non-causal attention: the soft-capped case above; decode shapes: test_flex_backward
def test_decode_shaped_attention_gradients():
    spec = load_spec("specs/causal_dc.py")
    small = attention_spec(causal=False)
    assert small.output_axes == spec.output_axes
    check_gradients(small, {"S": 40})


def test_norm_gradients():
    spec = Spec("rmsnorm")
    R, N = spec.dims(R=64, N=4096)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", "f32", R, N)
    w = spec.input("w", "f32", N)
    spec.output("y", "f32", x[r, j] * w[j] / sqrt(sum(j, x[r, j] * x[r, j]) / N + 1e-6), r, j)
    spec.validate()
    errors = check_gradients(spec, {"R": 3, "N": 40})
    assert set(errors) == {"x", "w"}


ROW_VALUES_INSIDE_SUMS = {   # a value per row (an input, a reduction) added inside a sum over the row's columns
    "input_row_value": "sum(j, x[r, j] + t[r])",
    "minus_the_min": "sum(j, x[r, j] - min(j, x[r, j])) + t[r]",
    "centered": "sum(j, (x[r, j] - sum(j, x[r, j]) / N) * t[r])",
    "smoothed_nll": "sum(j, (max(j, x[r, j]) + log(sum(j, exp(x[r, j] - max(j, x[r, j])))) - x[r, j]) * t[r]) / N",
    "fixed_extent": "sum(e, x[r, e] * t[r] + t[r])",
}


@pytest.mark.parametrize("name", sorted(ROW_VALUES_INSIDE_SUMS))
def test_a_row_value_inside_a_sum_gets_the_sums_extent_in_its_gradient(name):
    """d/dt[r] sum(j, x[r, j] + t[r]) is N: the adjoint reaching t[r] is summed over the columns t is broadcast
    along, though it does not vary along them (it came out 1, not N, for inputs and reductions alike)."""
    spec = Spec(name)
    R, N = spec.dims(R=64, N=4096)
    r, j, e = spec.axes(r=R, j=N, e=5)
    x = spec.input("x", "f32", R, N) if name != "fixed_extent" else spec.input("x", "f32", R, 5)
    t = spec.input("t", "f32", R)
    env = dict(x=x, t=t, r=r, j=j, e=e, N=N, sum=sum, max=max_, min=min_, exp=exp, log=log)
    spec.output("y", "f32", eval(ROW_VALUES_INSIDE_SUMS[name], env), r)
    assert set(check_gradients(spec, {"R": 3, "N": 11})) == {"x", "t"}


@pytest.mark.parametrize("outputs", [None, (0,), (1,)], ids=["both", "first", "second"])
def test_every_output_of_a_spec_carries_its_gradient(tmp_path, outputs):
    """A spec with several outputs is a function returning them all; the loss may read any of them (the
    training forward's saved values come after the outputs, not in their place)."""
    spec_file = tmp_path / "softmax_and_lse.py"
    spec_file.write_text(SOFTMAX_AND_LSE)
    check_gradients(load_spec(str(spec_file)), {"R": 3, "N": 21}, outputs=outputs)


def test_optimize_backward_of_several_outputs_gives_them_before_the_saved_values(tmp_path):
    from click.testing import CliRunner

    from neptune_eqsat.cli import main
    from neptune_eqsat.runtime.loader import load_module

    spec_file = tmp_path / "softmax_and_lse.py"
    spec_file.write_text(SOFTMAX_AND_LSE)
    out_file = tmp_path / "softmax_and_lse_kernel.py"
    run = CliRunner().invoke(main, ["optimize", str(spec_file), "--backward", "-o", str(out_file)])
    assert run.exit_code == 0, run.output
    mod = load_module(out_file.read_text(), "softmax_and_lse_kernel")
    x = torch.randn(3, 21, generator=torch.Generator().manual_seed(0))
    (y, lse), saved = mod.forward_saved(x)
    assert len(saved) == len(mod.SAVED) and mod.OUTPUTS == ("y", "lse")
    torch.testing.assert_close(lse, torch.logsumexp(x, 1))
    grad_y = torch.randn_like(y)
    xd = x.double().requires_grad_()
    ref, = torch.autograd.grad(torch.softmax(xd, 1), xd, grad_y.double())
    for kept in (saved, ()):
        g, = mod.backward(x, out=y, grad_out=grad_y, saved=kept)
        torch.testing.assert_close(g.double(), ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(TypeError, match="the gradient of the first output, y, alone"):
        mod.backward(x, out=(y, lse), grad_out=(grad_y, torch.ones_like(lse)))


SOFTMAX_AND_LSE = '''
from neptune_eqsat.spec import *
spec = Spec("softmax_and_lse")
R, N = spec.dims(R=64, N=4096)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N)
m = max(j, x[r, j])
p = exp(x[r, j] - m)
spec.output("y", f32, p / sum(j, p), r, j)
spec.output("lse", f32, m + log(sum(j, p)), r)
'''


@pytest.mark.parametrize("S", [7, 17])
def test_attention_then_a_norm_of_its_rows_at_lengths_off_the_blocks(tmp_path, S):
    """The dV kernel of attention followed by an RMSNorm multiplies the probabilities by a value computed from
    each query row's saved statistics: a padded row loads them as 0, 0 / 0, and NaN * 0 filled every dV with
    NaN at lengths not a multiple of the block; both operands of such a product are zeroed outside."""
    path = spec_variant(tmp_path, "attention_rmsnorm", {"H, D = 32, 128": "H, D = 2, 16"})
    errors = check_gradients(load_spec(path), {"B": 1, "S": S})
    assert set(errors) >= {"v"}


def test_undifferentiable_input_is_named():
    spec = load_spec("specs/cross_entropy.py")
    with pytest.raises(ValueError, match="no input nope"):
        differentiate(spec, ("nope",))


# ---- optimize --backward: one standalone module -----------------------------------------------------------------
SMALL_ALIBI_GQA = '''
from neptune_eqsat.spec import *
spec = Spec("small_alibi_gqa")
B, S = spec.dims(B=1, S=512)
H, HKV, D = 4, 2, 16
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, HKV, S, D)
v = spec.input("v", f16, B, HKV, S, D)
slope = spec.input("slope", f32, H)
s = sum(d, q[b, h, i, d] * k[b, h // 2, j, d]) / sqrt(D) + slope[h] * (j - i)
s = where(i >= j, s, -inf)
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
l = sum(j, p)
spec.output("o", f16, sum(j, cast(p, f16) * v[b, h // 2, j, e]) / where(l == 0, 1, l), b, h, i, e)
'''


@pytest.mark.parametrize("source,sizes", [("specs/cross_entropy.py", {"R": 5, "V": 33}),
                                          pytest.param(SMALL_ALIBI_GQA, {"B": 2, "S": 21}, marks=pytest.mark.slow)],
                         ids=["label", "gqa_alibi"])
def test_optimize_backward_writes_one_standalone_module(tmp_path, source, sizes):
    """The module's backward (kernels, host sums and scatters at a label and at a key head h // G) against
    float64 autograd; it imports only torch and triton."""
    from click.testing import CliRunner

    from neptune_eqsat.cli import main
    from neptune_eqsat.runtime.loader import load_module

    path = source
    if "\n" in source:
        path = tmp_path / "small.py"
        path.write_text(source)
    out = tmp_path / "with_backward.py"
    run = CliRunner().invoke(main, ["optimize", str(path), "--backward", "-o", str(out)])
    assert run.exit_code == 0, run.output
    text = out.read_text()
    assert "neptune_eqsat" not in text.split('"""', 2)[2]   # no import of the compiler
    if "h // 2" in source:   # k's and v's gradients are the group sums themselves, without an fp32 buffer
        assert "grads['k'] = g.expand(t['k'].shape)" in text and "torch.zeros(t['k']" not in text
    spec = load_spec(path)
    module = load_module(text, f"{spec.name}_with_backward")
    inputs = random_inputs(spec, {**spec.typical, **sizes}, seed=4)
    xs = list(inputs.values())
    y, saved = module.forward_saved(*xs)   # the output and the row values, from one kernel
    assert torch.equal(y, module.forward(*xs)) and len(saved) == len(module.SAVED) > 0
    assert module.GRADIENT_KERNELS and set(module.GRADIENT_KERNELS) <= set(module._SOURCES)
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grads = module.backward(*xs, out=y, grad_out=g.to(y.dtype), saved=saved)
    again = module.backward(*xs, out=y, grad_out=g.to(y.dtype))   # the stages compute the row values instead
    for got, want in zip(grads, again):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    ref = {n: t.detach().clone().requires_grad_(n in module.WRT) for n, t in inputs.items()}
    evaluate(spec, ref, differentiable=True).backward(g)
    assert len(grads) == len(module.WRT) > 0
    for n, got in zip(module.WRT, grads):
        want = ref[n].grad
        err = (got.double() - want).abs().max().item() / max(1.0, want.abs().max().item())
        assert err < gradient_tolerance(spec), (n, err)


def test_a_spec_and_its_training_forward_are_different_modules():
    """The forward that also writes the saved values has a cache key of its own: sharing the plain forward's
    once gave one of them the other's module, in whichever order they were first compiled."""
    from neptune_eqsat.training import forward_outputs, run_spec, spec_key
    spec = attention_spec()
    assert spec_key(spec) != spec_key(differentiate(spec).forward_spec())
    inputs = random_inputs(spec, {"B": 1, "S": 9}, seed=1)
    plain = run_spec(spec, inputs)
    out, saved = forward_outputs(spec, inputs)
    assert torch.equal(out, plain) and [s.shape for s in saved] == [plain.shape[:3]] * 2
    assert torch.equal(run_spec(spec, inputs), plain)


def test_every_part_keeps_its_kernel_when_parts_join_others():
    """A part joins a kernel whose outputs hold its axes; a kernel that took in a part keeps it (it once moved
    only its own first part into a larger kernel, dropping the one it had taken in)."""
    from neptune_eqsat.frontend.spec import Dim
    from neptune_eqsat.plan.autodiff import GradPart, _sharing_loops
    spec = Spec("parts")
    spec.axes_ = {"b": Dim("B"), "h": 4, "i": Dim("S"), "j": Dim("S"), "d": 16}

    def part(name, axes):
        sub = Spec(name)
        sub.output_axes = axes
        return GradPart(name, sub, (), axes, (), "j")
    parts = [part("x", ("h", "i")), part("y", ("b", "h", "i")), part("z", ("b", "h", "i", "d"))]
    groups = _sharing_loops(spec, parts)
    assert sorted(p.input for g in groups for p in g) == ["x", "y", "z"]
    assert [[p.input for p in g] for g in groups] == [["y", "x"], ["z"]]


def test_optimize_backward_with_respect_to_some_inputs(tmp_path):
    """--wrt q,k,v leaves ALiBi's slopes out (as a captured tensor that does not require grad): the one-pass
    backward then adds dQ alone across programs, which the Gluon gradient kernel takes."""
    from click.testing import CliRunner

    from neptune_eqsat.cli import main

    path, out = tmp_path / "small.py", tmp_path / "with_backward.py"
    path.write_text(SMALL_ALIBI_GQA.replace("H, HKV, D = 4, 2, 16", "H, HKV, D = 4, 2, 128"))
    run = CliRunner().invoke(main, ["optimize", str(path), "--backward", "--atomic", "--wrt", "q,k,v", "-o", str(out)])
    assert run.exit_code == 0, run.output
    text = out.read_text()
    assert "WRT = ('q', 'k', 'v')" in text and "tma_reduce_add(" in text


def test_a_hopper_backward_takes_one_pass_where_the_gluon_kernel_adds(tmp_path, monkeypatch):
    """Where one pass suits the device, ALiBi's gradients of q, k and v take it (dQ added by the Gluon kernel).
    With the slopes' gradient (a sum per query row added beside dQ: slower than the two passes), or with a head
    dimension of 16, which the Gluon kernel does not take (its added products would run on Triton's atomics),
    they take the two passes, as every backward does where one pass does not suit (the CPU)."""
    from neptune_eqsat import training

    cpu = torch.device("cpu")

    def adds(dim, wrt):
        path = tmp_path / f"small{dim}.py"
        path.write_text(SMALL_ALIBI_GQA.replace("H, HKV, D = 4, 2, 16", f"H, HKV, D = 4, 2, {dim}"))
        return any(k.adds for k in training.backward_for_device(load_spec(str(path)), wrt, cpu).plan.kernels)

    assert not adds(128, ("q", "k", "v"))
    monkeypatch.setattr(training, "one_pass_suits", lambda device: True)
    assert adds(128, ("q", "k", "v")) and not adds(128, None) and not adds(16, ("q", "k", "v"))


def test_one_pass_suits_a_hopper_gpu_unless_deterministic_algorithms_are_asked(monkeypatch):
    from neptune_eqsat.training import one_pass_suits

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert one_pass_suits(cuda) and not one_pass_suits(torch.device("cpu"))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not one_pass_suits(cuda)
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not one_pass_suits(cuda)


def test_a_differentiable_spec_under_activation_checkpointing():
    """torch.utils.checkpoint's default (non-reentrant) form over a Differentiable spec gives the plain call's
    gradients; before, its backward unpacked the saved tensors three times and checkpointing refused."""
    from torch.utils.checkpoint import checkpoint
    from conftest import SPECS
    spec = load_spec(str(SPECS / "softmax.py"))
    inputs = random_inputs(spec, {**spec.typical, **{d: 19 for d in spec.typical}}, seed=3)
    fn = Differentiable(spec)
    grads = []
    for run in (fn, lambda *xs: checkpoint(fn, *xs, use_reentrant=False)):
        xs = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs.values()]
        run(*xs).square().sum().backward()
        grads.append([x.grad for x in xs if x.requires_grad])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_a_differentiable_spec_inside_a_compiled_function():
    """A torch.compile'd function calling a Differentiable spec runs it as it is (its kernels' launches are not
    traced) and gets eager's gradients; before, dynamo traced into the launcher and failed."""
    from conftest import SPECS
    spec = load_spec(str(SPECS / "softmax.py"))
    fn = Differentiable(spec)
    x = torch.randn(7, 33, generator=torch.Generator().manual_seed(4)).requires_grad_()
    grads = []
    for run in (lambda x: fn(x).square().sum(), torch.compile(lambda x: fn(x).square().sum())):
        run(x).backward()
        grads.append(x.grad)
        x.grad = None
    assert torch.equal(*grads)


IGNORED_LABELS = {   # a label of -100 the loss ignores: its row reads nothing, guarded by the where
    "cross_entropy": ("x = spec.input('x', f32, R, V)\nm = max(j, x[r, j])\nlse = m + log(sum(j, exp(x[r, j] - m)))\n"
                      "spec.output('loss', f32, where(target[r] == -100, 0, lse - x[r, target[r]]), r)\n"),
    "linear_cross_entropy": ("h = spec.input('h', f32, R, 8)\nw = spec.input('w', f32, V, 8)\n"
                             "logit = sum(d, h[r, d] * w[j, d])\nm = max(j, logit)\n"
                             "lse = m + log(sum(j, exp(logit - m)))\nspec.output('loss', f32, where(target[r] == -100, "
                             "0, lse - sum(d, h[r, d] * w[target[r], d])), r)\n"),
}


@pytest.mark.parametrize("name", sorted(IGNORED_LABELS))
def test_gradients_of_a_loss_that_ignores_some_labels(tmp_path, name):
    """The where that guards the read at an ignored label guards its gradient too: the host's scatter at
    index -100 raised IndexError (or, past 100 classes, added at another class), and the gradient kernel of the
    linear form read the weights at -100 unguarded."""
    import torch.nn.functional as F
    path = tmp_path / f"{name}.py"
    path.write_text("from neptune_eqsat.spec import *\nspec = Spec('" + name + "')\nR, V = spec.dims(R=64, V=512)\n"
                    "r, j, d = spec.axes(r=R, j=V, d=8)\ntarget = spec.input('target', f32, R)\n"
                    + IGNORED_LABELS[name])
    g = torch.Generator().manual_seed(0)
    target = torch.tensor([3.0, -100.0, 10.0, -100.0])
    if name == "cross_entropy":
        x = torch.randn(4, 37, generator=g)
        ours, ref = [x.clone().requires_grad_()], [x.double().requires_grad_()]
        logits = lambda a: a   # noqa: E731
    else:
        h, w = torch.randn(4, 8, generator=g), torch.randn(37, 8, generator=g)
        ours, ref = [h.clone().requires_grad_(), w.clone().requires_grad_()], [h.double().requires_grad_(),
                                                                                w.double().requires_grad_()]
        logits = lambda a, b: a @ b.T   # noqa: E731
    Differentiable(load_spec(str(path)))(target, *ours).sum().backward()   # (the spec declares the labels first)
    F.cross_entropy(logits(*ref), target.long(), ignore_index=-100, reduction="sum").backward()
    for a, r in zip(ours, ref):
        assert (a.grad.double() - r.grad).abs().max().item() < 1e-5


def test_a_maximum_with_ties_splits_its_gradient():
    """Every element equal to a row's maximum took the whole gradient (a row of four equal values passed back
    4); it is split among them, as torch.amax splits it."""
    spec = Spec("row_max")
    R, N = spec.dims(R=64, N=4096)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", "f32", R, N)
    spec.output("y", "f32", max_(j, x[r, j]) - 2 * min_(j, x[r, j]), r)
    xs = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], requires_grad=True)
    Differentiable(spec)(xs).sum().backward()
    ref = xs.detach().clone().requires_grad_()
    (ref.amax(1) - 2 * ref.amin(1)).sum().backward()
    torch.testing.assert_close(xs.grad, ref.grad)


def test_a_logsumexp_of_a_row_the_mask_empties_passes_back_no_gradient():
    """log of an empty row's sum: its derivative A / 0 became NaN under the mask even where A was 0."""
    spec = Spec("masked_lse")
    R, N = spec.dims(R=64, N=64)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", "f32", R, N)
    keep = spec.input("keep", "bool", R, N)
    s = where_(keep[r, j], x[r, j], -math.inf)
    m = max_(j, s)
    spec.output("lse", "f32", m + log(sum(j, exp(s - where_(m == -math.inf, 0, m)))), r)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(3, 8, generator=g)
    keep_ = torch.rand(3, 8, generator=g) > 0.4
    keep_[0] = False
    ours, ref = xs.clone().requires_grad_(), xs.double().requires_grad_()
    lse = Differentiable(spec)(ours, keep_)
    torch.where(lse.isfinite(), lse, 0).sum().backward()
    want = torch.logsumexp(ref.masked_fill(~keep_, -math.inf), 1)
    torch.where(want.isfinite(), want, 0).sum().backward()
    assert not ours.grad.isnan().any()
    assert (ours.grad.double() - ref.grad).abs().max().item() < 1e-5


def test_a_split_gradient_kernel_whose_combine_runs_over_a_size_no_input_carries():
    """dw of `sum(j, x - min(j, x) + w[j] * j)` sums over the rows in chunks; its combine writes a row over N,
    which none of its inputs carries: the size comes from the kernel that calls it (the combine lost it once
    sizes that no input carries were left out of kernels)."""
    spec = Spec("spread_rows")
    R, N = spec.dims(R=64, N=1024)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", "f32", R, N)
    w = spec.input("w", "f32", N)
    e = 0.5 + x[r, j]
    spec.output("y", "f32", sum(j, e - min_(j, e) + w[j] * (j * 0.05)), r)
    assert set(check_gradients(spec, {"R": 1, "N": 19}, seed=19)) == {"x", "w"}



def test_a_second_order_gradient_of_a_spec_is_refused():
    """create_graph=True through a Differentiable spec's backward kernels is refused by name (before, the
    gradient came back detached: a gradient penalty silently counted as a constant)."""
    from conftest import SPECS
    fn = Differentiable(load_spec(str(SPECS / "softmax.py")))
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(5)).requires_grad_()
    with pytest.raises(RuntimeError, match="not differentiable again"):
        torch.autograd.grad(fn(x).square().sum(), x, create_graph=True)


def test_a_float64_spec_gets_float64_gradients():
    """Its saved values and row statistics are kept in fp64 (before, fp32: gradients off by 1e-8)."""
    spec = Spec("softmax_f64")
    R, N = spec.dims(R=64, N=1024)
    r, j = spec.axes(r=R, j=N)
    x = spec.input("x", "f64", R, N)
    m = max_(j, x[r, j])
    e = exp(x[r, j] - m)
    spec.output("y", "f64", e / sum(j, e), r, j)
    X = torch.randn(3, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = torch.randn(3, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours, ref = X.clone().requires_grad_(), X.clone().requires_grad_()
    Differentiable(spec)(ours).backward(g)
    torch.softmax(ref, -1).backward(g)
    assert (ours.grad - ref.grad).abs().max().item() < 1e-12
