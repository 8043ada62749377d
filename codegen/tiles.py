"""Reductions inside a tile: matrix products (`tl.dot`) found in sums of products, long contractions reduced in
blocks of their own (a K loop), other in-tile reductions, and the loop-carried states of reductions over the loop
axis; a mixin of KernelWriter (kernel.py)."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.frontend.spec import SpecError
from neptune_eqsat.ir import Term

from .values import IDENTITY_CODE, Val, dtype_code, rounded_to


class TileReductions:
    def combine_code(self, reducer: str) -> str:
        """How two partial results of `reducer` combine, as a template of two operands."""
        return {"sum": "{} + {}", "max": f"{self.lang}.maximum({{}}, {{}})",
                "min": f"{self.lang}.minimum({{}}, {{}})"}[reducer]

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
        vb = self.ordered(b, (k, y), prev)
        va = self.ordered(a, (x, k), prev, self._rounding(a, vb))
        if zero_invalid:
            va = Val(self.put(blk or self.ctx.body, f"{self.lang}.where(valid_{k}[None, :], {va.code}, 0.0)"), va.axes,
                     va.dtype)
            if not _loaded(b):   # a value computed from padded positions' loads can be 0 / 0: NaN * 0 is NaN
                vb = Val(self.put(blk or self.ctx.body, f"{self.lang}.where(valid_{k}[:, None], {vb.code}, 0.0)"),
                         vb.axes, vb.dtype)
        va, vb = self.rounded_product(a, va, vb, blk), self.rounded_product(b, vb, va, blk)
        if va.dtype != vb.dtype or va.dtype not in ("f16", "bf16"):   # (integer weights, int8 or int32: in fp32)
            va, vb = (self.as_float(self.int_as_float(v)) for v in (va, vb))
            self.f32_dot = True
            return va, vb, x, y, ", input_precision=F32_DOT"
        if va.dtype == "bf16" and self.interpretable:
            # Triton's interpreter multiplies bf16 tiles wrongly: there (only) they are multiplied as fp32
            va, vb = (Val(self.put(blk or self.ctx.body, f"{v.code}.to(BF16_DOT)"), v.axes, v.dtype) for v in (va, vb))
        return va, vb, x, y, ""

    def _rounding(self, t: Term, other: Val) -> str | None:
        """The 16-bit dtype of `other` where operand t is a product of factors each rounded to it (see
        rounded_product), else None. `ordered` rounds such an operand before a transpose: half the bytes move."""
        return other.dtype if other.dtype in ("f16", "bf16") and rounded_to(t, other.dtype) else None

    def rounded_product(self, t: Term, v: Val, other: Val, blk: str | None) -> Val:
        """A matrix operand that is a product of factors each rounded to the other operand's 16-bit dtype
        (cast(a, f16) * cast(b, f16)) is taken in that dtype, as the product of one rounded value would be: the
        algebra rules move a cast of a product onto one factor, and an fp32 operand would make the whole matrix
        product run in fp32."""
        if v.dtype == other.dtype or self._rounding(t, other) is None:
            return v
        return Val(self.put(blk or self.ctx.body, f"{v.code}.to({dtype_code(self.lang, other.dtype)})"), v.axes, other.dtype)

    def chunked_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        """A reduction over a long in-tile axis k: a loop over blocks of k, each block reduced as a tile (a
        matrix product where the body is one) into an accumulator, written into `blk` where the value lives."""
        reducer, k = t.attrs[:2]
        if k in self.kblock:
            raise SpecError(f"{ir.show(t)[:100]}: a reduction over {k} inside another over {k}")
        inner = self.fresh("kloop")
        self.kblock[k] = inner
        self.blocks[inner] += [f"offs_{k} = {k}_start + {self.lang}.arange(0, {self.block(k)})",
                               f"valid_{k} = offs_{k} < {self.ext(k)}"]
        acc = self.fresh("kacc")
        try:
            if reducer == "sum" and self.contraction(t.args[0], k):   # accumulated by the matrix units
                va, vb, x, y, prec = self.dot_operands(t.args[0], k, prev, zero_invalid=False, blk=inner)
                axes, step = (x, y), f"{self.lang}.dot({va.code}, {vb.code}, {acc}{prec})"
            else:
                part = self.tile_reduction(t, prev, inner)
                combine = self.combine_code(reducer)
                axes, step = part.axes, combine.format(acc, part.code)
        finally:
            del self.kblock[k]
        shape = ", ".join(self.block(a) for a in axes)
        self.blocks[blk] += [f"{acc} = {self.lang}.full([{shape}], {IDENTITY_CODE[reducer]}, {self.lang}.{self.fp})",
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
            # a sum over the programs' rows (an output accumulated across programs): the rows past the end
            # may hold anything, and a product with a zero read there would still carry a NaN
            va, vb, x, y, prec = self.dot_operands(body, k, prev, zero_invalid=k == self.row, blk=blk)
            v = Val(self.put(blk, f"{self.lang}.dot({va.code}, {vb.code}{prec})"), (x, y), "f32")
            return self.reorder(v, blk)
        x = self.along(self.as_float(self.emit(body, prev)), k, blk)
        if self.padded(k):
            valid = self.expand(Val(f'valid_{k}', (k,), 'bool'), x.axes)
            x = Val(self.put(blk, f"{self.lang}.where({valid}, {x.code}, "
                                  f"{IDENTITY_CODE[reducer]})"), x.axes, "f32")
        fn = f"{self.lang}.{reducer}"
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
        zeros = f"{self.lang}.zeros([{', '.join(self.block(a) for a in axes)}], {self.lang}.{self.fp})"
        return Val(self.put(blk, f"{self.expand(x, axes)} + {zeros}"), axes, "f32")

    def reorder(self, v: Val, blk: str) -> Val:
        want = self.canon(v.axes)
        if want == v.axes:
            return v
        return Val(self.put(blk, f"{self.lang}.trans({v.code})"), want, v.dtype)

    # ---- reductions over the loop axis ----------------------------------------------------------------------
    def state_axes(self, r: Term) -> tuple[str, ...]:
        return self.canon(r.free & set(self.tile_axes))

    def init_state(self, r: Term, block: str) -> None:
        axes = self.state_axes(r)
        var = self.fresh("r")
        shape = ", ".join(self.block(a) for a in axes)
        L = self.lang
        self.blocks[block].append(f"{var} = {L}.full([{shape}], {IDENTITY_CODE[r.attrs[0]]}, {L}.{self.fp})"
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
            self.blocks[blk].append(f"{st.code} = {self.lang}.dot({va.code}, {vb.code}, {cur.code}{prec})")
            return
        x = self.along(self.as_float(self.emit(body)), k, blk)
        if self.ctx.masked:
            valid = self.expand(Val(f'valid_{k}', (k,), 'bool'), x.axes)
            x = Val(self.put(blk, f"{self.lang}.where({valid}, {x.code}, "
                                  f"{IDENTITY_CODE[reducer]})"), x.axes, "f32")
        fn = f"{self.lang}.{reducer}"
        part = Val(f"{fn}({x.code}, axis={x.axes.index(k)})", tuple(a for a in x.axes if a != k), "f32")
        if part.axes != st.axes:
            raise SpecError(f"{ir.show(r)}: block result {part.axes} does not match its state {st.axes}")
        combine = self.combine_code(reducer)
        self.blocks[blk].append(f"{st.code} = {combine.format(cur.code, part.code)}")


def _loaded(t: Term) -> bool:
    """Is t an input's value as loaded (a cast of it too)? A padded position loads 0, finite in a product."""
    while t.op == "cast":
        t = t.args[0]
    return t.op == "load"
