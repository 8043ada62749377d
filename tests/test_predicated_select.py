"""A select on a test of positions, emitted as predicates in PTX for the Gluon kernels (codegen/predicated.py).
PTX does not run here: the emitted select is read back by a small evaluator of the PTX it uses (setp, and/or/not
of predicates, selp) and compared with the condition's own evaluation on random positions. That the PTX compiles
is checked by test_gluon's compile for Hopper; that kernels using it are right, on the GPU (check_kernels)."""
import re
import struct

import numpy as np
import pytest

from neptune_eqsat.codegen.predicated import predicated_where

from conftest import SPECS, compiled, spec_variant

SETP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
        "ne": np.not_equal}


def _run_ptx(asm: str, args: list) -> np.ndarray:
    """Evaluate the emitted PTX select on numpy arrays ($1.. the arguments, fp32 immediates as 0fXXXXXXXX)."""
    regs = {}

    def value(tok):
        tok = tok.strip()
        if tok.startswith("$"):
            return args[int(tok[1:]) - 1]
        if tok.startswith("0f"):
            return np.float32(struct.unpack(">f", bytes.fromhex(tok[2:]))[0])
        return regs[tok]

    for ins in asm.strip("{} ").split(";")[1:]:
        ins = ins.strip()
        if not ins:
            continue
        op, operands = ins.split(" ", 1)
        dst, *srcs = [x.strip() for x in operands.split(",")]
        kind = op.split(".")
        if kind[0] == "setp":
            regs[dst] = SETP[kind[1]](value(srcs[0]), value(srcs[1]))
        elif kind[0] in ("and", "or"):
            regs[dst] = (np.logical_and if kind[0] == "and" else np.logical_or)(value(srcs[0]), value(srcs[1]))
        elif kind[0] == "not":
            regs[dst] = np.logical_not(value(srcs[0]))
        elif kind[0] == "selp":
            return np.where(value(srcs[2]), value(srcs[0]), value(srcs[1]))
    raise AssertionError("no selp in " + asm)


@pytest.mark.parametrize("mask, expected", [
    ("i >= j", lambda i, j: i >= j),
    ("(i >= j) & (i - j < 7)", lambda i, j: (i >= j) & (i - j < 7)),
    ("(j < 5) | (i >= j)", lambda i, j: (j < 5) | (i >= j)),
    ("~((i // 4) != (j // 4))", lambda i, j: (i // 4) == (j // 4)),
])
def test_a_test_of_positions_becomes_one_predicate_per_element(mask, expected):
    from neptune_eqsat.frontend.spec import Spec, f32, where, inf

    spec = Spec("masked")
    n = spec.dims(N=64)
    i, j = spec.axes(i=16, j=n)
    x = spec.input("x", f32, 16, n)
    cond = eval(mask, {"i": i, "j": j})
    term = where(cond, x[i, j], -inf).term

    class Writer:   # the writer's part the select reads: emitted operands as names bound below
        def __init__(self):
            self.values, self.lines = {}, []

        def emit(self, t, prev):
            from neptune_eqsat.codegen.values import Val
            if t.op == "const" and not float(t.attrs[0]).is_integer():   # a literal, as the writer's code
                return Val(f"float('{t.attrs[0]}')" if abs(t.attrs[0]) == float("inf") else repr(t.attrs[0]), (),
                           "f32")
            name = f"v{len(self.values)}"
            self.values[name] = t
            return Val(name, ("i", "j") if t.free else (), "f32" if t.op == "load" else "int")

        def as_float(self, v):
            return v

        def int_as_float(self, v):
            return v

        def canon(self, axes):
            return tuple(a for a in ("i", "j") if a in axes)

        def expand(self, v, axes):
            return v.code

        def put(self, blk, code):
            self.lines.append(code)
            return "t"

    w = Writer()
    assert predicated_where(w, term, False, "body") is not None
    asm, _, args = re.match(r"gl\.inline_asm_elementwise\('(.*?)', '(.*?)', \[(.*?)\]", w.lines[-1]).groups()
    rng = np.random.default_rng(0)
    iv, jv = rng.integers(0, 40, 500), rng.integers(0, 40, 500)
    xv = rng.standard_normal(500).astype(np.float32)

    def evaluate(t):   # an operand's value on the random positions
        from neptune_eqsat import ir
        if t.op == "axis":
            return {"i": iv, "j": jv}[t.attrs[0]]
        if t.op == "const":
            return np.int64(t.attrs[0])
        if t.op == "load":
            return xv
        if t.op == "bin":
            a, b = (evaluate(x) for x in t.args)
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide,
                    "mod": np.mod}[t.attrs[0]](a, b)
        raise AssertionError(ir.show(t))

    values = [evaluate(w.values[a.strip()]) for a in args.split(",")]
    got = _run_ptx(asm, values)
    want = np.where(expected(iv, jv), xv, -np.inf)
    assert np.array_equal(got, want)


def test_a_condition_that_reads_data_keeps_the_plain_select():
    from neptune_eqsat.frontend.spec import Spec, f32, i32, where, inf

    spec = Spec("by_document")
    n = spec.dims(N=64)
    i, j = spec.axes(i=16, j=n)
    x = spec.input("x", f32, 16, n)
    doc = spec.input("doc", i32, n)
    assert predicated_where(None, where(doc[j] == 3, x[i, j], -inf).term, False, "body") is None


def test_the_causal_and_windowed_gluon_kernels_test_their_masks_as_predicates(tmp_path):
    for name in ("causal_pf", "window_pf"):
        result, _ = compiled(str(SPECS / f"{name}.py"))
        assert "setp.ge.s32" in result.source and "gl.inline_asm_elementwise" in result.source, name
        assert "offs_i[:, None] >= offs_j[None, :]" not in result.source.split("_gluon_kernel")[0].split(
            "_consumer(")[-1]
    # the global kernel has no mask: no select, and no EVEN constexpr
    result, _ = compiled(str(SPECS / "global_pf.py"))
    assert "inline_asm" not in result.source and "EVEN: gl.constexpr" not in result.source
