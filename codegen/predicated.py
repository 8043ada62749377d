"""A select on a test of positions, as one predicate per element (Gluon kernels, which run on NVIDIA GPUs only).

`where(i >= j, s, -inf)` written as a comparison tile and a select compiles, through LLVM, to the comparison's
bits packed into integers and unpacked again at the select: an H200 ran a causal tile's diagonal block in 1444
instructions a warp where an unmasked block takes 484 (bench/results/h200/2026-11-29-prefill-ncu). The same
test written as PTX (setp per comparison, and/or/not of predicates, selp) keeps each element's bit in a
predicate register: 650 instructions. It applies where the condition is built from comparisons of positions and
sizes (integers computed in the kernel, never loaded), combined by and, or and not, and both branches are fp32."""
from __future__ import annotations

import struct

from neptune_eqsat.ir import Term

from .values import Val

COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC = ("and", "or")
INTEGER_ARITHMETIC = ("add", "sub", "mul", "floordiv", "mod", "max", "min")


def _positional(t: Term) -> bool:
    """Is t an integer computed from positions, sizes and integer constants alone?"""
    if t.op in ("axis", "dim"):
        return True
    if t.op == "const":
        return float(t.attrs[0]).is_integer()
    return t.op == "bin" and t.attrs[0] in INTEGER_ARITHMETIC and all(map(_positional, t.args))


def _test(c: Term, leaves: list[tuple[str, Term, Term]], lines: list[str]) -> str | None:
    """The predicate register holding condition c, its PTX appended to `lines` (a comparison of the leaf k reads
    the arguments $2k+1 and $2k+2, its operands, which `leaves` collects); None where c is not a test of
    positions."""
    if c.op == "bin" and c.attrs[0] in COMPARISONS and all(map(_positional, c.args)):
        k = len(leaves)
        leaves.append((c.attrs[0], *c.args))
        lines.append(f"setp.{c.attrs[0]}.s32 q{k}, ${2 * k + 1}, ${2 * k + 2};")
        return f"q{k}"
    if (c.op == "bin" and c.attrs[0] in LOGIC) or (c.op == "un" and c.attrs[0] == "not"):
        parts = [_test(a, leaves, lines) for a in c.args]
        if None in parts:
            return None
        out = f"r{len(lines) - len(leaves)}"   # (lines: a comparison per leaf, then the logic so far)
        lines.append(f"{c.attrs[0]}.pred {out}, {', '.join(parts)};")
        return out
    return None


def _immediate(t: Term) -> str | None:
    """A constant branch as a PTX fp32 immediate."""
    return "0f" + struct.pack(">f", float(t.attrs[0])).hex().upper() if t.op == "const" else None


def predicated_where(w, t: Term, prev: bool, blk: str) -> Val | None:
    """where(c, a, b) as an inline PTX select when c tests positions and a, b are fp32; else None."""
    leaves, lines = [], []
    final = _test(t.args[0], leaves, lines)
    if final is None or len(leaves) > 6:
        return None
    a, b = (w.as_float(w.int_as_float(w.emit(x, prev))) for x in t.args[1:])
    if a.dtype != "f32" or b.dtype != "f32":
        return None
    operands = [o for _, u, v in leaves for o in (w.emit(u, prev), w.emit(v, prev))]
    axes = w.canon(set(a.axes) | set(b.axes) | {x for o in operands for x in o.axes})
    if not axes:
        return None
    args = [w.expand(o, axes) for o in operands]   # (a scalar, a size or a constant, is broadcast with the tiles)
    picks = []
    for v, term in zip((a, b), t.args[1:]):
        imm = _immediate(term)
        if imm is None:
            args.append(w.expand(v, axes))
            imm = f"${len(args)}"
        picks.append(imm)
    regs = [line.split()[1].rstrip(",") for line in lines]
    lines.append(f"selp.f32 $0, {picks[0]}, {picks[1]}, {final};")
    asm = "{ .reg .pred " + ", ".join(regs) + "; " + " ".join(lines) + " }"
    constraints = ",".join(["=r"] + ["r"] * len(args))
    code = (f"gl.inline_asm_elementwise({asm!r}, {constraints!r}, [{', '.join(args)}], dtype=gl.float32, "
            "is_pure=True, pack=1)")
    return Val(w.put(blk, code), axes, "f32")
