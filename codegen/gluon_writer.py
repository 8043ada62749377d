"""The kernel writer of the warp-specialized Gluon kernel (gluon.py): per-element work in the layouts of a
warpgroup's product tiles, emitted in Gluon's language; it finds the kernel's roles (the operands of the two
matrix products, the product over the loop axis, its repair factor) as it emits, and refuses what the pattern
cannot hold (NotEligible, caught by gluon.match_warp_specialized)."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.ir import ops
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import Schedule

from .kernel import KernelWriter
from .predicated import predicated_where
from .values import IDENTITY_CODE, Val

ROWS = 64                  # rows per consumer warpgroup: one m64 warpgroup product per block
CONSUMERS = 2
GLUON_DTYPE = {"f16": "gl.float16", "bf16": "gl.bfloat16"}


def start_partitions(name: str, args: str) -> list[str]:
    """The lines starting a warp-specialized kernel's partitions, each called with `args`: consumer 0 in the
    kernel's own 4 warps (the default partition), consumer 1 in 4 more, and the producer in one warp. Triton
    pads the producer to a warpgroup of idle warps and moves registers by warpgroup: 240 for each consumer,
    24 for the producer's. A producer of 4 warps put one producer warp beside the consumers' on every
    scheduler, each running the producer's loop; with one (as FlashAttention-3 has), prefill ran 1-4.5% faster
    at S = 16k on an H100 and the one-pass backward up to 3.6% (bench/experiments/2026-11-27-one-warp-producer)."""
    return ["gl.warp_specialize([",
            f"    ({name}_consumer, ({args}, gl.constexpr(0))),",
            f"    ({name}_consumer, ({args}, gl.constexpr(1))),",
            f"    ({name}_producer, ({args})),",
            "], [4, 1], [240, 24])"]


class NotEligible(Exception):
    """The schedule has no warp-specialized Gluon form; the message says why."""


def matched_or_why(match, sched: Schedule, name: str):
    """match(sched, name): a schedule's roles in a warp-specialized pattern, or the reason it has none."""
    try:
        return match(sched, name)
    except NotEligible as e:
        return str(e)


class GluonWriter(KernelWriter):
    """KernelWriter whose per-element work lives in the layouts of a warpgroup's product tiles: (row, loop)
    values in S, row vectors in S's rows, (row, col) values in O (the P V accumulator)."""
    interpretable = False
    lang = "gl"

    def __init__(self, sched: Schedule, name: str):
        super().__init__(sched, name)
        self.tma = False   # (Gluon has no descriptor loads of a tile: the matrix operands move by load's roles)
        self.operands: dict[str, tuple[str, list[str], list[str]]] = {}   # role -> (param, coords, blocks)
        self.dtype: str | None = None
        self.product: Term | None = None        # the reduction over the loop axis that is a matrix product
        self.p_tile: dict[str, str] = {}         # block -> P of that block (16-bit)
        self.factor: dict[str, str | None] = {}  # block -> the product state's repair factor (row vector)
        self.pointer_inputs: list[str] = []
        self.indexing = False                     # emitting a block's coordinates (any axis may appear)

    # ---- values ---------------------------------------------------------------------------------------------
    def _emit(self, t: Term, prev: bool, blk: str) -> Val:
        if (t.op == "axis" and t.attrs[0] in self.tile_axes and t.attrs[0] not in (self.row, self.loop)
                and not self.indexing):
            raise NotEligible(f"the per-element work reads axis {t.attrs[0]}, which only the matrix products hold")
        if t.op in ops.OPS and ops.OPS[t.op][t.attrs[0]].gluon == ops.NO_GLUON:
            raise NotEligible(f"{t.attrs[0]} has no Gluon lowering here")
        if t.op == "where" and not (t in self.masked_wheres and not self.ctx.masked):
            selected = predicated_where(self, t, prev, blk)
            if selected is not None:
                return selected
        return super()._emit(t, prev, blk)

    def expand(self, v: Val, axes: tuple[str, ...]) -> str:
        if self.col in axes and v.axes == (self.row,):   # a row vector (S's rows) meeting the accumulator (O)
            return f"gl.convert_layout({v.code}, O_ROWS)[:, None]"
        return super().expand(v, axes)

    def load(self, t: Term, order: tuple[str, ...], blk: str) -> Val:
        if not (t.free & set(self.tile_axes)) or order in ((self.row,), (self.loop,)):
            # a value per program (a per-head slope), or a vector along the rows or the keys (a document id per
            # position): a pointer load, masked in the layout of that axis's offsets
            if t.attrs[0] not in self.pointer_inputs:
                self.pointer_inputs.append(t.attrs[0])
            return super().load(t, order, blk)
        return self.matrix_operand(t, order, blk)

    def matrix_operand(self, t: Term, order: tuple[str, ...], blk: str) -> Val:
        """An input read as a tile: one of the products' operands, moved by the copy engine (a placeholder)."""
        name = t.attrs[0]
        if set(order) == {self.row, self.inner_axis()} and blk == "prologue":
            role = "a"
        elif set(order) == {self.loop, self.inner_axis()}:
            role = "b"
        elif set(order) == {self.loop, self.col}:
            role = "v"
        else:
            raise NotEligible(f"input {name} is read as a {'x'.join(order)} tile, not as a matrix operand")
        param, coords, blocks, _ = self.operand_block(t, order)
        if self.operands.setdefault(role, (param, coords, blocks)) != (param, coords, blocks):
            raise NotEligible(f"two different tensors are read as matrix operand {role}")
        return Val(f"<{role}>", order, self.dtype)

    def operand_block(self, t: Term, order: tuple[str, ...]) -> tuple[str, list[str], list[str], bool]:
        """descriptor_block of an input read as a matrix operand, all of whose operands share one 16-bit dtype."""
        name = t.attrs[0]
        dtype = self.spec.inputs[name].dtype
        self.indexing = True
        found = self.descriptor_block(name, t.args, order)
        self.indexing = False
        if found is None or dtype not in GLUON_DTYPE or self.dtype not in (None, dtype):
            raise NotEligible(f"input {name} cannot move as one block of the copy engine in {GLUON_DTYPE}")
        self.dtype = dtype
        return found

    def inner_axis(self) -> str | None:
        return self.s.inner[0] if len(self.s.inner) == 1 else None

    def inner_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        if t.attrs[0] != "sum" or not self.contraction(t.args[0], t.attrs[1]) or blk == "prologue":
            raise NotEligible(f"{ir.show(t)[:60]} is not the per-block matrix product")
        va, vb, x, y, _ = self.dot_operands(t.args[0], t.attrs[1], prev, zero_invalid=False)
        if (va.code, vb.code, x, y) != ("<a>", "<b>", self.row, self.loop):
            raise NotEligible(f"{ir.show(t)[:60]}: the per-block product must read two inputs as they are")
        return Val("qk", (self.row, self.loop), "f32")

    # ---- reductions over the loop axis ----------------------------------------------------------------------
    def init_state(self, r: Term, block: str) -> None:
        axes = self.state_axes(r)
        if axes == (self.row, self.col) and r.attrs[0] == "sum" and self.contraction(r.args[0], r.attrs[1]):
            if self.product is not None:
                raise NotEligible("more than one matrix product over the loop axis")
            self.product = r
            self.state[r] = Val("acc", axes, "f32")
            return
        if axes != (self.row,):
            raise NotEligible(f"{ir.show(r)[:60]}: a state over {axes}, not a row vector or the product")
        var = self.fresh("r")
        self.blocks[block].append(f"{var} = gl.full([{ROWS}], {IDENTITY_CODE[r.attrs[0]]}, gl.float32, S_ROWS)")
        self.state[r] = Val(var, axes, "f32")

    def update(self, r: Term) -> None:
        if r is not self.product:
            return super().update(r)
        blk = self.ctx.body
        va, vb, x, y, prec = self.dot_operands(r.args[0], r.attrs[1], False, zero_invalid=self.ctx.masked)
        if vb.code != "<v>" or (x, y) != (self.row, self.col) or prec or va.dtype != self.dtype:
            raise NotEligible(f"{ir.show(r)[:60]}: P V must multiply a 16-bit P by an input read as it is")
        factor = None
        if r.op == "roll":
            rep = r.args[1]
            parts = [a for a in rep.args if a.op != "acc"] if rep.op == "bin" and rep.attrs[0] == "mul" else []
            if len(parts) != 1 or any(x.op == "acc" for x in ir.walk(parts[0])):
                raise NotEligible(f"the repair {ir.show(rep)[:60]} is not a row factor times the state")
            f = self.emit(parts[0])
            if f.axes not in ((self.row,), ()):
                raise NotEligible(f"the repair factor {ir.show(parts[0])[:60]} is not a row vector")
            factor = f.code
        self.p_tile[blk], self.factor[blk] = va.code, factor
