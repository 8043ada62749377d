"""What a kernel writer's values are: a Triton expression over tile axes (`Val`), the block and states an
expression is emitted under (`Context`), and the Triton spellings of the registry's ops, dtypes and identities."""
from __future__ import annotations

from dataclasses import dataclass, field

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term

DTYPE_NAMES = {**ir.TORCH_NAMES, "bool": "int1"}   # Triton's names are torch's but for its truth values


def _in_gluon(template: str) -> str:
    """A Triton lowering in Gluon's namespace (the same functions, math's among them, under gl)."""
    return template.replace("tl.math.", "gl.").replace("tl.", "gl.")


# each target's lowering of every op of the registry: Gluon takes an op's own where the registry gives one
OP_CODE = {
    "tl": {kind: {name: op.triton for name, op in table.items()} for kind, table in ops.OPS.items()},
    "gl": {kind: {name: op.gluon if op.gluon not in (None, ops.NO_GLUON) else _in_gluon(op.triton)
                  for name, op in table.items()} for kind, table in ops.OPS.items()},
}


def dtype_code(lang: str, dtype: str) -> str:
    """A spec dtype in the target's language: dtype_code("tl", "bf16") is tl.bfloat16."""
    return f"{lang}.{DTYPE_NAMES[dtype]}"


def value_dtype(spec_dtype: str) -> str:
    """The dtype of a value read from an input of `spec_dtype`: integers of any width are "int" (read exactly as
    stored, like positions), truth values "bool", floats their own."""
    return "bool" if spec_dtype == "bool" else "int" if spec_dtype in ir.INT_DTYPES else spec_dtype


BIT_OPS = ops.named("bin", bitwise=True)
IDENTITY_CODE = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}


@dataclass
class Val:
    code: str
    axes: tuple[str, ...]   # tile axes, canonical order
    dtype: str              # f16, bf16, f32, int, bool


@dataclass
class Context:
    body: str                          # block for values that vary per block or read running states
    pre: str                           # block for values that only read finished reductions
    complete: set = field(default_factory=set)
    running: set = field(default_factory=set)
    masked: bool = True
    acc: Val | None = None


def nonnegative(t: Term) -> bool:
    """Is t never negative (positions, sizes and what sums, products and quotients of them give)?"""
    if t.op in ("axis", "dim"):
        return True
    if t.op == "const":
        return t.attrs[0] >= 0
    if t.op == "cast":
        return nonnegative(t.args[0])
    if t.op == "bin" and ops.BIN[t.attrs[0]].keeps_nonnegative:
        return all(nonnegative(a) for a in t.args)
    if t.op == "where":
        return nonnegative(t.args[1]) and nonnegative(t.args[2])
    return False


def rounded_to(t: Term, dtype: str) -> bool:
    """Is t a product whose every factor is a cast to `dtype` (under a mask selecting it or a zero)?"""
    if t.op == "bin" and t.attrs[0] == "mul":
        return all(rounded_to(a, dtype) for a in t.args)
    if t.op == "where" and t.args[2] == ir.const(0.0):
        return rounded_to(t.args[1], dtype)
    return t.op == "cast" and t.attrs[0] == dtype


def pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())
