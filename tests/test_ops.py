"""The op registry: every op declares every form, and the forms agree with the sympy one on its domain."""
import ast
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy as sp
import torch

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.codegen import intervals
from neptune_eqsat.codegen.values import OP_CODE

REALS = [-2.5, -1.25, -0.5, 0.0, 0.3, 0.5, 1.5, 2.5, 3.7]
POSITIVE = [0.3, 0.5, 1.5, 2.5, 3.7]
NONZERO = [x for x in REALS if x != 0]
UNARY_DOMAIN = {"log": POSITIVE, "sqrt": POSITIVE, "recip": NONZERO}
NATURALS = [0.0, 1.0, 3.0, 6.0, 13.0]
SHIFTS = [0.0, 1.0, 2.0, 3.0]


def binary_domain(op: ops.Op) -> list[tuple[float, float]]:
    if op.bitwise:
        return [(a, b) for a in NATURALS for b in (SHIFTS if op.name in ("shl", "shr") else NATURALS)]
    divisors = NONZERO if op.name in ("div", "floordiv", "mod") else REALS
    return [(a, b) for a in REALS for b in divisors]


def sympy_value(op: ops.Op, values) -> float:
    """The sympy form built over symbols, then evaluated at exact rationals: what a proof would see."""
    syms = sp.symbols("a b", real=True)[:op.arity]
    expr = op.sympy(sp, *syms)
    return float(expr.subs({s: sp.Rational(v) for s, v in zip(syms, values)}))


def forms_at(op: ops.Op, values) -> dict[str, float]:
    return {
        "python": float(op.python(*values)),
        "torch": float(op.torch(torch, *(torch.tensor(v, dtype=torch.float64) for v in values)).double()),
        "numpy": float(op.numpy(np, *(np.float64(v) for v in values))),
    }


def close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-12 * max(1.0, abs(x), abs(y))


def domain(op: ops.Op) -> list[tuple[float, ...]]:
    if op.kind == "un":
        return [(v,) for v in UNARY_DOMAIN.get(op.name, REALS)]
    return binary_domain(op)


ALL = [*ops.UN.values(), *ops.BIN.values()]


def test_every_op_has_every_field():
    for kind, table in ops.OPS.items():
        for name, op in table.items():
            assert (op.name, op.kind) == (name, kind)
            for f in dataclasses.fields(op):
                if f.default is dataclasses.MISSING:
                    assert getattr(op, f.name) is not None, (name, f.name)
            assert all(callable(getattr(op, form)) for form in ("sympy", "python", "torch", "numpy"))
            assert op.work > 0
            assert op.group == "unary" if kind == "un" else op.group in ("arith", "compare", "logic", "integer")
            assert op.negation is None or (op.group == "compare" and ops.BIN[op.negation].negation == name)
            assert not op.keeps_integer or kind == "un"
            assert not (op.keeps_nonnegative or op.infix or op.bitwise) or kind == "bin"
            assert (op.derivative is None) == op.flat, f"{name}: a derivative, or flat (piecewise constant)"
    assert not set(ops.UN) & set(ops.BIN)   # extraction's work table is keyed by the name alone


def test_ir_names_are_the_registry():
    assert ir.UNARY == tuple(ops.UN)
    assert set(ir.BINARY) == set(ops.BIN) and len(ir.BINARY) == len(ops.BIN)


@pytest.mark.parametrize("op", ALL, ids=lambda op: op.name)
def test_forms_agree_with_the_sympy_form(op):
    for values in domain(op):
        want, got = sympy_value(op, values), forms_at(op, values)
        assert all(close(v, want) for v in got.values()), (values, want, got)


def test_or_zero_forms_give_zero_where_the_value_is_not_finite():
    for name in ("finite_or_zero", "exp_or_zero", "exp2_or_zero"):
        op = ops.UN[name]
        for x in ((math.inf, math.nan) if name == "finite_or_zero" else (1e4, math.inf, math.nan)):
            assert forms_at(op, (x,)) == {"python": 0.0, "torch": 0.0, "numpy": 0.0}, (name, x)


@pytest.mark.parametrize("op", ALL, ids=lambda op: op.name)
def test_every_op_has_a_triton_lowering_and_gluon_says_whether_it_has_one(op):
    operands = ["x", "y"][:op.arity]
    code = op.triton.format(*operands)
    ast.parse(code, mode="eval")
    assert all(x in code for x in operands) and "{" not in code
    assert OP_CODE["tl"][op.kind][op.name] == op.triton
    if op.gluon != ops.NO_GLUON:   # its own Gluon lowering, or the Triton one in Gluon's namespace
        code = OP_CODE["gl"][op.kind][op.name].format(*operands)
        ast.parse(code, mode="eval")
        assert "tl." not in code and (op.gluon is None or code == op.gluon.format(*operands))


def test_the_interval_runtime_computes_exact_values_as_the_reference_does():
    """intervals.py is copied as text into generated modules, so it keeps its own tables: they must agree."""
    x = torch.tensor(REALS, dtype=torch.float64)
    for name, f in {**intervals._EXACT_UN, **intervals._IV_INCREASING}.items():
        xs = x[x > 0] if name in UNARY_DOMAIN else x
        assert torch.allclose(f(xs).double(), ops.UN[name].torch(torch, xs).double(), rtol=1e-12, equal_nan=True), name
    for name, f in intervals._EXACT_BIN.items():
        op = ops.BIN[name]
        a, b = (torch.tensor(v, dtype=torch.float64) for v in zip(*binary_domain(op)))
        assert torch.allclose(f(a, b).double(), op.torch(torch, a, b).double(), rtol=1e-12), name


def test_the_registry_imports_nothing_of_the_package_nor_a_numeric_library():
    tree = ast.parse(Path(ops.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
               {n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    assert imported <= {"__future__", "math", "operator", "dataclasses", "functools", "typing"}
    code = "import sys, neptune_eqsat.ir; print(sorted({'torch', 'numpy', 'sympy'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
