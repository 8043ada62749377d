"""Term -> Triton kernel source.

Every value is a tile over some of the kernel's tile axes (row, loop, column, in-tile reduction axes), kept in
one canonical axis order and broadcast with None-indexing. A value is emitted once, in the earliest block it
can live in: the prologue (no loop axis, no loop reduction), the block before a pass (reads finished
reductions only) or the loop body. Reductions over the loop axis are loop-carried states; a rolled one is
updated as  state = f(repair(state), block)  where the repair is an ordinary term: `acc` reads the state,
`prev` reads the states as they were when the block began.
"""
from __future__ import annotations

import math
from collections import defaultdict

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import Schedule
from neptune_eqsat.frontend.spec import SpecError

from . import masks
from .loads import Loads
from .tiles import TileReductions
from .values import BIT_OPS, OP_CODE, Context, Val, dtype_code, nonnegative, packed_cast, pow2

def jit_decorator(module: str, sizes: list[str]) -> str:
    """@triton.jit (or @gluon.jit) that compiles one kernel for every value of `sizes`: Triton would otherwise
    compile again for a size equal to 1 or not a multiple of 16 (a batch of 1 after a batch of 2)."""
    return f"@{module}.jit(do_not_specialize={sizes!r})" if sizes else f"@{module}.jit"


def grid_sizes(w: KernelWriter, params: list[str]) -> list[str]:
    """The run-time sizes among `params` that only count programs (the batch's): no tile's bounds depend on them,
    so their value never changes the code. The extents of tile axes stay specialized: knowing a sequence
    length is a multiple of 16 made the windowed prefill kernel 25% faster on an H100."""
    counted = {w.ext(g) for g in w.s.grid} - {w.ext(a) for a in w.tile_axes} - set(w.spec.derived)
    return [p for p in params if p in counted]


class KernelWriter(Loads, TileReductions):
    interpretable = True   # the kernel may run under Triton's interpreter (a Gluon kernel never does)
    lang = "tl"            # the target's language module in the code emitted (Gluon's: gl)

    def __init__(self, sched: Schedule, name: str):
        self.s, self.spec, self.name = sched, sched.spec, name
        # what states and partial results are kept in: fp32, or fp64 where the spec reads or writes fp64 (an
        # fp64 spec would otherwise be less exact than torch's fp32)
        dtypes = [t.dtype for t in self.spec.inputs.values()] + [self.spec.output_dtype] + \
            [o.dtype for o in self.spec.also]
        self.fp = "float64" if "f64" in dtypes else "float32"
        self.loop, self.row, self.col = sched.loop, sched.row, sched.col
        self.tile_axes = [a for a in (self.row, self.loop, self.col) if a] + list(sched.inner)
        self.chunked = set(sched.chunked)   # in-tile axes reduced in a loop of blocks (chunked_reduction)
        self.kblock: dict[str, str] = {}    # chunked axis -> the block its loop body is being written into
        self.blocks: dict[str, list[str]] = defaultdict(list)
        self.cache: dict[tuple, Val] = {}
        self.state: dict[Term, Val] = {}
        self.ctx = Context("prologue", "prologue")
        self.n = 0
        self.masked_wheres = set(masks.mask_wheres(sched.term, self.loop)) if self.loop else set()
        self.tma = False                   # may tiles move through tensor descriptors (see descriptor_block)
        self.descriptors: dict[tuple, tuple[str, str, list[str]]] = {}   # (tensor, blocks) -> (param, tensor, blocks)
        self.row_order = False             # does the kernel take ROW_ORDER (see module.kernel_source)
        self.stream = False                # may loads along the loop axis be marked read-once (see load)
        self.streamed = False              # did any load take the STREAM switch
        self.f32_dot = False               # does a matrix product take fp32 operands (precision F32_DOT)
        self.one_loop = False              # does a pass split its range into masked and full blocks (ONE_LOOP)
        self.tma_reduce = False            # does a block add into an output through a descriptor (TMA_REDUCE)
        self.tables: dict[Term, object] = {}   # classified mask predicate -> its BlockTable (blocks.py)
        self.packable: dict[str, tuple[str, str]] = {}   # a tile rounded to 16 bits -> its block, its packed line
        # the run-time sizes of its axes, but for a size that no input carries and only axes the term never uses
        # run over (a spec may declare an axis and not use it: nothing would bind its size)
        carried = {e.name for t in self.spec.inputs.values() for e in t.shape if not isinstance(e, int)}
        used = {t.attrs[0] for t in ir.walk(sched.term) if t.op == "axis"} | \
            {t.attrs[1] for t in ir.walk(sched.term) if ir.is_reduction(t)} | set(self.spec.output_axes) | \
            {a for o in self.spec.also for a in o.axes}
        self.dims = sorted({t.attrs[0] for t in ir.walk(sched.term) if t.op == "dim"} |
                           {e.name for a, e in self.spec.axes_.items() if not isinstance(e, int)
                            and (e.name in carried or e.name in self.spec.derived or a in used)})

    # ---- names ----------------------------------------------------------------------------------------------
    def ext(self, ax: str) -> str:
        e = self.spec.extent(ax)
        return str(e) if isinstance(e, int) else e.name

    def block(self, ax: str) -> str:
        if ax in (self.row, self.loop) or ax in self.chunked:
            return f"BLOCK_{ax.upper()}"
        return str(pow2(self.spec.extent(ax)))

    def padded(self, ax: str) -> bool:
        """Does the tile of ax run past the axis's extent (so its lanes need a bound check)?"""
        if ax in (self.row, self.loop) or ax in self.chunked:
            return True
        return pow2(self.spec.extent(ax)) != self.spec.extent(ax)

    def fresh(self, stem: str = "t") -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def put(self, block: str, code: str, stem: str = "t") -> str:
        var = self.fresh(stem)
        self.blocks[block].append(f"{var} = {code}")
        return var

    # ---- placement ------------------------------------------------------------------------------------------
    def loop_refs(self, t: Term) -> list[Term]:
        return [x for x in ir.walk(t) if ir.is_reduction(x) and x.attrs[1] == self.loop]

    def home(self, t: Term) -> str:
        inside = [a for a in self.kblock if a in t.free]
        if inside:   # a value along a chunked axis lives in the loop over that axis's blocks
            return self.kblock[inside[-1]]
        if self.loop is None:
            return self.ctx.body
        if self.loop in t.free or any(x.op == "acc" for x in ir.walk(t)):
            return self.ctx.body
        refs = self.loop_refs(t)
        if not refs:
            return "prologue"
        if all(r in self.ctx.complete for r in refs):
            return self.ctx.pre
        return self.ctx.body

    # ---- values ---------------------------------------------------------------------------------------------
    def canon(self, axes) -> tuple[str, ...]:
        return tuple(a for a in self.tile_axes if a in axes)

    def expand(self, v: Val, axes: tuple[str, ...]) -> str:
        if v.axes == axes or not v.axes:
            return v.code
        return f"{v.code}[{', '.join(':' if a in v.axes else 'None' for a in axes)}]"

    def int_as_float(self, v: Val) -> Val:
        """An integer value as fp32 (a literal, a program-level scalar or a tile alike)."""
        return Val(f"({v.code} * 1.0)", v.axes, "f32") if v.dtype in ("int", "bool") else v

    def as_float(self, v: Val) -> Val:
        """v in fp32; a tile rounded to 16 bits here and read again in fp32 is rounded by the packed conversion
        (values.PACKED)."""
        if v.dtype not in ("f16", "bf16"):
            return v
        if v.code in self.packable:
            blk, packed = self.packable.pop(v.code)
            lines = self.blocks[blk]
            lines[next(k for k, x in enumerate(lines) if x.startswith(f"{v.code} = "))] = packed
        return Val(f"{v.code}.to({self.lang}.float32)", v.axes, "f32")

    def emit(self, t: Term, prev: bool = False) -> Val:
        where_ = self.home(t)
        prev = prev and any(r in self.ctx.running for r in self.loop_refs(t))
        acc = self.ctx.acc.code if self.ctx.acc is not None and any(x.op == "acc" for x in ir.walk(t)) else None
        key = (where_, t, prev, acc)
        if key not in self.cache:
            saved = self.ctx.body
            self.cache[key] = self._emit(t, prev, where_)
            self.ctx.body = saved
        return self.cache[key]

    def _emit(self, t: Term, prev: bool, blk: str) -> Val:
        op, at, ar = t.op, t.attrs, t.args
        if op == "axis":
            a = at[0]
            return Val(f"offs_{a}", (a,), "int") if a in self.tile_axes else Val(a, (), "int")
        if op == "dim":
            return Val(at[0], (), "int")
        if op == "const":
            v = at[0]
            if math.isnan(v):
                return Val("float('nan')", (), "f32")
            if math.isinf(v):
                return Val(f"float('{'-' if v < 0 else ''}inf')", (), "f32")
            if v == int(v) and 2**31 <= abs(v) < 2**63:   # an integer past int32 (i + 2**40): in int64, as torch
                return Val(f"{self.lang}.full([], {int(v)}, {self.lang}.int64)", (), "int")
            return Val(str(int(v)), (), "int") if v == int(v) and abs(v) < 2**31 else Val(repr(v), (), "f32")
        if op == "load":
            return self.load(t, self.canon(t.free), blk)
        if op == "acc":
            return self.ctx.acc
        if op == "prev":
            return self.emit(ar[0], prev=True)
        if op == "rename":   # the same tile with one axis under another name
            v = self.emit(ar[0], prev)
            axes = tuple(at[1] if a == at[0] else a for a in v.axes)
            want = self.canon(set(axes))
            if axes == want:
                return Val(v.code, want, v.dtype)
            if len(axes) == 2:
                return Val(self.put(blk, f"{self.lang}.trans({v.code})"), want, v.dtype)
            raise SpecError(f"cannot hold {ir.show(t)[:80]} in tile order {want}")
        if op == "cast":
            x = self.emit(ar[0], prev)
            if ar[0].op == "const":   # a Python number has no .to; made in fp32 and cast, as Triton's interpreter
                # makes no bf16 constant
                code = f"{self.lang}.full([], {x.code}, {self.lang}.float32).to({dtype_code(self.lang, at[0])})"
                return Val(self.put(blk, code), (), at[0])
            var = self.put(blk, f"{x.code}.to({dtype_code(self.lang, at[0])})")
            packed = packed_cast(self.lang, x.code, x.dtype, x.axes, at[0])
            if packed:   # (as_float packs it once it is read again in fp32)
                self.packable[var] = (blk, f"{var} = {packed}")
            return Val(var, x.axes, at[0])
        if op == "un":
            x = self.emit(ar[0], prev)
            integral = ops.UN[at[0]].keeps_integer
            if not integral:
                x = self.as_float(self.int_as_float(x))
            elif x.dtype not in ("int", "bool"):   # -x, abs(x) of a 16-bit load: in fp32, as it is labelled
                x = self.as_float(x)
            elif x.dtype == "bool" and at[0] != "not":   # -(i > j): a truth value's number, 1 or 0
                x = Val(f"{x.code}.to({self.lang}.int32)", x.axes, "int")
            dt = "bool" if at[0] == "not" else ("int" if x.dtype == "int" and integral else "f32")
            return Val(self.put(blk, OP_CODE[self.lang]["un"][at[0]].format(x.code)), x.axes, dt)
        if op == "bin":
            # truncation already rounds down a nonnegative quotient: the usual case (h // G, i % W)
            truncates_down = nonnegative(ar[0]) and ar[1].op == "const" and ar[1].attrs[0] > 0
            return self.binary(at[0], [self.emit(a, prev) for a in ar], blk, truncates_down)
        if op == "where":
            if t in self.masked_wheres and not self.ctx.masked:   # inside the mask for every element of the block
                kept = self.emit(ar[1], prev)   # over the where's axes still (a constant kept: 0.5 at every i, j)
                return self.broadcast(self.as_float(self.int_as_float(kept)), self.canon(t.free), blk)
            c, a, b = (self.emit(x, prev) for x in ar)
            axes = self.canon(set(c.axes) | set(a.axes) | set(b.axes))
            a, b = self.as_float(a), self.as_float(b)
            cond = self.expand(c, axes)
            if c.dtype != "bool":   # a number as a condition (a bit operation's): true where nonzero
                cond = f"({cond} != 0)"
            code = f"{self.lang}.where({cond}, {self.expand(a, axes)}, {self.expand(b, axes)})"
            # integers on both sides stay integers (where(p, 0, 0) is an int32 tile): labelled so, a float
            # function of it converts it first
            dt = a.dtype if a.dtype == b.dtype and a.dtype in ("int", "bool") else "f32"
            return Val(self.put(blk, code), axes, dt)
        if op in ("red", "roll", "split"):
            if at[1] == self.loop:
                if t not in self.state:
                    raise SpecError(f"internal: reduction {ir.show(t)} read before it is scheduled")
                st = self.state[t]
                if prev and t in self.ctx.running:
                    return Val(f"{st.code}_prev", st.axes, st.dtype)
                return st
            return self.inner_reduction(t, prev, blk)
        raise SpecError(f"cannot generate code for {op}")

    def binary(self, fn: str, xs: list[Val], blk: str, truncates_down: bool = False) -> Val:
        axes = self.canon(set(xs[0].axes) | set(xs[1].axes))
        if fn in BIT_OPS:   # ids stored as floats (captured integer tensors) taken back to integers
            xs = [x if x.dtype in ("int", "bool") else Val(f"({x.code}).to({self.lang}.int32)", x.axes, "int")
                  for x in xs]
        if fn in ir.LOGIC:   # a number as a truth value (a mask combined with a constant 1): true where nonzero;
            # a scalar truth value too (a flag read per head), which Triton's interpreter cannot | with a tile
            xs = [x if x.dtype == "bool" and x.axes else Val(f"({x.code} != 0)", x.axes, "bool") for x in xs]
        elif fn not in ir.COMPARE and fn not in BIT_OPS:   # a truth value as the number 0 or 1 in arithmetic:
            # (a > 0) + (b > 0) is 2 where both hold (1-bit tiles would add to 1)
            xs = [Val(f"({x.code}).to({self.lang}.int32)", x.axes, "int") if x.dtype == "bool" else x for x in xs]
        ints = all(x.dtype in ("int", "bool") for x in xs)
        if ints and fn == "mul" and any(x.code.lstrip("-").isdigit() and abs(int(x.code)) >= 2**15 for x in xs):
            # a position times a large constant (a hash, i * 10**8 + j) overflows int32: in int64, as torch
            xs = [x if x.code.lstrip("-").isdigit() else Val(f"({x.code}).to({self.lang}.int64)", x.axes, "int")
                  for x in xs]
        if ints and fn == "div":   # a true division of integers (h / 8): in fp32, like torch
            xs, ints = [self.int_as_float(xs[0]), xs[1]], False
        if not ints and fn not in ir.LOGIC:
            xs = [self.as_float(x) for x in xs]
        if fn == "div" and not ints and xs[1].axes and set(xs[1].axes) < set(axes) and blk.startswith("body"):
            # a tile divided by a row of values inside the loop (dP / l): one reciprocal per row, then a
            # multiply per element, not a full-precision division per element
            rcp = self.cache.get(("reciprocal", xs[1].code, blk))
            if rcp is None:
                rcp = self.cache[("reciprocal", xs[1].code, blk)] = Val(self.put(blk, f"1.0 / {xs[1].code}"),
                                                                          xs[1].axes, "f32")
            fn, xs = "mul", [xs[0], rcp]
        code = OP_CODE[self.lang]["bin"][fn].format(*(self.expand(x, axes) for x in xs))
        if fn in ("floordiv", "mod") and not (ints and truncates_down):   # torch floors, Triton truncates
            code = self.flooring(fn, [self.expand(x, axes) for x in xs], ints, blk if axes else None)
        dt = "bool" if fn in ir.COMPARE + ir.LOGIC else ("int" if ints else "f32")
        if not axes:
            return Val(code, (), dt)
        return Val(self.put(blk, code), axes, dt)

    def flooring(self, fn: str, xs: list[str], ints: bool, blk: str | None) -> str:
        """a // b and a % b rounding the quotient down, as torch does: Triton's integer // and % truncate toward
        zero (-7 // 2 = -3, -7 % 2 = -1 there, -4 and 1 in torch). Floats divide and take the floor."""
        a, b = xs
        if not ints:
            q = f"{self.lang}.floor({a} / {b})"
            return q if fn == "floordiv" else f"({a} - {b} * {q})"
        if blk is not None:   # name the operands once: they appear several times below
            a, b = self.put(blk, a), self.put(blk, b)
        r = f"({a} % {b})"
        inexact = f"(({r} != 0) & (({r} < 0) != ({b} < 0)))"
        if fn == "mod":
            return f"{self.lang}.where({inexact}, {r} + {b}, {r})"
        return f"{self.lang}.where({inexact}, ({a} // {b}) - 1, {a} // {b})"

    def ordered(self, t: Term, order: tuple[str, ...], prev: bool, rounding: str | None = None) -> Val:
        """t's tile in a given axis order (for dot operands); one to be transposed and `rounding` to a 16-bit
        dtype is rounded first."""
        if t.op == "load":
            return self.load(t, order, self.home(t))
        v = self.emit(t, prev)
        if v.axes == order:
            return v
        if rounding and v.dtype != rounding:
            v = Val(self.put(self.home(t), f"{v.code}.to({dtype_code(self.lang, rounding)})"), v.axes, rounding)
        return Val(self.put(self.home(t), f"{self.lang}.trans({v.code})"), order, v.dtype)
