"""A select on a test of positions, as one predicate per element (Gluon kernels, which run on NVIDIA GPUs only).

`where(i >= j, s, -inf)` written as a comparison tile and a select compiles, through LLVM, to the comparison's
bits packed into integers and unpacked again at the select: an H200 ran a causal tile's diagonal block in 1444
instructions a warp where an unmasked block takes 484 (bench/results/h200/2026-11-29-prefill-ncu). The same
test written as PTX (setp per comparison, and/or/not of predicates, selp) keeps each element's bit in a
predicate register: 650 instructions. It applies where the condition is built from comparisons of positions and
sizes (integers computed in the kernel, never loaded), combined by and, or and not, and both branches are fp32."""
from __future__ import annotations

import re
import struct

from neptune_eqsat.ir import Term

from .values import Val

COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC = {"and": "and", "or": "or"}
INTEGER_ARITHMETIC = ("add", "sub", "mul", "floordiv", "mod", "max", "min")


def _positional(t: Term) -> bool:
    """Is t an integer computed from positions, sizes and integer constants alone?"""
    if t.op in ("axis", "dim"):
        return True
    if t.op == "const":
        return float(t.attrs[0]).is_integer()
    return t.op == "bin" and t.attrs[0] in INTEGER_ARITHMETIC and all(map(_positional, t.args))


def _test(c: Term, leaves: list[tuple[str, Term, Term]]) -> str | None:
    """The predicate expression of condition c as nested (op, ...) text, collecting its comparisons in
    `leaves`; None where c is not a test of positions."""
    if c.op == "bin" and c.attrs[0] in COMPARISONS and all(map(_positional, c.args)):
        leaves.append((c.attrs[0], *c.args))
        return f"q{len(leaves) - 1}"
    if c.op == "bin" and c.attrs[0] in LOGIC:
        parts = [_test(a, leaves) for a in c.args]
        return None if None in parts else f"({LOGIC[c.attrs[0]]} {parts[0]} {parts[1]})"
    if c.op == "un" and c.attrs[0] == "not":
        inner = _test(c.args[0], leaves)
        return None if inner is None else f"(not {inner})"
    return None


LITERAL = re.compile(r"float\('(-?inf)'\)|-?[0-9]+(\.[0-9]*)?(e[-+]?[0-9]+)?")


def _immediate(v: Val) -> str | None:
    """A constant branch (a literal: 0.0, float('-inf'), 1.5e-3) as a PTX fp32 immediate."""
    m = LITERAL.fullmatch(v.code) if not v.axes else None
    if m is None:
        return None
    return "0f" + struct.pack(">f", float(m[1] or v.code)).hex().upper()


def predicated_where(w, t: Term, prev: bool, blk: str) -> Val | None:
    """where(c, a, b) as an inline PTX select when c tests positions and a, b are fp32; else None."""
    leaves: list = []
    expr = _test(t.args[0], leaves)
    if expr is None or len(leaves) > 6:
        return None
    a, b = (w.as_float(w.int_as_float(w.emit(x, prev))) for x in t.args[1:])
    if a.dtype != "f32" or b.dtype != "f32":
        return None
    operands = [(w.emit(u, prev), w.emit(v, prev)) for _, u, v in leaves]
    axes = w.canon(set(a.axes) | set(b.axes) | {x for pair in operands for o in pair for x in o.axes})
    if not axes:
        return None
    args, lines, steps = [], [], 0
    for k, ((cmp, _, _), pair) in enumerate(zip(leaves, operands)):
        refs = []
        for o in pair:   # (a scalar, a size or a constant, is broadcast with the tiles)
            args.append(w.expand(o, axes))
            refs.append(f"${len(args)}")
        lines.append(f"setp.{cmp}.s32 q{k}, {refs[0]}, {refs[1]};")

    def lower(e: str) -> str:   # nested (op x y) text into and/or/not of predicates, innermost first
        nonlocal steps
        if not e.startswith("("):
            return e
        op, rest = e[1:-1].split(" ", 1)
        depth, cut = 0, None
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if ch == " " and depth == 0:
                cut = i
                break
        kids = [rest] if op == "not" else [rest[:cut], rest[cut + 1:]]
        names = [lower(x) for x in kids]
        out = f"r{steps}"
        steps += 1
        lines.append(f"{op}.pred {out}, {', '.join(names)};")
        return out

    final = lower(expr)
    picks = []
    for v, term in zip((a, b), t.args[1:]):
        imm = "0f" + struct.pack(">f", float(term.attrs[0])).hex().upper() if term.op == "const" else _immediate(v)
        if imm is None:
            args.append(w.expand(v, axes))
            imm = f"${len(args)}"
        picks.append(imm)
    regs = [f"q{k}" for k in range(len(leaves))] + [f"r{k}" for k in range(steps)]
    lines.append(f"selp.f32 $0, {picks[0]}, {picks[1]}, {final};")
    asm = "{ .reg .pred " + ", ".join(regs) + "; " + " ".join(lines) + " }"
    constraints = ",".join(["=r"] + ["r"] * len(args))
    code = (f"gl.inline_asm_elementwise({asm!r}, {constraints!r}, [{', '.join(args)}], dtype=gl.float32, "
            "is_pure=True, pack=1)")
    return Val(w.put(blk, code), axes, "f32")
