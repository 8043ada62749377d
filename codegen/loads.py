"""How a kernel writer reads an input tile: pointer loads masked at the tile's edges, or tensor-descriptor loads
(the copy engine) where the tile's layout allows; a mixin of KernelWriter (kernel.py)."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.ir import Term

from .uniform import uniform_load
from .values import Val, value_dtype


class Loads:
    def load(self, t: Term, order: tuple[str, ...], blk: str) -> Val:
        key = ("load", t, order, blk)
        if key in self.cache:
            return self.cache[key]
        name = t.attrs[0]
        parts = [f"{name}_ptr"]
        for pos, idx in enumerate(t.args):
            iv = self.emit(idx)
            if iv.dtype not in ("int", "bool"):   # an index read from a tensor of floats (ids stored as floats)
                to_int = f"{iv.code}.to({self.lang}.int32)"
                iv = Val(self.put(blk, to_int) if iv.axes else f"({iv.code}).to({self.lang}.int32)",
                         iv.axes, "int")
            if any(x.op == "load" for x in ir.walk(idx)):
                iv = self._inside(iv, name, pos, blk)
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
        pointer_load = f"{self.lang}.load({' + '.join(parts)}{mask}{hint})"
        via_descriptor = self.descriptor_load(t, order) if self.tma else None
        uniform = None if via_descriptor is not None else \
            uniform_load(self, t, order, blk, pointer_load, " & ".join(checks))
        if uniform is not None:   # a gather whose index may be one value over the block (uniform.py)
            var, lines = uniform
            self.blocks[blk] += lines
        elif via_descriptor is None:
            var = self.put(blk, pointer_load, "ld")
        else:   # the copy engine where the launcher could build a descriptor, pointer loads otherwise
            var = self.fresh("ld")
            self.blocks[blk] += ["if USE_TMA:", f"    {var} = {via_descriptor}", "else:", f"    {var} = {pointer_load}"]
        if self.spec.inputs[name].dtype in ("i8", "u8", "i16"):   # their arithmetic in 32 bits, as positions'
            var = self.put(blk, f"{var}.to({self.lang}.int32)")     # (an int8 product wraps past 127)
        v = Val(var, order, value_dtype(self.spec.inputs[name].dtype))
        self.cache[key] = v
        return v

    def _inside(self, iv: Val, name: str, pos: int, blk: str) -> Val:
        """An index read from an input's values held inside dimension `pos` of `name`: the launcher refuses a
        call whose such index leaves it, or a where discards the value read (a label of -100 under
        where(label == -100, ...)); either way the address formed stays inside the tensor."""
        ext = self.spec.inputs[name].shape[pos]
        n = str(ext) if isinstance(ext, int) else ext.name if ext.name in self.dims else None
        if n is None:   # a size the kernel is not given
            return iv
        held = f"{self.lang}.minimum({self.lang}.maximum({iv.code}, 0), {n} - 1)"
        return Val(self.put(blk, held) if iv.axes else f"({held})", iv.axes, "int")

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
