"""Block classification (codegen/blocks.py, codegen/intervals.py, codegen/block_kernel.py) is sound: a block
classed empty keeps no element, one classed full masks none (and lies wholly inside the keys), for random
predicates over positions and random captured data, checked by evaluating every element. Both builders are
checked: the torch operations that build a mask of positions' table once per sizes, and the one kernel that
builds the table of a mask reading tensors at every call (under Triton's interpreter here), which must give
the same classes where it reads every tensor at exact indices."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from conftest import DEVICE
from neptune_eqsat.codegen import block_emitter, block_kernel, blocks, intervals, module, row_order
from neptune_eqsat.codegen.masks import evaluate
from neptune_eqsat import ir
from neptune_eqsat.runtime.loader import load_module

H, N_DOC = 3, 23     # grid axis h, length of the captured 1-d tensor
# the captured tensors: document ids as stored (int64), a table of floats
SPEC = types.SimpleNamespace(inputs={"doc": types.SimpleNamespace(dtype="i64"), "table": types.SimpleNamespace(dtype="f32")})
WRITER = types.SimpleNamespace(row="i", loop="j", ext=lambda a: {"i": "L", "j": "S", "h": str(H)}[a], spec=SPEC)


def _clamped(e: ir.Term, n: int) -> ir.Term:
    return ir.bin("min", ir.bin("max", e, ir.const(0)), ir.const(n - 1))


def _linear(a: int, b: int, c: int) -> ir.Term:
    """a*i + c - b*j: the differences and offsets of positions masks are made of."""
    i, j = ir.axis("i"), ir.axis("j")
    return ir.bin("sub", ir.bin("add", ir.bin("mul", i, ir.const(a)), ir.const(c)), ir.bin("mul", j, ir.const(b)))


def numbers(depth: int):
    leaves = st.sampled_from([ir.axis("i"), ir.axis("j"), ir.axis("h"), ir.dim("S")]) | \
        st.integers(-6, 40).map(lambda v: ir.const(v)) | \
        st.builds(_linear, st.integers(-2, 2), st.integers(-2, 2), st.integers(-10, 30))
    if depth == 0:
        return leaves
    sub = numbers(depth - 1)
    positive = st.integers(1, 9).map(lambda v: ir.const(v))
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["add", "sub", "mul", "max", "min"]), sub, sub).map(lambda x: ir.bin(*x)),
        st.tuples(st.sampled_from(["floordiv", "mod"]), sub, positive).map(lambda x: ir.bin(*x)),
        st.tuples(st.sampled_from(["shr", "shl"]), sub, st.integers(0, 3).map(lambda v: ir.const(v)))
        .map(lambda x: ir.bin(x[0], ir.un("abs", x[1]), x[2])),
        st.tuples(st.sampled_from(["bitand", "bitor", "bitxor"]), sub, sub)
        .map(lambda x: ir.bin(x[0], ir.un("abs", x[1]), ir.un("abs", x[2]))),
        sub.map(lambda a: ir.un("abs", a)),
        sub.map(lambda a: ir.un("neg", a)),
        st.tuples(st.sampled_from(["exp", "tanh", "sqrt", "floor", "recip", "logistic2"]), sub).map(
            lambda x: ir.un(*x)),
        sub.map(lambda a: ir.load("doc", _clamped(a, N_DOC))),
        st.tuples(sub, sub).map(lambda x: ir.load("table", _clamped(ir.axis("h"), H), _clamped(x[1], N_DOC))),
        st.tuples(conditions(depth - 1), sub, sub).map(lambda x: ir.where(*x)),
    )


def conditions(depth: int):
    compare = st.tuples(st.sampled_from(list(ir.COMPARE)), numbers(depth), numbers(depth)).map(lambda x: ir.bin(*x))
    if depth == 0:
        return compare
    sub = conditions(depth - 1)
    return st.one_of(compare, st.tuples(st.sampled_from(["and", "or"]), sub, sub).map(lambda x: ir.bin(*x)),
                     sub.map(lambda a: ir.un("not", a)))


_HEADER = module.RUNTIME_IMPORTS + """
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""


def build_lists(pred: ir.Term, L: int, S: int, bm: int, bn: int, tensors: dict, kind: str = "torch",
                grid: tuple = None) -> np.ndarray:
    """The flat block lists from the generated builder of `kind`: "torch" (intervals.py), "kernel" (one Triton
    launch, which at these sizes is block_pairs.py's one program per grid value) or "kernel-rows" (block_kernel.py's
    program per row block, as at long lengths)."""
    grid = (("h",) if "h" in pred.free else ()) if grid is None else grid
    table = blocks.BlockTable(pred, "blocks0", "build", grid)
    if kind == "torch":
        scope: dict = {"torch": torch, "math": __import__("math")}
        exec(blocks.runtime_source() + "\n" + blocks.builder_source(table, WRITER), scope)
        build = scope["build"]
    else:   # on the test device: compiled for the GPU there
        tensors = {n: t.to(DEVICE) for n, t in tensors.items()}
        source = _HEADER + module._runtime_source() + "\n\n" + row_order.ORDER_SOURCE + "\n\n" + \
            block_kernel.kernel_source(table, WRITER, _sizes(table))
        build = load_module(source, "block_classes").build
    used = [tensors[n] for n in table.tensors]
    sizes = {"L": L, "S": S, str(H): H}
    device = torch.empty(0, device="cpu" if kind == "torch" else DEVICE).device   # (cuda with its index)
    forced = {"kernel-rows": {"one_program": False}, "kernel": {"one_program": True}}.get(kind, {})
    return build(bm, bn, device, *[sizes[s] for s in _sizes(table)], *used, **forced).cpu().numpy()


def classify(pred: ir.Term, L: int, S: int, bm: int, bn: int, tensors: dict, kind: str = "torch") -> np.ndarray:
    """Class per (h, row block, key block) from the generated builder: 0 empty, 1 partial, 2 full."""
    grid = ("h",) if "h" in pred.free else ()
    flat = build_lists(pred, L, S, bm, bn, tensors, kind)
    n_kb, n_rb = -(-S // bn), -(-L // bm)
    entries = (H if grid else 1) * n_rb
    order = flat[entries * 2 * (n_kb + 1):][:n_rb]
    assert sorted(order) == list(range(n_rb))   # every row block once, in the order programs take them
    cls = np.zeros((entries, n_kb), dtype=np.int64)
    for row, entry in enumerate(flat[:entries * 2 * (n_kb + 1)].reshape(entries, 2, n_kb + 1)):
        for slot, kind_ in ((0, 1), (1, 2)):
            listed = entry[slot, 1:1 + entry[slot, 0]]
            assert list(listed) == sorted(set(listed)), "a list out of order or with a block twice"
            cls[row, listed] = kind_
    assert not ((cls == 1) & (cls == 2)).any()
    return cls.reshape((H if grid else 1), -(-L // bm), n_kb)


def _sizes(table) -> list[str]:
    return blocks.builder_sizes(table, WRITER)


def brute_force(pred: ir.Term, L: int, S: int, tensors: dict) -> np.ndarray:
    """The predicate at every (h, i, j), as booleans."""
    h, i, j = np.meshgrid(np.arange(H), np.arange(L), np.arange(S), indexing="ij")
    env = {"h": h.astype(np.float64), "i": i.astype(np.float64), "j": j.astype(np.float64)}
    data = {n: (t.double() if t.is_floating_point() else t).numpy() for n, t in tensors.items()}   # ids exact

    def leaf(t: ir.Term, ev):
        if t.op == "axis":
            return env[t.attrs[0]]
        if t.op == "dim":
            return np.float64({"S": S, "L": L}[t.attrs[0]])
        if t.op == "load":
            values = [np.broadcast_to(ev(a), h.shape) for a in t.args]
            # an index that is NaN somewhere (sqrt(-1)) reads no element: the runtime refuses such a call
            # before the kernel runs (frontend/bounds.py), so there is no truth to classify against
            assume(all(np.isfinite(v).all() for v in values))
            return data[t.attrs[0]][tuple(v.astype(np.int64) for v in values)]
        return None

    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate(pred, leaf) != 0, h.shape)


def check_sound(pred, L, S, bm, bn, tensors, kind="torch") -> np.ndarray:
    truth = brute_force(pred, L, S, tensors)   # first: it rejects predicates whose reads are undefined
    cls = classify(pred, L, S, bm, bn, tensors, kind)
    for hh in range(H):
        for rb in range(-(-L // bm)):
            for kb in range(-(-S // bn)):
                block = truth[hh, rb * bm:(rb + 1) * bm, kb * bn:(kb + 1) * bn]
                c = cls[min(hh, cls.shape[0] - 1), rb, kb]
                assert c != 0 or not block.any(), f"block ({hh}, {rb}, {kb}) classed empty keeps an element"
                if c == 2:
                    assert block.all(), f"block ({hh}, {rb}, {kb}) classed full masks an element"
                    assert (kb + 1) * bn <= S, "a full block runs past the keys"
    return cls


def random_tensors(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    doc = torch.sort(torch.randint(0, 5, (N_DOC,), generator=g)).values
    return {"doc": doc, "table": torch.randint(-20, 40, (H, N_DOC), generator=g).float()}


@settings(max_examples=300, deadline=None)
@given(conditions(2), st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 4, 8]),
       st.sampled_from([1, 4, 16]), st.integers(0, 2**16))
def test_random_predicates_are_classified_soundly(pred, L, S, bm, bn, seed):
    check_sound(pred, L, S, bm, bn, random_tensors(seed))


def _reads_exactly(pred: ir.Term) -> bool:
    """Does every read of a tensor take indices of at most one of rows and keys (as a mask that reads tensors
    does: codegen/blocks.py's table_predicate), computed without rounding? The kernel reads those at exact
    indices. (An index through tanh or a reciprocal is a range after widening, which the torch builder bounds by
    range-minimum tables and the kernel by every value: both sound, not equal.)"""
    return all(len(t.free & {"i", "j"}) < 2 and not any(x.op in ("un", "bin") and x.attrs[0] in intervals._ROUNDED
                                                          for x in ir.walk(t))
               for t in ir.walk(pred) if t.op == "load")


@settings(max_examples=60 if DEVICE == "cpu" else 3, deadline=None)   # (on a GPU each example compiles, 10-20 s)
@given(conditions(2), st.integers(1, 40), st.integers(1, 40), st.sampled_from([1, 4, 8]),
       st.sampled_from([1, 4, 16]), st.integers(0, 2**16))
def test_the_classifying_kernel_is_sound_and_agrees_with_the_torch_builder(pred, L, S, bm, bn, seed):
    """The one-launch builder of a mask reading tensors, under the interpreter: sound for any predicate, and
    where every read is at exact indices, the same classes and row order as the torch builder."""
    tensors = random_tensors(seed)
    got = check_sound(pred, L, S, bm, bn, tensors, "kernel")
    n_rb, n_kb = -(-L // bm), -(-S // bn)
    tail = (H if "h" in pred.free else 1) * n_rb * 2 * (n_kb + 1)
    order_skew_and_work = slice(tail, tail + 2 * n_rb + 1)
    # the two kernels run the same interval lines: the same classes, order and work (ids here are exact)
    assert (check_sound(pred, L, S, bm, bn, tensors, "kernel-rows") == got).all()
    assert (build_lists(pred, L, S, bm, bn, tensors, "kernel")[order_skew_and_work] ==
            build_lists(pred, L, S, bm, bn, tensors, "kernel-rows")[order_skew_and_work]).all()
    if _reads_exactly(pred):
        assert (got == classify(pred, L, S, bm, bn, tensors)).all()
        torch_lists = build_lists(pred, L, S, bm, bn, tensors)
        kernel_lists = build_lists(pred, L, S, bm, bn, tensors, "kernel")
        order_and_skew = slice(tail, tail + n_rb + 1)
        assert (kernel_lists[order_and_skew] == torch_lists[order_and_skew]).all(), "row order or skew flag differs"


@pytest.mark.parametrize("kind", ["torch", "kernel", "kernel-rows"])
def test_document_mask_skips_other_documents_and_runs_inner_blocks_unmasked(kind):
    doc = torch.tensor([0] * 16 + [1] * 24 + [2] * 8).float()
    i, j = ir.axis("i"), ir.axis("j")
    pred = ir.bin("and", ir.bin("eq", ir.load("doc", i), ir.load("doc", j)), ir.bin("ge", i, j))
    cls = check_sound(pred, 48, 48, 8, 8, {"doc": doc}, kind)[0]
    assert (cls == 0).sum() > 0 and (cls == 2).sum() > 0
    # row block 3 (rows 24-31, document 1, keys 16-39): keys 16-23 all kept, 24-31 causal, the rest empty
    assert list(cls[3]) == [0, 0, 2, 1, 0, 0]


def test_ids_past_float64s_integers_leave_every_block_partial():
    """Ids float64 cannot tell apart (consecutive past 2^53) must never make a block empty or full: the kernel
    compares them exactly, element by element."""
    doc = 2 ** 60 + torch.tensor([0] * 16 + [1] * 24 + [2] * 8)
    i, j = ir.axis("i"), ir.axis("j")
    pred = ir.bin("and", ir.bin("eq", ir.load("doc", i), ir.load("doc", j)), ir.bin("ge", i, j))
    for kind in ("kernel", "kernel-rows"):
        assert (check_sound(pred, 48, 48, 8, 8, {"doc": doc}, kind)[0] == 1).all()


def test_prefix_or_causal_mask_is_full_on_the_prefix():
    i, j = ir.axis("i"), ir.axis("j")
    pred = ir.bin("or", ir.bin("lt", j, ir.const(12)), ir.bin("ge", i, j))
    cls = check_sound(pred, 32, 32, 8, 8, {})[0]
    assert list(cls[0]) == [2, 1, 0, 0] and list(cls[3]) == [2, 2, 2, 1]


def test_a_range_minimum_query_answers_intervals_of_any_length():
    t = torch.randn(5, 37, dtype=torch.float64)
    lo = torch.tensor([[0.0, 3, 10, 36]])
    hi = torch.tensor([[36.0, 3, 20, 36]])
    rows = torch.arange(5.0).reshape(5, 1)
    got_lo, got_hi = intervals._iv_load(t, ((rows, rows), (lo, hi)), (1,))
    for r in range(5):
        for k in range(4):
            seg = t[r, int(lo[0, k]):int(hi[0, k]) + 1]
            assert got_lo[r, k] == seg.min() and got_hi[r, k] == seg.max()


@pytest.mark.parametrize("kind", ["torch", "kernel", "kernel-rows"])
def test_the_row_order_starts_with_the_most_work_and_flags_skew(kind):
    """Global tokens: the first row block sees every key, the others a band: it comes first in the order, and
    the work is flagged skewed (programs then start it in every head first); a band alone is not skewed."""
    i, j = ir.axis("i"), ir.axis("j")
    band = ir.bin("le", ir.un("abs", ir.bin("sub", i, j)), ir.const(8))
    tokens = ir.bin("or", ir.bin("or", ir.bin("lt", i, ir.const(4)), ir.bin("lt", j, ir.const(4))), band)
    n_rb = n_kb = 32
    flat = build_lists(tokens, 512, 512, 16, 16, {}, kind, grid=())
    order, skewed = flat[n_rb * 2 * (n_kb + 1):][:n_rb + 1][:-1], flat[n_rb * 2 * (n_kb + 1) + n_rb]
    assert order[0] == 0 and skewed == 1
    assert build_lists(band, 512, 512, 16, 16, {}, kind, grid=())[n_rb * 2 * (n_kb + 1) + n_rb] == 0


def _structured() -> dict:
    i, j, c = ir.axis("i"), ir.axis("j"), ir.const
    diff = ir.bin("sub", i, j)
    causal = ir.bin("ge", i, j)
    return {
        "block causal": ir.bin("ge", ir.bin("floordiv", i, c(5)), ir.bin("floordiv", j, c(5))),
        "same chunk of a difference": ir.bin("eq", ir.bin("floordiv", diff, c(6)), c(0)),
        "dilated": ir.bin("and", causal, ir.bin("eq", ir.bin("mod", diff, c(3)), c(0))),
        "bit pattern": ir.bin("eq", ir.bin("bitand", ir.bin("bitxor", i, j), c(4)), c(0)),
        "shifted tiles": ir.bin("eq", ir.bin("shr", i, c(2)), ir.bin("shr", j, c(2))),
        "scaled band": ir.bin("le", ir.un("abs", ir.bin("sub", ir.bin("mul", i, c(2)), ir.bin("shl", j, c(1)))), c(9)),
    }


@pytest.mark.parametrize("name", sorted(_structured()))
def test_integer_masks_are_classified_soundly_and_skip_something(name):
    """Masks built from //, %, bit operations and shifts of positions: sound, and not all partial (except the
    bit pattern, whose bit varies inside every block of 8, and which intervals bound loosely anyway)."""
    cls = check_sound(_structured()[name], 40, 40, 8, 8, {})
    if name != "bit pattern":
        assert (cls != 1).any(), "every block partial: the classification proved nothing"


@pytest.mark.parametrize("kind", ["torch", "kernel", "kernel-rows"])
@pytest.mark.parametrize("edge", ["ge", "lt"])
def test_a_value_rounded_differently_in_float32_is_not_put_on_one_side_of_a_comparison(kind, edge):
    """tanh(19) is 1 in float32 (and numpy) but 1 - 2^-53 in float64 libm: a block whose keys sit on that edge
    is partial, neither empty nor full."""
    i, j = ir.axis("i"), ir.axis("j")
    pred = ir.bin("and", ir.bin("lt", i, j), ir.bin(edge, ir.un("tanh", ir.const(19)), j))
    cls = check_sound(pred, 1, 2, 1, 1, {}, kind)[0]
    assert cls[0, 1] == 1


def test_the_kernel_widens_rounded_operations_as_the_torch_runtime_does():
    assert (block_emitter._ROUNDED, block_emitter._ROUNDING, block_emitter._FLT_EDGE) == \
        (intervals._ROUNDED, intervals._ROUNDING, intervals._FLT_EDGE)


@pytest.mark.parametrize("kind", ["torch", "kernel", "kernel-rows"])
def test_a_value_that_may_be_nan_keeps_every_comparison_open(kind):
    """sqrt(-j) is NaN for j > 0, and NaN < i is false, so not(sqrt(-j) < i) keeps those keys: the interval of
    a possibly-NaN value is the whole line, and arithmetic on it stays there."""
    i, j = ir.axis("i"), ir.axis("j")
    pred = ir.un("not", ir.bin("lt", ir.un("sqrt", ir.un("neg", j)), i))
    check_sound(pred, 2, 2, 1, 4, {}, kind)
    pred = ir.bin("ge", ir.un("abs", ir.un("sqrt", ir.bin("sub", i, j))), ir.const(0))
    check_sound(pred, 2, 6, 2, 4, {}, kind)   # abs(NaN) >= 0 is false too


@pytest.mark.parametrize("kind", ["torch", "kernel", "kernel-rows"])
def test_an_infinite_rounded_value_stays_infinite(kind):
    """recip(0) is inf: widening it for rounding must not make NaN of it (inf - inf), which an index would
    turn into a read far outside the tensor."""
    i, j = ir.axis("i"), ir.axis("j")
    index = ir.bin("min", ir.bin("max", ir.un("recip", i), ir.const(0)), ir.const(N_DOC - 1))
    check_sound(ir.bin("lt", i, ir.load("doc", index)), 1, 1, 1, 1, random_tensors(0), kind)
    check_sound(ir.bin("lt", ir.un("recip", i), j), 3, 3, 1, 1, {}, kind)


def test_a_gradient_masked_only_through_its_exp_skips_the_masked_blocks():
    """dS = (D + dP) * exp(where(p, s, -inf) - lse) once its second test of p is absorbed (rule
    mask-absorbed-by-exp): a masked element is (D + dP) * 0, which is 0 because dP = sum_e dO V of finite values
    is finite, so masked blocks are skipped. A maximum may be -inf (an empty row): a factor that is a maximum
    does not let the block be skipped (-inf * 0 is NaN)."""
    from neptune_eqsat.codegen.masks import masked_gives_identity
    i, j, d, e = (ir.axis(a) for a in "ijde")
    scores = ir.red("sum", "d", ir.bin("mul", ir.load("q", i, d), ir.load("k", j, d)))
    mask = ir.where(ir.bin("ge", i, j), scores, ir.const(float("-inf")))
    p = ir.un("exp2", ir.bin("sub", mask, ir.load("lse", i)))
    dp = ir.red("sum", "e", ir.bin("mul", ir.load("d_o", i, e), ir.load("v", j, e)))
    ds = ir.bin("mul", ir.bin("add", ir.load("stat", i), dp), p)
    assert masked_gives_identity(ir.bin("mul", ir.load("q", i, d), ds), "sum", [mask], "i")
    row_max = ir.red("max", "e", ir.bin("mul", ir.load("d_o", i, e), ir.load("v", j, e)))
    assert not masked_gives_identity(ir.bin("mul", row_max, p), "sum", [mask], "i")
