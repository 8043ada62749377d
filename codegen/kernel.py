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
from dataclasses import dataclass, field

from neptune_eqsat import ir, ops
from neptune_eqsat.ir import Term
from neptune_eqsat.schedule import Schedule
from neptune_eqsat.spec import SpecError

from . import masks

TL_DTYPE = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32", "f64": "tl.float64"}
UNARY_CODE = {name: op.triton for name, op in ops.UN.items()}
BINARY_CODE = {name: op.triton for name, op in ops.BIN.items()}
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


def _nonnegative(t: Term) -> bool:
    """Is t never negative (positions, sizes and what sums, products and quotients of them give)?"""
    if t.op in ("axis", "dim"):
        return True
    if t.op == "const":
        return t.attrs[0] >= 0
    if t.op == "cast":
        return _nonnegative(t.args[0])
    if t.op == "bin" and ops.BIN[t.attrs[0]].keeps_nonnegative:
        return all(_nonnegative(a) for a in t.args)
    if t.op == "where":
        return _nonnegative(t.args[1]) and _nonnegative(t.args[2])
    return False


def _rounded_to(t: Term, dtype: str) -> bool:
    """Is t a product whose every factor is a cast to `dtype`?"""
    if t.op == "bin" and t.attrs[0] == "mul":
        return all(_rounded_to(a, dtype) for a in t.args)
    return t.op == "cast" and t.attrs[0] == dtype


def pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


class KernelWriter:
    interpretable = True   # the kernel may run under Triton's interpreter (a Gluon kernel never does)

    def __init__(self, sched: Schedule, name: str):
        self.s, self.spec, self.name = sched, sched.spec, name
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
        self.tables: dict[Term, object] = {}   # classified mask predicate -> its BlockTable (blocks.py)
        self.dims = sorted({t.attrs[0] for t in ir.walk(sched.term) if t.op == "dim"} |
                           {e.name for e in self._extents() if not isinstance(e, int)})

    # ---- names ----------------------------------------------------------------------------------------------
    def _extents(self):
        return [self.spec.extent(a) for a in self.spec.axes_]

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
        return Val(f"{v.code}.to(tl.float32)", v.axes, "f32") if v.dtype in ("f16", "bf16") else v

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
            return Val(str(int(v)), (), "int") if v == int(v) and abs(v) < 2**31 else Val(repr(v), (), "f32")
        if op == "load":
            return self.load(t, self.canon(t.free), blk)
        if op == "acc":
            return self.ctx.acc
        if op == "prev":
            return self.emit(ar[0], prev=True)
        if op == "cast":
            x = self.emit(ar[0], prev)
            if ar[0].op == "const":   # a Python number has no .to
                return Val(self.put(blk, f"tl.full([], {x.code}, {TL_DTYPE[at[0]]})"), (), at[0])
            return Val(self.put(blk, f"{x.code}.to({TL_DTYPE[at[0]]})"), x.axes, at[0])
        if op == "un":
            x = self.emit(ar[0], prev)
            integral = ops.UN[at[0]].keeps_integer
            if not integral:
                x = self.as_float(self.int_as_float(x))
            dt = "bool" if at[0] == "not" else ("int" if x.dtype == "int" and integral else "f32")
            return Val(self.put(blk, UNARY_CODE[at[0]].format(x.code)), x.axes, dt)
        if op == "bin":
            # truncation already rounds down a nonnegative quotient: the usual case (h // G, i % W)
            truncates_down = _nonnegative(ar[0]) and ar[1].op == "const" and ar[1].attrs[0] > 0
            return self.binary(at[0], [self.emit(a, prev) for a in ar], blk, truncates_down)
        if op == "where":
            if t in self.masked_wheres and not self.ctx.masked:   # inside the mask for every element of the block
                kept = self.emit(ar[1], prev)   # over the where's axes still (a constant kept: 0.5 at every i, j)
                return self.broadcast(self.as_float(self.int_as_float(kept)), self.canon(t.free), blk)
            c, a, b = (self.emit(x, prev) for x in ar)
            axes = self.canon(set(c.axes) | set(a.axes) | set(b.axes))
            a, b = self.as_float(a), self.as_float(b)
            code = f"tl.where({self.expand(c, axes)}, {self.expand(a, axes)}, {self.expand(b, axes)})"
            return Val(self.put(blk, code), axes, "f32")
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
            xs = [x if x.dtype in ("int", "bool") else Val(f"({x.code}).to(tl.int32)", x.axes, "int") for x in xs]
        ints = all(x.dtype in ("int", "bool") for x in xs)
        if ints and fn == "div":   # a true division of integers (h / 8): in fp32, like torch
            xs, ints = [self.int_as_float(xs[0]), xs[1]], False
        if not ints and fn not in ir.LOGIC:
            xs = [self.as_float(x) for x in xs]
        code = BINARY_CODE[fn].format(*(self.expand(x, axes) for x in xs))
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
            q = f"tl.floor({a} / {b})"
            return q if fn == "floordiv" else f"({a} - {b} * {q})"
        if blk is not None:   # name the operands once: they appear several times below
            a, b = self.put(blk, a), self.put(blk, b)
        r = f"({a} % {b})"
        inexact = f"(({r} != 0) & (({r} < 0) != ({b} < 0)))"
        if fn == "mod":
            return f"tl.where({inexact}, {r} + {b}, {r})"
        return f"tl.where({inexact}, ({a} // {b}) - 1, {a} // {b})"

    def load(self, t: Term, order: tuple[str, ...], blk: str) -> Val:
        key = ("load", t, order, blk)
        if key in self.cache:
            return self.cache[key]
        name = t.attrs[0]
        parts = [f"{name}_ptr"]
        for pos, idx in enumerate(t.args):
            iv = self.emit(idx)
            if iv.dtype not in ("int", "bool"):   # an index read from a tensor of floats (ids stored as floats)
                iv = Val(self.put(blk, f"{iv.code}.to(tl.int32)") if iv.axes else f"({iv.code}).to(tl.int32)",
                         iv.axes, "int")
            parts.append(f"{self.expand(iv, order)} * {name}_s{pos}" if iv.axes else f"{iv.code} * {name}_s{pos}")
        checks = []
        for a in order:
            if a == self.loop and not self.ctx.masked and (blk == self.ctx.body or blk in self.kblock.values()):
                continue   # a block of the loop axis known to lie inside it
            if self.padded(a):
                checks.append(self.expand(Val(f"valid_{a}", (a,), "bool"), order))
        mask = f", mask={' & '.join(checks)}, other=0.0" if checks else ""
        hint = ""
        if self.stream and blk == self.ctx.body and self.loop in t.free:
            # each program reads its own chunk of the loop axis once: with STREAM the lines it brings in are
            # the cache's first to go, so data others wrote stays cached rather than being written back to
            # make room (the hint only reaches the load without pipelining: num_stages=1)
            hint = ', eviction_policy="evict_first" if STREAM else ""'
            self.streamed = True
        pointer_load = f"tl.load({' + '.join(parts)}{mask}{hint})"
        via_descriptor = self.descriptor_load(t, order) if self.tma else None
        if via_descriptor is None:
            var = self.put(blk, pointer_load, "ld")
        else:   # the copy engine where the launcher could build a descriptor, pointer loads otherwise
            var = self.fresh("ld")
            self.blocks[blk] += ["if USE_TMA:", f"    {var} = {via_descriptor}", "else:", f"    {var} = {pointer_load}"]
        v = Val(var, order, self.spec.inputs[name].dtype)
        self.cache[key] = v
        return v

    def tile_start(self, a: str) -> str:
        if a == self.loop:
            return "start"
        return "i_lo" if a == self.row else "0"

    def descriptor_block(self, name: str, index: tuple[Term, ...], order: tuple[str, ...],
                         transposable: bool = True) -> tuple[str, list[str], list[str], bool] | None:
        """(descriptor parameter, block start, block shape, transposed) for moving tensor `name` at `index` as one
        block in the axis order `order`, when every index is a program-level value or one tile axis (the block
        then starts at that tile's start and runs its block size); None otherwise. The copy engine fills what
        lies past the tensor's end with zeros when reading and leaves it alone when writing, as the masked
        pointer loads and stores do."""
        coords, blocks, natural = [], [], []
        if not index:   # a scalar: nothing to move in blocks
            return None
        for idx in index:
            iv = self.emit(idx)
            if not iv.axes:
                coords.append(iv.code)
                blocks.append("1")
            elif idx.op == "axis" and idx.attrs[0] in self.tile_axes and idx.attrs[0] not in natural:
                a = idx.attrs[0]
                coords.append(self.tile_start(a))
                blocks.append(f"BLOCK_{a.upper()}" if a in (self.row, self.loop) else self.block(a))
                natural.append(a)
            else:
                return None
        transposed = natural != list(order)
        if blocks[-1] == "1" or set(natural) != set(order) or (transposed and (len(order) != 2 or not transposable)):
            return None   # the copy engine moves whole rows of the last dimension; 2-d tiles transpose
        param = self.descriptors.setdefault((name, tuple(blocks)), (f"{name}_desc{len(self.descriptors)}", name, blocks))[0]
        return param, coords, blocks, transposed

    def descriptor_load(self, t: Term, order: tuple[str, ...]) -> str | None:
        """The load as a tensor-descriptor block read (see descriptor_block), or None."""
        if set(order) & self.chunked:   # blocks of a chunked axis start inside its loop: pointer loads
            return None
        found = self.descriptor_block(t.attrs[0], t.args, order)
        if found is None:
            return None
        param, coords, blocks, transposed = found
        code = f"{param}.load([{', '.join(coords)}]).reshape({', '.join(b for b in blocks if b != '1')})"
        return code + (".T" if transposed else "")

    def ordered(self, t: Term, order: tuple[str, ...], prev: bool) -> Val:
        """t's tile in a given axis order (for dot operands)."""
        if t.op == "load":
            return self.load(t, order, self.home(t))
        v = self.emit(t, prev)
        if v.axes == order:
            return v
        return Val(self.put(self.home(t), f"tl.trans({v.code})"), order, v.dtype)

    def contraction(self, body: Term, k: str):
        """(A, B, X, Y) when sum_k body is a matrix product A[X, k] @ B[k, Y] of tiles."""
        if body.op != "bin" or body.attrs[0] != "mul":
            return None
        tiles = set(self.tile_axes)
        found = []
        for a, b in (body.args, body.args[::-1]):
            fa, fb = (a.free & tiles) - {k}, (b.free & tiles) - {k}
            if k in a.free and k in b.free and len(fa) == 1 and len(fb) == 1 and fa != fb:
                found.append((a, b, next(iter(fa)), next(iter(fb))))
        # the operands in the order whose product has the result's layout (v * p as well as p * v)
        found.sort(key=lambda f: self.canon((f[2], f[3])) != (f[2], f[3]))
        return found[0] if found else None

    def dot_operands(self, body: Term, k: str, prev: bool, zero_invalid: bool, blk: str | None = None):
        a, b, x, y = self.contraction(body, k)
        va, vb = self.ordered(a, (x, k), prev), self.ordered(b, (k, y), prev)
        if zero_invalid:
            va = Val(self.put(self.ctx.body, f"tl.where(valid_{k}[None, :], {va.code}, 0.0)"), va.axes, va.dtype)
        va, vb = self.rounded_product(a, va, vb, blk), self.rounded_product(b, vb, va, blk)
        if va.dtype != vb.dtype or va.dtype not in ("f16", "bf16"):
            va, vb = self.as_float(va), self.as_float(vb)
            self.f32_dot = True
            return va, vb, x, y, ", input_precision=F32_DOT"
        if va.dtype == "bf16" and self.interpretable:
            # Triton's interpreter multiplies bf16 tiles wrongly: there (only) they are multiplied as fp32
            va, vb = (Val(self.put(blk or self.ctx.body, f"{v.code}.to(BF16_DOT)"), v.axes, v.dtype) for v in (va, vb))
        return va, vb, x, y, ""

    def rounded_product(self, t: Term, v: Val, other: Val, blk: str | None) -> Val:
        """A matrix operand that is a product of factors each rounded to the other operand's 16-bit dtype
        (cast(a, f16) * cast(b, f16)) is taken in that dtype, as the product of one rounded value would be: the
        algebra rules move a cast of a product onto one factor, and an fp32 operand would make the whole matrix
        product run in fp32."""
        if v.dtype == other.dtype or other.dtype not in ("f16", "bf16") or not _rounded_to(t, other.dtype):
            return v
        return Val(self.put(blk or self.ctx.body, f"{v.code}.to({TL_DTYPE[other.dtype]})"), v.axes, other.dtype)

    def chunked_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        """A reduction over a long in-tile axis k: a loop over blocks of k, each block reduced as a tile (a
        matrix product where the body is one) into an accumulator, written into `blk` where the value lives."""
        reducer, k = t.attrs[:2]
        if k in self.kblock:
            raise SpecError(f"{ir.show(t)[:100]}: a reduction over {k} inside another over {k}")
        inner = self.fresh("kloop")
        self.kblock[k] = inner
        self.blocks[inner] += [f"offs_{k} = {k}_start + tl.arange(0, {self.block(k)})",
                               f"valid_{k} = offs_{k} < {self.ext(k)}"]
        acc = self.fresh("kacc")
        try:
            if reducer == "sum" and self.contraction(t.args[0], k):   # accumulated by the matrix units
                va, vb, x, y, prec = self.dot_operands(t.args[0], k, prev, zero_invalid=False, blk=inner)
                axes, step = (x, y), f"tl.dot({va.code}, {vb.code}, {acc}{prec})"
            else:
                part = self.tile_reduction(t, prev, inner)
                combine = {"sum": "{} + {}", "max": "tl.maximum({}, {})", "min": "tl.minimum({}, {})"}[reducer]
                axes, step = part.axes, combine.format(acc, part.code)
        finally:
            del self.kblock[k]
        shape = ", ".join(self.block(a) for a in axes)
        self.blocks[blk] += [f"{acc} = tl.full([{shape}], {IDENTITY_CODE[reducer]}, tl.float32)",
                             f"for {k}_start in range(0, {self.ext(k)}, {self.block(k)}):"]
        self.blocks[blk] += ["    " + line for line in self.blocks.pop(inner)] + [f"    {acc} = {step}"]
        return self.reorder(Val(acc, axes, "f32"), blk)

    def inner_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        if t.attrs[1] in self.chunked:
            return self.chunked_reduction(t, prev, blk)
        return self.tile_reduction(t, prev, blk)

    def tile_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        reducer, k = t.attrs[:2]
        body = t.args[0]
        if reducer == "sum" and self.contraction(body, k):
            va, vb, x, y, prec = self.dot_operands(body, k, prev, zero_invalid=False, blk=blk)
            v = Val(self.put(blk, f"tl.dot({va.code}, {vb.code}{prec})"), (x, y), "f32")
            return self.reorder(v, blk)
        x = self.along(self.as_float(self.emit(body, prev)), k, blk)
        if self.padded(k):
            x = Val(self.put(blk, f"tl.where({self.expand(Val(f'valid_{k}', (k,), 'bool'), x.axes)}, {x.code}, "
                                  f"{IDENTITY_CODE[reducer]})"), x.axes, "f32")
        fn = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}[reducer]
        rest = tuple(a for a in x.axes if a != k)
        return Val(self.put(blk, f"{fn}({x.code}, axis={x.axes.index(k)})"), rest, "f32")

    def along(self, x: Val, k: str, blk: str) -> Val:
        """x as a tile over k: a body that does not vary along the reduced axis (a count, sum_j 1) is the same
        value at every k, and the lanes past the axis's end are masked like any other."""
        return x if k in x.axes else self.broadcast(x, self.canon(x.axes + (k,)), blk)

    def broadcast(self, x: Val, axes: tuple[str, ...], blk: str) -> Val:
        """x as a float tile over `axes` (a superset of its own)."""
        if x.axes == axes:
            return x
        zeros = f"tl.zeros([{', '.join(self.block(a) for a in axes)}], tl.float32)"
        return Val(self.put(blk, f"{self.expand(x, axes)} + {zeros}"), axes, "f32")

    def reorder(self, v: Val, blk: str) -> Val:
        want = self.canon(v.axes)
        if want == v.axes:
            return v
        return Val(self.put(blk, f"tl.trans({v.code})"), want, v.dtype)

    # ---- reductions over the loop axis ----------------------------------------------------------------------
    def state_axes(self, r: Term) -> tuple[str, ...]:
        return self.canon(r.free & set(self.tile_axes))

    def init_state(self, r: Term, block: str) -> None:
        axes = self.state_axes(r)
        var = self.fresh("r")
        shape = ", ".join(self.block(a) for a in axes)
        self.blocks[block].append(f"{var} = tl.full([{shape}], {IDENTITY_CODE[r.attrs[0]]}, tl.float32)"
                                  f"  # {ir.show(r)[:90]}")
        self.state[r] = Val(var, axes, "f32")

    def update(self, r: Term) -> None:
        """state = f(repair(state), reduce of this block)."""
        reducer, k = r.attrs[:2]
        body, blk = r.args[0], self.ctx.body
        st = self.state[r]
        cur = st
        if r.op in ("roll", "split"):   # a split reduction runs rolled within its chunk
            self.ctx.acc = st
            rep = self.emit(r.args[1])
            self.ctx.acc = None
            cur = Val(self.expand(rep, st.axes), st.axes, "f32") if rep.axes != st.axes else rep
        if reducer == "sum" and self.contraction(body, k):
            va, vb, x, y, prec = self.dot_operands(body, k, False, zero_invalid=self.ctx.masked)
            if (x, y) != st.axes:
                raise SpecError(f"{ir.show(r)}: product layout {(x, y)} does not match its result {st.axes}")
            self.blocks[blk].append(f"{st.code} = tl.dot({va.code}, {vb.code}, {cur.code}{prec})")
            return
        x = self.along(self.as_float(self.emit(body)), k, blk)
        if self.ctx.masked:
            x = Val(self.put(blk, f"tl.where({self.expand(Val(f'valid_{k}', (k,), 'bool'), x.axes)}, {x.code}, "
                                  f"{IDENTITY_CODE[reducer]})"), x.axes, "f32")
        fn = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}[reducer]
        part = Val(f"{fn}({x.code}, axis={x.axes.index(k)})", tuple(a for a in x.axes if a != k), "f32")
        if part.axes != st.axes:
            raise SpecError(f"{ir.show(r)}: block result {part.axes} does not match its state {st.axes}")
        combine = {"sum": "{} + {}", "max": "tl.maximum({}, {})", "min": "tl.minimum({}, {})"}[reducer]
        self.blocks[blk].append(f"{st.code} = {combine.format(cur.code, part.code)}")
