"""A tile gathered at an index that takes one value over the whole block: read once per block.

A score_mod reading a table at a function of both positions (`bias[h, clamp(i - j, -256, 256) + 256]`, a
relative-position bucket) gathers a tile per key block, one load per element. Far from the diagonal a clamped or
bucketed index is the same at every element of the block, and the gather is a scalar read. The kernel computes
each index's range over the block (the rows i_lo..i_hi, the keys start..start + block - 1, both within their
extents) by interval arithmetic on scalars, and where every index is one value it reads that one element; the
gather runs elsewhere. Only index terms of positions, grid values, sizes and integer constants through + - *
min max abs and floor division or remainder by a positive constant are ranged: integers, which the kernel
computes exactly as these float64 bounds do. Any other index keeps the gather.
"""
from __future__ import annotations

from neptune_eqsat.ir import Term


_EXACT = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "max": "tl.maximum({}, {})",
          "min": "tl.minimum({}, {})"}


_F64 = "tl.zeros([], tl.float64)"   # (an integer, a Python int under the interpreter included, plus it: float64)


class _NotRanged(Exception):
    pass


def block_ranges(w, index: tuple[Term, ...]) -> tuple[list[str], list[tuple[str, str]]] | None:
    """(scalar lines, (lo, hi) of each index over the block) in float64, or None where an index is not ranged."""
    lines: list[str] = []

    def new(code: str) -> str:
        var = w.fresh("u")
        lines.append(f"{var} = {code}")
        return var

    def iv(t: Term) -> tuple[str, str]:
        op, at, ar = t.op, t.attrs, t.args
        if op == "axis":
            ax = at[0]
            if ax == w.row:
                return new(f"i_lo + {_F64}"), new(f"i_hi + {_F64}")
            if ax == w.loop:
                lo = new(f"start + {_F64}")
                return lo, new(f"tl.minimum(start + {w.block(w.loop)} - 1, {w.ext(w.loop)} - 1) + {_F64}")
            if ax in w.s.grid:
                v = new(f"{ax} + {_F64}")
                return v, v
            raise _NotRanged(ax)
        if op == "dim":
            v = new(f"{at[0]} + {_F64}")
            return v, v
        if op == "const" and float(at[0]).is_integer():
            v = new(f"tl.full([], {float(at[0])!r}, tl.float64)")
            return v, v
        if op == "cast" and at[0] in ("f32", "f64"):   # (exact for the integers of positions)
            return iv(ar[0])
        if op == "un" and at[0] in ("neg", "abs"):
            lo, hi = iv(ar[0])
            if at[0] == "neg":
                return new(f"-{hi}"), new(f"-{lo}")
            return (new(f"tl.where({lo} > 0, {lo}, tl.where({hi} < 0, -{hi}, 0.0))"),
                    new(f"tl.maximum(tl.abs({lo}), tl.abs({hi}))"))
        if op != "bin":
            raise _NotRanged(op)
        fn = at[0]
        (alo, ahi), (blo, bhi) = iv(ar[0]), iv(ar[1])
        if alo == ahi and blo == bhi and fn in _EXACT:   # one value each: computed once
            v = new(_EXACT[fn].format(alo, blo))
            return v, v
        if fn == "add":
            return new(f"{alo} + {blo}"), new(f"{ahi} + {bhi}")
        if fn == "sub":
            return new(f"{alo} - {bhi}"), new(f"{ahi} - {blo}")
        if fn in ("max", "min"):
            return new(f"tl.{fn}imum({alo}, {blo})"), new(f"tl.{fn}imum({ahi}, {bhi})")
        if fn == "mul":
            corners = [f"{x} * {y}" for x in (alo, ahi) for y in (blo, bhi)]
            lo = hi = corners[0]
            for c in corners[1:]:
                lo, hi = f"tl.minimum({lo}, {c})", f"tl.maximum({hi}, {c})"
            return new(lo), new(hi)
        divisor = ar[1]
        if fn in ("floordiv", "mod") and divisor.op == "const" and divisor.attrs[0] > 0:
            c = float(divisor.attrs[0])
            qlo, qhi = new(f"tl.floor({alo} / {c!r})"), new(f"tl.floor({ahi} / {c!r})")
            if fn == "floordiv":
                return qlo, qhi
            # a remainder keeps its order within one period of the divisor, else spans it
            same = new(f"{qlo} == {qhi}")
            return (new(f"tl.where({same}, {alo} - {qlo} * {c!r}, 0.0)"),
                    new(f"tl.where({same}, {ahi} - {qlo} * {c!r}, {c - 1!r})"))
        raise _NotRanged(fn)

    try:
        return lines, [iv(x) for x in index]
    except _NotRanged:
        return None


def uniform_load(w, t: Term, order: tuple[str, ...], blk: str, gather: str,
                 mask: str) -> tuple[str, list[str]] | None:
    """(A variable, lines setting it to tensor t's tile): one read where its index is one value over the block,
    the gather `gather` elsewhere; None where the load is not a gather over the rows and keys of a loop body, or
    its index is not ranged."""
    if w.lang != "tl" or set(order) != {w.row, w.loop} or len(order) != 2 or blk != w.ctx.body:
        return None
    both = {w.row, w.loop}
    if any(x.free & both and not both <= x.free for x in t.args) or not any(both <= x.free for x in t.args):
        return None   # an index of one position only is a vector load, cheap already
    ranged = block_ranges(w, t.args)
    if ranged is None:
        return None
    lines, bounds = ranged
    name = t.attrs[0]
    one = " and ".join(f"({lo} == {hi})" for lo, hi in bounds)
    offset = " + ".join(f"{lo}.to(tl.int64) * {name}_s{k}" for k, (lo, _) in enumerate(bounds))
    shape = ", ".join(w.block(a) for a in order)
    value = f"tl.zeros([{shape}], tl.{w.fp}) + tl.load({name}_ptr + {offset}).to(tl.{w.fp})"
    if mask:
        value = f"tl.where({mask}, {value}, 0.0)"
    var = w.fresh("ld")
    return var, lines + [f"if {one}:", f"    {var} = ({value}).to({name}_ptr.dtype.element_ty)", "else:",
                         f"    {var} = {gather}"]
