"""fp16, bf16 and fp32 are compiled alike: the same plans, each checked against float64 under the interpreter."""
import functools
import math
import subprocess
import sys

import pytest
import torch

from conftest import SPECS, compiled, on_device
from neptune_eqsat.compiler import optimize
from neptune_eqsat.ir import TORCH_NAMES, walk
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import load_spec


@functools.lru_cache(maxsize=None)
def compile_retyped(name: str, dtype: str):
    result = optimize(load_spec(SPECS / f"{name}.py").retyped(dtype))
    return result, load_module(result.source, f"{result.spec.name}_{dtype}")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("name, family, sizes", [
    ("causal_pf", "rolled", {"B": 1, "S": 21}),
    ("gqa_dc", "split+packed", {"B": 1, "Q": 1, "SKV": 45}),
])
def test_every_dtype_fuses_like_fp16(name, family, sizes, dtype):
    fp16, _ = compiled(str(SPECS / f"{name}.py"))
    result, mod = compile_retyped(name, dtype)
    assert fp16.chosen.family == result.chosen.family == family
    assert result.chosen.sched.passes == 1
    assert all(t.dtype in (dtype, "f32") for t in result.spec.inputs.values())
    inputs = random_inputs(result.spec, sizes, seed=3)
    out = on_device(mod.forward, *inputs.values())
    assert out.dtype == {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    err = (out.double() - evaluate(result.spec, inputs)).abs().max().item()
    assert err <= tolerance(dtype), err


def test_fp32_products_in_tf32_by_choice():
    """F32_DOT picks full fp32 ("ieee", the default) or TF32 for products of fp32 operands."""
    result, mod = compile_retyped("causal_pf", "f32")
    assert mod.CONFIG["F32_DOT"] == mod.INTERPRETER_CONFIG["F32_DOT"] == "ieee"
    inputs = random_inputs(result.spec, {"B": 1, "S": 20}, seed=1)
    ref = evaluate(result.spec, inputs)
    for precision in ("ieee", "tf32"):
        out = on_device(mod.forward, *inputs.values(), config={"F32_DOT": precision})
        assert (out.double() - ref).abs().max().item() <= 2e-3


def test_bf16_products_are_right_under_the_interpreter():
    """Triton's interpreter multiplies bf16 tiles wrongly; the kernels multiply them as fp32 there."""
    result, mod = compile_retyped("global_pf", "bf16")
    assert "BF16_DOT" in result.source
    inputs = random_inputs(result.spec, {"B": 1, "S": 33}, seed=2)
    err = (on_device(mod.forward, *inputs.values()).double() - evaluate(result.spec, inputs)).abs().max().item()
    assert err <= tolerance("bf16")


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_a_constant_cast_to_the_inputs_dtype(dtype):
    """sigmoid attention multiplies V by cast(1, dtype): a constant made in the kernel's dtype, which Triton's
    interpreter cannot make in bf16 directly."""
    result, mod = compile_retyped("sigmoid_attention", dtype)
    assert "tl.full([], 1" in result.source
    inputs = random_inputs(result.spec, {"B": 1, "S": 21}, seed=4)
    err = (on_device(mod.forward, *inputs.values()).double() - evaluate(result.spec, inputs)).abs().max().item()
    assert err <= tolerance(dtype)


def test_retyped_keeps_other_dtypes(tmp_path):
    spec = load_spec(SPECS / "alibi_pf.py").retyped("bf16")
    assert {n: t.dtype for n, t in spec.inputs.items()} == {"q": "bf16", "k": "bf16", "v": "bf16", "slope": "f32"}
    assert spec.output_dtype == "bf16"
    casts = {t.attrs[0] for t in walk(spec.output_term) if t.op == "cast"}
    assert casts == {"bf16"}


MASK_FIRST = '''
from neptune_eqsat.spec import *
spec = Spec("mask_first")
R, N = spec.dims(R=64, N=64)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N)
s = {score}
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
spec.output("y", f32, sum(j, p * x[r, j]) / where(sum(j, p) == 0, 1, sum(j, p)), r)
'''


@pytest.mark.parametrize("score", ["where(j > r + 2, -inf, x[r, j])", "where(j <= r + 2, x[r, j], -inf)",
                                   "where(~(j <= r + 2), -inf, x[r, j])", "where((j > r) & (r > 1), -inf, x[r, j])"])
def test_where_in_either_order(tmp_path, score):
    """A mask may name the replaced constant first or second; both give the same one-pass kernel."""
    path = tmp_path / f"mask_{abs(hash(score))}.py"
    path.write_text(MASK_FIRST.format(score=score))
    result = optimize(str(path))
    assert result.chosen.sched.passes == 1   # the maximum and both sums in one pass
    mod = load_module(result.source, f"mask_first_{abs(hash(score))}")
    inputs = random_inputs(result.spec, {"R": 5, "N": 23}, seed=4)
    out = on_device(mod.forward, *inputs.values())
    assert not torch.isnan(out).any()
    assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance("f32")


def test_nan_and_inf_constants(tmp_path):
    path = tmp_path / "nan_const.py"
    path.write_text('''
from neptune_eqsat.spec import *
spec = Spec("nan_const")
R, N = spec.dims(R=64, N=64)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N)
spec.output("y", f32, sum(j, where(x[r, j] > 1.5, nan, where(x[r, j] < -3, inf, x[r, j]))), r)
''')
    result = optimize(str(path))
    assert "nan" in result.explain()
    mod = load_module(result.source, "nan_const")
    inputs = random_inputs(result.spec, {"R": 6, "N": 9}, seed=5)
    out, ref = on_device(mod.forward, *inputs.values()).double(), evaluate(result.spec, inputs)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    finite = ref.isfinite()
    assert finite.any() and (out[finite] - ref[finite]).abs().max().item() <= tolerance("f32")


def test_spec_language_imports_fast_and_leaves_triton_alone():
    code = ("import os, sys, time; t = time.perf_counter(); import neptune_eqsat.spec; "
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'TRITON_INTERPRET' in os.environ)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    seconds, torch_loaded, interpret_set = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                                          capture_output=True, text=True).stdout.split()
    assert torch_loaded == "False" and interpret_set == "False"
    assert float(seconds) < 1.0 and math.isfinite(float(seconds))


@pytest.mark.parametrize("label_dtype", ["i64", "i32"])
def test_integer_labels_read_as_stored_match_torch_cross_entropy(label_dtype):
    """A spec input of integers (the label per row, as torch's cross_entropy takes it): the module takes the
    integer tensor itself, reads it as an index, and gives torch's loss."""
    text = (SPECS / "cross_entropy.py").read_text().replace('spec.input("target", f32, R)',
                                                           f'spec.input("target", {label_dtype}, R)')
    spec_ns = {}
    exec(compile(text.replace('Spec("cross_entropy")', f'Spec("cross_entropy_{label_dtype}")'), "ce.py", "exec"),
         spec_ns)
    result = optimize(spec_ns["spec"])
    mod = load_module(result.source, f"cross_entropy_{label_dtype}")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(19, 300, generator=g)
    torch_dtype = getattr(torch, TORCH_NAMES[label_dtype])
    target = torch.randint(0, 300, (19,), generator=g).to(torch_dtype)
    loss = on_device(mod.forward, x, target)
    ref = torch.nn.functional.cross_entropy(x.double(), target.long(), reduction="none")
    assert (loss.double() - ref).abs().max().item() <= tolerance("f32")
    with pytest.raises(TypeError, match="expected dtype"):
        on_device(mod.forward, x, target.float())
    inputs = random_inputs(result.spec, {"R": 19, "V": 300})
    assert inputs["target"].dtype == torch_dtype
