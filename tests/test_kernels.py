"""Every emitted kernel against the float64 reference of its unfused spec, under Triton's interpreter.

Shapes come from hypothesis: lengths that are not multiples of the block (16 under the interpreter) and span
up to three blocks, several batches, and variants of the shipped specs whose masks empty whole rows or whose
window is short enough to skip blocks at these sizes.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.spec import load_spec

from conftest import DEVICE, FEW, SPECS, assert_close, compiled, on_device, run_against_reference, spec_variant

PREFILL = ["global_pf", "causal_pf", "gqa_pf", "alibi_pf", "softcap_pf", "window_pf"]


@pytest.mark.parametrize("name", PREFILL)
@FEW
@given(batch=st.integers(1, 2), seq=st.integers(1, 40))
def test_prefill_kernels_match_float64(name, batch, seq):
    assert_close(str(SPECS / f"{name}.py"), {"B": batch, "S": seq}, seed=seq)


@pytest.mark.parametrize("name", PREFILL)
def test_prefill_odd_length(name):
    assert_close(str(SPECS / f"{name}.py"), {"B": 1, "S": 23}, seed=7)


@FEW
@given(seq=st.integers(20, 40), window=st.integers(1, 19))
def test_short_window_skips_blocks_correctly(tmp_path, seq, window):
    path = spec_variant(tmp_path, "window_pf", {"CAP, WINDOW = 50.0, 4096": f"CAP, WINDOW = 50.0, {window}"})
    assert_close(path, {"B": 1, "S": seq}, seed=window)


@FEW
@given(seq=st.integers(3, 50), empty=st.integers(1, 40))
def test_fully_masked_rows_give_zero_not_nan(tmp_path, seq, empty):
    """Rows i < empty see no key at all (mask i >= j + empty): their output is exactly 0."""
    path = spec_variant(tmp_path, "causal_pf", {"where(i >= j, s, -inf)": f"where(i >= j + {empty}, s, -inf)"})
    out, _ = assert_close(path, {"B": 1, "S": seq}, seed=seq)
    assert torch.all(out[:, :, : min(empty, seq)] == 0)


def test_alibi_far_keys_do_not_overflow_the_repair():
    """Steep slopes push early keys' scores far below 0: the first repair factor overflows and must give 0."""
    spec = load_spec(SPECS / "alibi_pf.py")
    inputs = random_inputs(spec, {"B": 1, "S": 40}, seed=2)
    inputs["slope"] = torch.full_like(inputs["slope"], 40.0)
    assert_close(str(SPECS / "alibi_pf.py"), {"B": 1, "S": 40}, inputs=inputs)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "max_normalized_sum"])
@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 40), length=st.integers(1, 150))
def test_row_reductions_match_float64(name, rows, length):
    assert_close(str(SPECS / f"{name}.py"), {"R": rows, "N": length}, seed=length)


def test_shape_errors_name_the_input():
    from conftest import compiled
    _, mod = compiled(str(SPECS / "gqa_pf.py"))
    q = torch.zeros(1, 64, 8, 128, dtype=torch.float16)
    k = torch.zeros(1, 8, 9, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="k: dimension 2 is S = 9, but another input has S = 8"):
        mod.forward(q, k, k)
    with pytest.raises(ValueError, match="v: dimension 1 must be 8, got 64"):
        mod.forward(q, k[:, :, :8], q)


def test_reference_is_not_trivially_zero():
    _, ref, _ = run_against_reference(str(SPECS / "causal_pf.py"), {"B": 1, "S": 5})
    assert ref.abs().max() > 0.1


def test_mask_the_bounds_analysis_cannot_read_is_tested_in_every_block(tmp_path):
    """A mask that is not linear in i and j (every third key) gives no key bounds: no block may skip its test."""
    path = spec_variant(tmp_path, "causal_pf", {"where(i >= j, s, -inf)": "where((j % 3) == 1, s, -inf)"})
    assert_close(path, {"B": 1, "S": 40}, seed=3)


def test_a_where_that_masks_nothing_gives_no_key_bounds(tmp_path):
    """where(i >= j, s, s) reads like a causal mask but keeps every key; rows i < 12 are masked by a condition
    on i alone. Skipping keys past the diagonal would be wrong (found by the random-spec tests)."""
    path = spec_variant(tmp_path, "causal_pf", {"s = where(i >= j, s, -inf)":
                                                "s = s + tanh(where(i >= j, s, s))\ns = where(i >= 12, s, -inf)"})
    assert_close(path, {"B": 1, "S": 24}, seed=24)


def _strided(x, step):
    """x's values in a tensor whose last dimension has stride `step` (a layout the copy engine cannot read)."""
    wide = torch.empty(*x.shape[:-1], x.shape[-1] * step, dtype=x.dtype)[..., ::step]
    wide.copy_(x)
    return wide


@pytest.mark.skipif(DEVICE != "cpu", reason="follows the interpreter's inputs into _descriptor; on a Hopper GPU "
                                             "the copies on the device go to the Gluon kernel's descriptors")
@pytest.mark.parametrize("layout", ["contiguous", "heads_transposed", "last_dim_strided"])
@pytest.mark.parametrize("name, sizes", [("causal_pf", {"B": 1, "S": 21}), ("gqa_dc", {"B": 1, "Q": 1, "SKV": 21})])
def test_kernels_move_data_through_descriptors_where_the_layout_allows_and_pointers_otherwise(name, sizes, layout,
                                                                                          monkeypatch):
    path = str(SPECS / f"{name}.py")
    result, mod = compiled(path)
    inputs = random_inputs(result.spec, sizes, seed=3)
    if layout == "heads_transposed":   # (B, S, H, D) storage seen as (B, H, S, D): still readable by the engine
        inputs = {n: x.transpose(1, 2).contiguous().transpose(1, 2) for n, x in inputs.items()}
    elif layout == "last_dim_strided":
        inputs = {n: _strided(x, 2) for n, x in inputs.items()}
    built = []   # (tensor, its descriptor or None)
    real = mod._descriptor
    monkeypatch.setattr(mod, "_descriptor", lambda x, block: built.append((x, real(x, block))) or built[-1][1])
    assert_close(path, sizes, inputs=inputs)
    read = [d for x, d in built if any(x is t for t in inputs.values())]
    assert read and all((d is None) == (layout == "last_dim_strided") for d in read)
    if name == "causal_pf":   # the output is a fresh tensor: its descriptor can always be built
        assert [d is not None for x, d in built if not any(x is t for t in inputs.values())] == [True]


@pytest.mark.parametrize("order", [0, 1, 2])
def test_every_order_of_row_blocks_gives_the_reference(order):
    """Causal row blocks may run in order, longest first per head, or longest first across heads."""
    result, mod = compiled(str(SPECS / "causal_pf.py"))
    assert mod.CONFIG["ROW_ORDER"] == 1
    inputs = random_inputs(result.spec, {"B": 1, "S": 41}, seed=order)
    out = on_device(mod.forward, *inputs.values(), config={"ROW_ORDER": order})
    assert (out.double() - evaluate(result.spec, inputs)).abs().max() <= tolerance(result.spec.output_dtype)
