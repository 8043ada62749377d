"""The one IR: scalar terms in index notation.

A `Term` is a node `op` with literal `attrs` and child terms `args` (tinygrad-style: one node class, the
meaning lives in tables keyed by op). Free axes name the loops a value depends on; a reduction binds its axis.
The same terms are mirrored into the e-graph (`eterm.py`), evaluated in float64 (`reference.py`) and emitted
as Triton (`codegen/`).

ops and their fields
  axis   attrs=(name,)             the value of a loop index
  dim    attrs=(name,)             a run-time extent (a size given by the input shapes)
  const  attrs=(value,)            a float constant
  load   attrs=(tensor,)  args=index terms
  un     attrs=(fn,)      args=(a,)          fn in UNARY
  bin    attrs=(fn,)      args=(a, b)        fn in BINARY (arithmetic, comparisons, logic)
  where  args=(cond, a, b)
  cast   attrs=(dtype,)   args=(a,)
  red    attrs=(reducer, axis)  args=(body,)          reducer over axis of body
  roll   attrs=(reducer, axis)  args=(body, repair)   the same reduction run in one pass with its producers;
                                                     repair says how to re-tag the partial result
  split  attrs=(reducer, axis, chunks)  args=(body, repair)
                                                     the reduction privatized over `chunks` slices of axis
                                                     (a run-time parameter), each rolled on its own; the
                                                     partials are combined with the same repair, acc being
                                                     a chunk's partial and prev the chunk's own reductions
  acc                                          the partial result inside a repair term
  prev   attrs=(axis,)    args=(a,)            a computed from the previous partial values of reductions over axis
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from neptune_eqsat.ir import ops

# the scalar ops and their forms live in ops.py; these are their names, grouped as callers test them
UNARY = ops.named("un")
ARITH = ops.named("bin", group="arith")
COMPARE = ops.named("bin", group="compare")
LOGIC = ops.named("bin", group="logic")
INTEGER = ops.named("bin", group="integer")   # floor division and bit operations of integers
BINARY = ARITH + COMPARE + LOGIC + INTEGER
REDUCERS = {"sum": 0.0, "max": -math.inf, "min": math.inf}  # reducer -> identity
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")
# inputs may also hold integers or truth values (document ids, offsets, flags), read exactly as stored; outputs and
# casts are floating point
INT_DTYPES = ("bool", "i8", "u8", "i16", "i32", "i64")
DTYPES = FLOAT_DTYPES + INT_DTYPES
TORCH_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "bool": "bool",
               "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64"}
DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "bool": 1, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8}


@dataclass(frozen=True)
class Term:
    op: str
    attrs: tuple = ()
    args: tuple[Term, ...] = ()
    # where the term was written (spec file, line); not part of its identity
    origin: str | None = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        return show(self)

    def __hash__(self) -> int:
        """Computed once per node: terms are keys of many memos, and the generated hash walks the whole tree."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.attrs, self.args))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other) -> bool:
        """Structural equality, each pair of distinct equal nodes compared once: the generated comparison walks
        the whole tree, exponential in the depth of a term that reuses a value (e = e * 0.9 + tanh(e) twenty
        times over held a compile for minutes in the memos keyed by terms)."""
        if self is other:
            return True
        if not isinstance(other, Term) or hash(self) != hash(other) or self.op != other.op or \
                self.attrs != other.attrs or len(self.args) != len(other.args):
            return False
        pair = (id(self), id(other))
        if pair in _EQUAL:
            return True
        if not all(a == b for a, b in zip(self.args, other.args)):
            return False
        if len(_EQUAL) > 1 << 16:
            _EQUAL.clear()
        _EQUAL[pair] = (self, other)   # kept alive, so that the ids stay theirs
        return True

    @cached_property
    def free(self) -> frozenset[str]:
        """Axes the value depends on."""
        if self.op == "axis":
            return frozenset(self.attrs[:1])
        inner = frozenset().union(*(a.free for a in self.args)) if self.args else frozenset()
        if self.op in ("red", "roll", "split"):
            return inner - {self.attrs[1]}
        if self.op == "rename":   # the same value, one axis under another name (schedule.py)
            return (inner - {self.attrs[0]}) | {self.attrs[1]}
        return inner

    @cached_property
    def size(self) -> int:
        return 1 + sum(a.size for a in self.args)


_EQUAL: dict[tuple[int, int], tuple[Term, Term]] = {}   # pairs of distinct nodes found equal
TREE_LIMIT = 20000   # nodes of a term's tree past which show() names its shared sub-terms (show_lets)


def axis(name: str) -> Term: return Term("axis", (name,))
def dim(name: str) -> Term: return Term("dim", (name,))
def const(value: float) -> Term: return Term("const", (float(value),))
def load(tensor: str, *index: Term) -> Term: return Term("load", (tensor,), tuple(index))
def un(fn: str, a: Term) -> Term: return Term("un", (fn,), (a,))
def bin(fn: str, a: Term, b: Term) -> Term: return Term("bin", (fn,), (a, b))
def where(c: Term, a: Term, b: Term) -> Term: return Term("where", (), (c, a, b))
def cast(dtype: str, a: Term) -> Term: return Term("cast", (dtype,), (a,))
def red(reducer: str, ax: str, body: Term) -> Term: return Term("red", (reducer, ax), (body,))
def roll(reducer: str, ax: str, body: Term, repair: Term) -> Term: return Term("roll", (reducer, ax), (body, repair))
def prev(ax: str, a: Term) -> Term: return Term("prev", (ax,), (a,))
def split(reducer: str, ax: str, chunks: str, body: Term, repair: Term) -> Term:
    return Term("split", (reducer, ax, chunks), (body, repair))
ACC = Term("acc")


def pack(*terms: Term) -> Term:
    """Several outputs of one kernel: no value of its own (only the compiler's root and a plan's term)."""
    return Term("pack", (), tuple(terms))


def is_reduction(t: Term) -> bool:
    return t.op in ("red", "roll", "split")


def walk(t: Term):
    """Every distinct sub-term, children before parents."""
    seen: set[Term] = set()
    order: list[Term] = []

    def go(x: Term) -> None:
        if x in seen:
            return
        seen.add(x)
        for a in x.args:
            go(a)
        order.append(x)

    go(t)
    return order


def reductions_over(t: Term, ax: str) -> list[Term]:
    """Reductions over `ax` that `t` refers to (not looking inside them), outermost first."""
    found: list[Term] = []

    def go(x: Term) -> None:
        if is_reduction(x) and x.attrs[1] == ax:
            if x not in found:
                found.append(x)
            return
        if x.op == "prev":
            return
        for a in x.args:
            go(a)

    go(t)
    return found


def bottom_up(t: Term, fn) -> Term:
    """t rebuilt from its leaves up, each node (with its children already rebuilt) replaced by fn(node); each
    shared subterm is rebuilt once."""
    memo: dict[Term, Term] = {}

    def go(x: Term) -> Term:
        if x not in memo:
            memo[x] = fn(Term(x.op, x.attrs, tuple(go(a) for a in x.args), x.origin) if x.args else x)
        return memo[x]

    return go(t)


def substitute(t: Term, mapping: dict[Term, Term]) -> Term:
    memo: dict[Term, Term] = {}

    def go(x: Term) -> Term:
        if x in mapping:
            return mapping[x]
        if x in memo:
            return memo[x]
        y = Term(x.op, x.attrs, tuple(go(a) for a in x.args), x.origin) if x.args else x
        memo[x] = y
        return y

    return go(t)


_INFIX = {name: op.infix for name, op in ops.BIN.items() if op.infix}


def show(t: Term) -> str:
    """Readable one-line form, close to spec syntax; a term whose tree is huge (a value reused at every level of
    a deep expression) as its shared sub-terms named once, `v1 = ...; ...; out = ...` (show_lets)."""
    if t.size > TREE_LIMIT:
        return "; ".join(show_lets(t))
    op, at, ar = t.op, t.attrs, t.args
    if op in ("axis", "dim"):
        return at[0]
    if op == "const":
        v = at[0]
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(int(v)) if v == int(v) and abs(v) < 1e9 else repr(v)
    if op == "acc":
        return "acc"
    if op == "load":
        return f"{at[0]}[{', '.join(show(a) for a in ar)}]"
    if op == "un":
        return f"-{show(ar[0])}" if at[0] == "neg" else f"{at[0]}({show(ar[0])})"
    if op == "bin":
        if at[0] in _INFIX:
            return f"({show(ar[0])} {_INFIX[at[0]]} {show(ar[1])})"
        return f"{at[0]}({show(ar[0])}, {show(ar[1])})"
    if op == "where":
        return f"where({show(ar[0])}, {show(ar[1])}, {show(ar[2])})"
    if op == "cast":
        return f"cast({show(ar[0])}, {at[0]})"
    if op == "red":
        return f"{at[0]}({at[1]}, {show(ar[0])})"
    if op == "roll":
        return f"roll_{at[0]}({at[1]}, {show(ar[0])}, repair={show(ar[1])})"
    if op == "split":
        return f"split_{at[0]}({at[1]} / {at[2]}, {show(ar[0])}, repair={show(ar[1])})"
    if op == "prev":
        return f"prev_{at[0]}({show(ar[0])})"
    if op == "pack":
        return f"pack({', '.join(show(a) for a in ar)})"
    if op == "rename":
        return f"rename({at[0]} -> {at[1]}, {show(ar[0])})"
    return f"{op}{at}{ar}"


def show_lets(t: Term) -> list[str]:
    """Readable multi-line form: reductions and repeated sub-terms get names (r1, v1, ...), defined before use."""
    uses: dict[Term, int] = {}

    def count(x: Term) -> None:
        uses[x] = uses.get(x, 0) + 1
        if uses[x] == 1:
            for a in x.args:
                count(a)

    count(t)
    named: dict[Term, str] = {}
    lines: list[str] = []

    def go(x: Term) -> str:
        if x in named:
            return named[x]
        if not x.args:
            return show(x)
        inner = Term(x.op, x.attrs, tuple(Term("axis", (go(a),)) for a in x.args))
        text = show(inner)
        if x is not t and (is_reduction(x) or (uses.get(x, 0) > 1 and x.size > 3)):
            name = f"{'r' if is_reduction(x) else 'v'}{len(named) + 1}"
            named[x] = name
            lines.append(f"{name} = {text}")
            return name
        return text

    lines.append(f"out = {go(t)}")
    return lines
