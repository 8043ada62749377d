"""Specs a user writes at the edges of the language: values of 16-bit inputs taken through ops that keep integers
(-x, abs), constant outputs, and malformed specs, which must be refused with an error naming the problem, never
compiled into a kernel that reads garbage."""
import pytest
import torch

from conftest import DEVICE, assert_close, compiled, on_device
from neptune_eqsat.frontend.reference import evaluate
from neptune_eqsat.spec import SpecError, load_spec

HEADER = "from neptune_eqsat.spec import *\nspec = Spec('{name}')\n"
ROWS = "R, N = spec.dims(R=64, N=512)\nr, j = spec.axes(r=R, j=N)\nx = spec.input('x', {dt}, R, N)\n"


def write(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER.format(name=name) + body)
    return str(path)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("name, value", [
    ("sum_abs", "spec.output('y', f32, sum(j, abs(x[r, j])), r)"),
    ("softmin", "m = max(j, -x[r, j])\nspec.output('y', {dt}, exp(-x[r, j] - m) / sum(j, exp(-x[r, j] - m)), r, j)"),
    ("sqrt_abs", "spec.output('y', {dt}, sqrt(abs(x[r, j])) + tanh(-x[r, j]), r, j)"),
])
def test_negation_and_abs_of_16_bit_inputs_compute_in_fp32(tmp_path, dt, name, value):
    """-x and abs(x) keep an integer an integer, but of a 16-bit load they are fp32 values like any other op's:
    a row sum of them accumulated in 16 bits (garbage in bf16) and exp/sqrt of a 16-bit tile (refused by
    Triton) were what the code generator made of them before."""
    path = write(tmp_path, f"{name}_{dt}", ROWS.format(dt=dt) + value.format(dt=dt) + "\n")
    assert_close(path, {"R": 3, "N": 37})


def test_a_wide_block_of_large_fp16_values_sums_without_overflow(tmp_path):
    """128 values of 1000 sum past fp16's 65504 inside one block: the sum is fp32, so 300 of them give 300000."""
    _, mod = compiled(write(tmp_path, "sum_abs_wide", ROWS.format(dt="f16") +
                            "spec.output('y', f32, sum(j, abs(x[r, j])), r)\n"))
    x = torch.full((2, 300), 1000.0, dtype=torch.float16)
    assert on_device(mod.forward, x, config={"BLOCK_J": 128}).tolist() == [300000.0, 300000.0]


@pytest.mark.parametrize("name, value, axes", [("scalar_one", "1", ""), ("row_of_halves", "0.5", ", r")])
def test_a_constant_output_compiles_and_fills_its_shape(tmp_path, name, value, axes):
    """An output that is a number (before: the module wrote `1.to(tl.float32)`, not Python)."""
    path = write(tmp_path, name, ROWS.format(dt="f32") + f"spec.output('y', f32, {value}{axes})\n")
    out, _ = assert_close(path, {"R": 3, "N": 37})
    assert (out == float(value)).all() and out.shape == ((3,) if axes else ())


@pytest.mark.parametrize("name, body, message", [
    ("repeated_axis", ROWS.format(dt="f32") + "spec.output('y', f32, x[r, j] * 2.0, r, j, j)\n",
     r"repeated_axis.py:6: output y: axis j is named more than once"),
    ("fractional_index", ROWS.format(dt="f32") + "spec.output('y', f32, sum(j, x[r, j * 0.5]), r)\n",
     r"tensor x, dimension 1: index \(j \* 0.5\) is not a whole number"),
    ("exp_as_index", ROWS.format(dt="f32") + "spec.output('y', f32, x[r, exp(j * 0 + 1)], r)\n",
     r"tensor x, dimension 1: index exp\(.*\) is not a whole number"),
    ("size_of_no_input", "R, G, C = spec.dims(R=64, G=32, C=256)\nr, g, c = spec.axes(r=R, g=G, c=8)\n"
     "x = spec.input('x', f32, R, C)\nspec.output('y', f32, x[r, g * 8 + c] - sum(c, x[r, g * 8 + c]) / 8, r, g, c)\n",
     r"axis g runs over G, the size of no input's dimension"),
    ("statistic_first", ROWS.format(dt="f32") + "m = max(j, x[r, j])\nl = sum(j, exp(x[r, j] - m))\n"
     "spec.output('lse', f32, m + log(l), r)\nspec.output('y', f32, exp(x[r, j] - m) / l, r, j)\n",
     r"output y runs along j.*declare y, which has more axes than lse, first"),
    ("negative_axis", "R = spec.dims(R=64)\nr, q = spec.axes(r=R, q=-3)\n", r"axis q: extent must be at least 1, got -3"),
    ("empty_input", "R = spec.dims(R=64)\nt = spec.input('t', f32, R, 0)\n", r"input t: shape entries must be at least 1, got 0"),
    ("zero_typical_size", "R = spec.dims(R=0)\n", r"dim R: the typical size must be a positive int"),
    ("input_not_a_name", "R = spec.dims(R=64)\nr = spec.axes(r=R)\nx = spec.input('my-x', f32, R)\n"
     "spec.output('y', f32, x[r] * 2, r)\n", r"input 'my-x' is not a name a generated module can use"),
    ("dim_a_keyword", "R = spec.dims(R=64)\nL = spec.dims(**{'lambda': 8})\nr = spec.axes(r=R)\n"
     "x = spec.input('x', f32, R)\nspec.output('y', f32, x[r] * 2, r)\n",
     r"dim 'lambda' is not a name"),
    ("size_as_a_number", ROWS.format(dt="f32") + "spec.output('y', f32, sum(j, x[r, j]) / float(N), r)\n",
     r"size_as_a_number.py:6: N is a size known only at run time, not a Python number"),
])
def test_malformed_specs_are_refused_with_the_problem_named(tmp_path, name, body, message):
    with pytest.raises(SpecError, match=message):
        compiled(write(tmp_path, name, body))


def test_the_reference_reads_an_index_outside_a_tensor_as_nan_that_a_where_can_discard(tmp_path):
    """The float64 reference of cross-entropy with ignore_index (before: it gathered at -100 and raised): the
    where discards the read, and a read that is kept is NaN, never another element."""
    path = write(tmp_path, "ignored", "R, V = spec.dims(R=64, V=512)\nr, j = spec.axes(r=R, j=V)\n"
                 "x = spec.input('x', f32, R, V)\nt = spec.input('t', i64, R)\nm = max(j, x[r, j])\n"
                 "lse = m + log(sum(j, exp(x[r, j] - m)))\n"
                 "spec.output('loss', f32, where(t[r] == -100, 0.0, lse - x[r, t[r]]), r)\n")
    spec = load_spec(path)
    x, t = torch.randn(5, 37, dtype=torch.float64), torch.tensor([-100, 2, 36, -100, 0])
    want = torch.nn.functional.cross_entropy(x, t, reduction="none", ignore_index=-100)
    assert (evaluate(spec, {"x": x, "t": t}) - want).abs().max() < 1e-12
    kept = write(tmp_path, "kept", "R, V = spec.dims(R=64, V=512)\nr = spec.axes(r=R)\n"
                 "x = spec.input('x', f32, R, V)\nt = spec.input('t', i64, R)\nspec.output('y', f32, x[r, t[r]], r)\n")
    got = evaluate(load_spec(kept), {"x": x, "t": torch.tensor([1, -1, 37, 0, 2])})
    assert got.isnan().tolist() == [False, True, True, False, False]


def test_narrow_integer_values_compute_in_32_bits(tmp_path):
    """Products and differences of int8 and uint8 values (before: computed in 8 bits, wrapping past 127)."""
    path = write(tmp_path, "narrow_ints", "R, N = spec.dims(R=64, N=512)\nr, j = spec.axes(r=R, j=N)\n"
                 "y = spec.input('y', i8, R, N)\nx = spec.input('x', u8, R, N)\n"
                 "spec.output('o', f32, sum(j, y[r, j] * y[r, j] + (x[r, j] - y[r, j])), r)\n")
    _, mod = compiled(path)
    y, x = torch.tensor([[100, -100, 50]], dtype=torch.int8), torch.tensor([[200, 10, 255]], dtype=torch.uint8)
    assert on_device(mod.forward, y, x).tolist() == [22915.0]


def test_an_fp64_spec_keeps_its_states_in_fp64(tmp_path):
    """A variance of values far from their mean, in fp64 (before: the rolled states and split partials were
    fp32, 15% off where torch's fp32 variance is 9% off and fp64 is exact)."""
    path = write(tmp_path, "variance64", "R, N = spec.dims(R=256, N=256)\nr, j = spec.axes(r=R, j=N)\n"
                 "x = spec.input('x', f64, R, N)\nmean = sum(j, x[r, j]) / N\n"
                 "spec.output('y', f64, sum(j, (x[r, j] - mean) * (x[r, j] - mean)) / N, r)\n")
    _, mod = compiled(path)
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e-3 + 1e4
    want = x.var(1, unbiased=False)
    got = on_device(mod.forward, x)
    assert got.dtype == torch.float64 and ((got - want).abs() / want).max() < 1e-8


@pytest.mark.parametrize("bound", ["j <= i // 2.5", "j <= 63 + i // -1", "j >= i // 3"])
def test_key_ranges_of_a_floor_division_by_any_constant(tmp_path, bound):
    """Only i // c with a whole c >= 1 rises with i: the closed-form key range took i // 2.5 as i // 2 and
    i // -1 as rising, running unmasked blocks over keys the mask drops."""
    name = "bound_" + "".join(ch for ch in bound if ch.isalnum())
    path = write(tmp_path, name, "R, N = spec.dims(R=4096, N=4096)\ni, j = spec.axes(i=R, j=N)\n"
                 f"x = spec.input('x', f32, R, N)\nspec.output('y', f32, sum(j, where({bound}, x[i, j], 0)), i)\n")
    assert_close(path, {"R": 64, "N": 64})


def test_truth_values_add_as_numbers(tmp_path):
    """(x > 0) + (x > -1) is 2 where both hold (before: 1-bit tiles added to 1)."""
    path = write(tmp_path, "truths", ROWS.format(dt="f32") + "spec.output('y', f32, (x[r, j] > 0) + (x[r, j] > -1) "
                 "- (x[r, j] < 0) * 3, r, j)\n")
    assert_close(path, {"R": 3, "N": 37})


def test_an_index_read_from_values_is_checked_as_the_kernel_computes_it(tmp_path):
    """The launcher's check of an index read from an input's values takes & and | as logic, as the kernel does
    (before: as bits on int64, so t | 0 with t = 5 was refused and t & 1 with t = 2 let a read of index 1 of a
    width-1 row through, clamped by the kernel)."""
    body = "R, N = spec.dims(R=64, N=64)\nr = spec.axes(r=R)\nx = spec.input('x', f32, R, N)\nt = spec.input('t', i64, R)\n"
    _, either = compiled(write(tmp_path, "index_or", body + "spec.output('y', f32, x[r, t[r] | 0] * 2, r)\n"))
    x, t = torch.randn(4, 2), torch.tensor([0, 5, 1, 0])
    assert torch.equal(on_device(either.forward, x, t), x[torch.arange(4), (t != 0).long()] * 2)
    if DEVICE != "cpu":   # there the check is a device-side assertion, which would end the CUDA context
        return
    _, both = compiled(write(tmp_path, "index_and", body + "spec.output('y', f32, x[r, t[r] & 1] * 2, r)\n"))
    with pytest.raises(IndexError, match=r"t\[r\] & 1\), which takes values 0 to 1, outside the 1 it has"):
        both.forward(torch.randn(4, 1), torch.tensor([2, 0, 2, 0]))


def test_a_wrapping_index_with_gaps_is_not_refused(tmp_path):
    """(3 j) % 6 over j < 4 reads 0 and 3, inside a row of 4: the launcher's interval check no longer takes the
    wrap's [0, 5] as values read (it refused the call)."""
    path = write(tmp_path, "gapped", "R, M, N = spec.dims(R=64, M=64, N=64)\nr, j = spec.axes(r=R, j=N)\n"
                 "x = spec.input('x', f32, R, M)\nw = spec.input('w', f32, N)\n"
                 "spec.output('y', f32, sum(j, x[r, (3 * j) % 6] * w[j]), r)\n")
    assert_close(path, {"R": 2, "M": 4, "N": 4})


def test_a_grouped_output_axis_that_a_reduction_rebinds(tmp_path):
    """c is an output axis read in groups (v[c // 2, j], which the row-packing layout would pack) and also the
    variable of a sum elsewhere in the output: no packing then (before: KeyError 'c' planning it)."""
    path = write(tmp_path, "rebound", "R, N = spec.dims(R=4096, N=256)\nr, j, c = spec.axes(r=R, j=N, c=4)\n"
                 "x = spec.input('x', f32, R, N)\nz = spec.input('z', f32, R, 4)\nv = spec.input('v', f32, 2, N)\n"
                 "spec.output('o', f32, sum(j, v[c // 2, j] * x[r, j]) + sum(c, z[r, c]), r, c)\n")
    assert_close(path, {"R": 3, "N": 5})


def test_a_bool_input_with_aligned_rows(tmp_path):
    """A bool mask whose rows are 16-byte aligned is read through pointers (before: a tensor descriptor was built
    for it, which Triton refuses for 1-bit elements, and the call failed)."""
    path = write(tmp_path, "bool_rows", ROWS.format(dt="f32") + "mk = spec.input('mk', bool, R, N)\n"
                 "spec.output('y', f32, sum(j, where(mk[r, j], x[r, j], 0.0)), r)\n")
    assert_close(path, {"R": 3, "N": 64})


@pytest.mark.parametrize("value", ["0.1 / N", "N / 2", "-N", "+N", "N ** 2 / 1000", "1000 // N", "7 % N",
                                   "2 * N - 1"])
def test_arithmetic_on_a_size_on_either_side_is_an_expression(tmp_path, value):
    """A run-time size takes part in arithmetic on either side of every operator as a value would (0.1 / N was
    refused by Python: the size had no reflected division)."""
    name = "size_" + "".join(c if c.isalnum() else "_" for c in value)
    body = ROWS.format(dt="f32") + f"spec.output('y', f32, sum(j, x[r, j]) * ({value}), r)\n"
    assert_close(write(tmp_path, name, body), {"R": 3, "N": 37})


def test_an_axis_declared_and_never_used_needs_no_size(tmp_path):
    """An axis over a size no input carries that nothing reads is left out of the module (its launcher looked
    the size up among the inputs' and failed with a KeyError)."""
    body = ("R, N = spec.dims(R=64, N=512)\nr, j, e = spec.axes(r=R, j=N, e=5)\nx = spec.input('x', f32, R, 5)\n"
            "spec.output('y', f32, sum(e, x[r, e]), r)\n")
    assert_close(write(tmp_path, "unused_axis", body), {"R": 3})


def test_a_label_kept_as_a_float_must_be_whole(tmp_path):
    """x[r, t[r]] with t in floating point reads at whole positions; 2.5 is refused, not read at 2."""
    _, mod = compiled(write(tmp_path, "float_label", "R, V = spec.dims(R=64, V=512)\nr = spec.axes(r=R)\n"
                            "x = spec.input('x', f32, R, V)\nt = spec.input('t', f32, R)\n"
                            "spec.output('y', f32, x[r, t[r]], r)\n"))
    x = torch.arange(20.0).reshape(2, 10)
    assert on_device(mod.forward, x, torch.tensor([2.0, 9.0])).tolist() == [2.0, 19.0]
    if DEVICE != "cpu":   # there the check is a device-side assertion, which would end the CUDA context
        return
    with pytest.raises(IndexError, match="t holds values that are not whole numbers"):
        mod.forward(x, torch.tensor([2.5, 9.0]))
