"""The kernel writer of the warp-specialized Gluon gradient pass (gluon_gradients.py): per-element work in the
layouts of a warpgroup's product tiles, as gluon_writer.GluonWriter emits it, for a pass whose programs own a
block of rows (keys) and loop over the other axis (queries) with matrix products of three kinds:

    per block     sum over an in-tile axis of an input read along the rows times one read along the loop axis
                  (S^T = K Q^T, dP^T = V dO^T): issued when the block's operands arrive, waited for where the
                  per-element work first reads them
    over loop     sum over the loop axis of a 16-bit per-element tile times an input read along the loop axis
                  (dV += P^T dO, dK += dS^T Q): row x column states held by the consumer
    accumulated   sum over the rows of an input read along the rows times a per-element tile (dQ = dS K): an
                  output every program adds its share to, through the copy engine's bulk reduce

It finds those roles as it emits and refuses what the pattern cannot hold (NotEligible)."""
from __future__ import annotations

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.plan.schedule import Schedule

from .gluon_writer import GLUON_DTYPE, ROWS, GluonWriter, NotEligible
from .values import OP_CODE, Val, rounded_to


# a comparison of positions as a test of their difference against 0
DIFFERENCE_TEST = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "eq": "==", "ne": "!="}


def _positions_only(t: Term) -> bool:
    """Is t sums and differences of axes (positions), sizes and integer constants below 2^30 alone, tested
    (a mask linear in the positions, whose sides' difference cannot overflow)?"""
    for x in ir.walk(t):
        if x.op not in ("axis", "dim", "const", "bin"):
            return False
        if x.op == "const" and (x.attrs[0] != int(x.attrs[0]) or abs(x.attrs[0]) >= 2**30):
            return False
        if x.op == "bin" and x.attrs[0] not in ("add", "sub", *DIFFERENCE_TEST, *ir.LOGIC):
            return False
    return True


class GradientWriter(GluonWriter):
    def __init__(self, sched: Schedule, name: str):
        super().__init__(sched, name)
        self.row_operands: dict[str, tuple[list[str], list[str]]] = {}    # param -> (coords, block shape)
        self.loop_operands: dict[str, tuple[list[str], list[str]]] = {}
        self.block_products: dict[str, list[tuple[str, str, str]]] = {}   # body -> [(var, row param, loop param)]
        self.cols: set[str] = set()        # extents of the column axes of the states over the loop axis
        self.sixteen: dict[tuple, Val] = {}

    # ---- operands -------------------------------------------------------------------------------------------
    def matrix_operand(self, t: Term, order: tuple[str, ...], blk: str) -> Val:
        name = t.attrs[0]
        along = [a for a in (self.row, self.loop) if a in order]
        if len(order) != 2 or len(along) != 1:
            raise NotEligible(f"input {name} is read as a {'x'.join(order)} tile, not as a matrix operand")
        role = "row" if along[0] == self.row else "loop"
        param, coords, blocks, transposed = self.operand_block(t, order)
        if transposed:
            raise NotEligible(f"input {name} cannot move as one block of the copy engine in {GLUON_DTYPE}")
        (self.row_operands if role == "row" else self.loop_operands)[param] = (coords, blocks)
        return Val(f"<{role}:{param}>", order, self.dtype)

    @staticmethod
    def role(v: Val) -> tuple[str, str] | None:
        """("row" or "loop", descriptor param) of an operand placeholder; None for a computed value."""
        if not v.code.startswith("<"):
            return None
        role, param = v.code[1:-1].split(":")
        return role, param

    def width(self, param: str) -> str:
        """The block width (last dimension) of an operand's descriptor."""
        table = self.row_operands if param in self.row_operands else self.loop_operands
        return table[param][1][-1]

    def loop_tile(self, param: str) -> str:
        return f"{param}_smem.index(stage).reshape([{self.block(self.loop)}, {self.width(param)}])"

    def row_tile(self, param: str) -> str:
        return f"{param}_smem.reshape([{self.block(self.row)}, {self.width(param)}]).slice(ME * {ROWS}, {ROWS})"

    def in_sixteen(self, t: Term, v: Val, blk: str) -> Val:
        """A per-element tile as a 16-bit matrix operand: as it is, or rounded where it is a product of factors
        each rounded to the operands' dtype (as the Triton kernels take it)."""
        if v.dtype == self.dtype:
            return v
        if v.dtype != "f32" or not rounded_to(t, self.dtype):
            raise NotEligible(f"{ir.show(t)[:60]} is not a {self.dtype} matrix operand")
        key = (t, blk)
        if key not in self.sixteen:
            self.sixteen[key] = Val(self.put(blk, f"{v.code}.to({GLUON_DTYPE[self.dtype]})"), v.axes, self.dtype)
        return self.sixteen[key]

    def split_product(self, body: Term, k: str):
        """(operand term, its value, tile term, its value) of a product over k of an input operand and a
        computed tile, or None."""
        found = self.contraction(body, k)
        if found is None:
            return None
        a, b = found[:2]
        va, vb = self.emit(a), self.emit(b)
        if self.role(va) and not self.role(vb):
            return a, va, b, vb
        if self.role(vb) and not self.role(va):
            return b, vb, a, va
        return None

    # ---- products within a block ----------------------------------------------------------------------------
    def inner_reduction(self, t: Term, prev: bool, blk: str) -> Val:
        k = t.attrs[1]
        found = self.contraction(t.args[0], k) if t.attrs[0] == "sum" and t.op == "red" else None
        if found is None or blk == "prologue" or k in (self.row, self.loop):
            raise NotEligible(f"{ir.show(t)[:60]} is not a matrix product of two inputs within a block")
        roles = dict(filter(None, (self.role(self.emit(x)) for x in found[:2])))
        if set(roles) != {"row", "loop"}:
            raise NotEligible(f"{ir.show(t)[:60]}: a product within a block must read one input along the rows "
                              "and one along the loop axis")
        var = self.fresh("mm")
        self.block_products.setdefault(blk, []).append((var, roles["row"], roles["loop"]))
        return Val(var, (self.row, self.loop), "f32")

    def emit(self, t: Term, prev: bool = False) -> Val:
        if t.op == "bin" and t.attrs[0] in (*DIFFERENCE_TEST, *ir.LOGIC) and _positions_only(t):
            key = ("position test", self.home(t), t)
            if key in self.cache:
                return self._tested_again(t)
            self.cache[key] = True
        return super().emit(t, prev)

    def _tested_again(self, t: Term) -> Val:
        """A later use of a test of positions (a causal mask's i >= j), computed again as a difference, a form
        the compiler does not merge with the first: a tile of truth values held from the scores to dS made the
        consumers spill (320 bytes of stack against 176, causal attention compiled for sm_90). Positions are
        below 2^30, so the difference does not overflow."""
        if t.attrs[0] in ir.LOGIC:   # a mask of several tests (a window: i >= j and i - j < W), each again
            a, b = (self._tested_again(x) if x.op == "bin" and x.attrs[0] in (*DIFFERENCE_TEST, *ir.LOGIC)
                    else self.emit(x) for x in t.args)
            axes = self.canon(set(a.axes) | set(b.axes))
            return Val(OP_CODE["gl"]["bin"][t.attrs[0]].format(self.expand(a, axes), self.expand(b, axes)), axes,
                       "bool")
        a, b = self.emit(t.args[0]), self.emit(t.args[1])
        axes = self.canon(set(a.axes) | set(b.axes))
        return Val(f"(({self.expand(a, axes)} - {self.expand(b, axes)}) {DIFFERENCE_TEST[t.attrs[0]]} 0)", axes,
                   "bool")

    def expand(self, v: Val, axes: tuple[str, ...]) -> str:
        if len(axes) == 2 and axes[0] == self.row and axes[1] != self.loop and v.axes == (self.row,):
            return f"gl.convert_layout({v.code}, O_ROWS)[:, None]"   # a row vector meeting a state
        return super().expand(v, axes)

    # ---- products over the loop axis ------------------------------------------------------------------------
    def init_state(self, r: Term, block: str) -> None:
        axes = self.state_axes(r)
        if r.op != "red" or r.attrs[0] != "sum" or len(axes) != 2 or axes[0] != self.row:
            raise NotEligible(f"{ir.show(r)[:60]}: a reduction over the loop axis that is not a matrix product")
        self.cols.add(self.ext(axes[1]))
        var = self.fresh("acc")
        self.blocks[block].append(f"{var} = gl.zeros([{ROWS}, {self.ext(axes[1])}], gl.float32, O_LAYOUT)")
        self.state[r] = Val(var, axes, "f32")

    def update(self, r: Term) -> None:
        blk = self.ctx.body
        found = self.split_product(r.args[0], self.loop)
        if found is None or self.role(found[1])[0] != "loop" or found[3].axes != (self.row, self.loop):
            raise NotEligible(f"{ir.show(r)[:60]}: not a per-element tile times an input read along the loop axis")
        _, operand, tile_term, tile = found
        p = self.in_sixteen(tile_term, tile, blk)
        if self.ctx.masked:
            p = Val(self.put(blk, f"gl.where(valid_{self.loop}[None, :], {p.code}, 0.0)"), p.axes, p.dtype)
        st = self.state[r]
        self.blocks[blk].append(f"{st.code} = warpgroup_mma(gl.convert_layout({p.code}, P_LAYOUT), "
                                f"{self.loop_tile(self.role(operand)[1])}, {st.code}, is_async=True)")
