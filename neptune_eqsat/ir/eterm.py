"""The IR mirrored into egglog: one sort, one constructor per IR op, and the analyses the rules read.

Loads are leaves in the e-graph (their index terms stay on the Python side, keyed by their text); their
free axes are set from Python when the term is added.
"""
# mypy: disable-error-code="empty-body"
from __future__ import annotations

from egglog import EGraph, Expr, Set, String, StringLike, f64Like, function, i64, set_

from neptune_eqsat import ir
from neptune_eqsat.ir import Term


class ETerm(Expr):
    @classmethod
    def axis(cls, name: StringLike) -> ETerm: ...
    @classmethod
    def dim(cls, name: StringLike) -> ETerm: ...
    @classmethod
    def const(cls, value: f64Like) -> ETerm: ...
    @classmethod
    def load(cls, tensor: StringLike, index_key: StringLike) -> ETerm: ...
    @classmethod
    def un(cls, fn: StringLike, a: ETerm) -> ETerm: ...
    @classmethod
    def bin(cls, fn: StringLike, a: ETerm, b: ETerm) -> ETerm: ...
    @classmethod
    def where(cls, c: ETerm, a: ETerm, b: ETerm) -> ETerm: ...
    @classmethod
    def cast(cls, dtype: StringLike, a: ETerm) -> ETerm: ...
    @classmethod
    def red(cls, reducer: StringLike, axis: StringLike, body: ETerm) -> ETerm: ...
    @classmethod
    def roll(cls, reducer: StringLike, axis: StringLike, body: ETerm, repair: ETerm) -> ETerm: ...
    @classmethod
    def split(cls, reducer: StringLike, axis: StringLike, chunks: StringLike, body: ETerm, repair: ETerm) -> ETerm: ...
    @classmethod
    def acc(cls) -> ETerm: ...
    @classmethod
    def prev(cls, axis: StringLike, a: ETerm) -> ETerm: ...
    @classmethod
    def pack(cls, a: ETerm, b: ETerm) -> ETerm: ...   # outputs of one kernel, n of them as nested pairs


AxisSet = Set[String]


@function(merge=lambda old, new: old & new)
def free(e: ETerm) -> AxisSet:
    """Axes the value varies along (intersection: if one equal form lacks an axis, the value does)."""


@function(merge=lambda old, new: old & new)
def deps(e: ETerm) -> AxisSet:
    """Axes of the reductions the value is computed from. Rewrites are identities for every value of those
    reductions, so one equal form without a reduction over j shows the value does not depend on it."""


@function(merge=lambda old, new: old.max(new))
def nonpositive(e: ETerm) -> i64:
    """1 when the value is known to be <= 0 (so exp of it cannot overflow); read by the cost model."""


@function
def extent(axis: StringLike) -> String:
    """The dim an axis runs over, where the spec names one (set from Python when the term is added)."""


@function(merge=lambda old, new: old.max(new))
def running_max(e: ETerm) -> i64:
    """1 for a maximum over an axis (or a positive multiple of one): -inf until an element above -inf is seen,
    so x - max is NaN in a block or chunk whose elements are all -inf; read by the cost model."""


@function(merge=lambda old, new: old.max(new))
def running_min(e: ETerm) -> i64:
    """1 for a minimum over an axis (or a positive multiple of one): +inf until an element below +inf is seen,
    so min - x is NaN in a block or chunk whose elements are all +inf; read by the cost model."""


@function(merge=lambda old, new: old.max(new))
def whole_count(e: ETerm) -> i64:
    """1 for a dim some axis runs over: dividing a running sum over that axis by it gives the whole row's
    mean only once the row is done; read by the cost model."""


def load_key(index: tuple[Term, ...]) -> str:
    """A read's index as the e-graph keeps it (a string literal of the load e-node)."""
    return ", ".join(ir.show(a) for a in index)


class Mirror:
    """Converts IR terms to e-graph terms (plan/snapshot.py reads them back); remembers load indices."""

    def __init__(self) -> None:
        self.loads: dict[tuple[str, str], tuple[Term, ...]] = {}
        self.facts: list = []

    def to_egg(self, t: Term) -> ETerm:
        memo: dict[Term, ETerm] = {}

        def go(x: Term) -> ETerm:
            if x in memo:
                return memo[x]
            op, at = x.op, x.attrs
            if op == "load":
                key = load_key(x.args)
                self.loads[(at[0], key)] = x.args
                y = ETerm.load(at[0], key)
                axes = sorted(x.free)
                self.facts += [set_(free(y)).to(AxisSet(*axes) if axes else AxisSet.empty()),
                               set_(deps(y)).to(AxisSet.empty())]
            elif op == "pack":
                kids = [go(a) for a in x.args]
                y = kids[-1]
                for k in reversed(kids[:-1]):
                    y = ETerm.pack(k, y)
            else:
                kids = [go(a) for a in x.args]
                y = {"axis": lambda: ETerm.axis(at[0]), "dim": lambda: ETerm.dim(at[0]),
                     "const": lambda: ETerm.const(at[0]), "un": lambda: ETerm.un(at[0], *kids),
                     "bin": lambda: ETerm.bin(at[0], *kids), "where": lambda: ETerm.where(*kids),
                     "cast": lambda: ETerm.cast(at[0], *kids), "red": lambda: ETerm.red(at[0], at[1], *kids),
                     "roll": lambda: ETerm.roll(at[0], at[1], *kids), "acc": ETerm.acc,
                     "split": lambda: ETerm.split(at[0], at[1], at[2], *kids),
                     "prev": lambda: ETerm.prev(at[0], *kids)}[op]()
            memo[x] = y
            return y

        return go(t)


def egraph_size(eg: EGraph) -> int:
    """E-nodes (rows of the constructor table), not analysis rows."""
    return sum(n for f, n in eg.all_function_sizes() if str(f).startswith("ETerm."))
