"""The interval arithmetic of block classification as Triton lines: a predicate's interval over a pair of blocks
(a block of rows, a block of keys), emitted as straight-line code over float64 lo/hi pairs, the same arithmetic
as intervals.py (which runs it in torch for masks of positions). The classifying kernels (block_kernel.py,
block_pairs.py) place these lines and shape the block summaries.

A value is a pair of variable names (lo, hi), one name twice where it is known exactly (every value of a
grid axis, a constant, a value at one position): exact operands compute the operation once, as the kernel
does. Every interval holds every value its term takes over the block pair (NaN bounds widen to infinity), so
"empty" keeps no element and "full" masks none.
"""
from __future__ import annotations

from neptune_eqsat.ir import Term, ops
from neptune_eqsat import ir

INF = "float('inf')"
# operations computed exactly on exact operands (from the op table's Triton forms, which hold for float64)
_EXACT_UN = ("neg", "abs", "recip", "logistic2", "exp", "exp2", "log", "sqrt", "tanh", "erf", "floor", "ceil",
             "round", "trunc", "softplus")
_INCREASING = ("exp", "exp2", "log", "sqrt", "tanh", "erf", "floor", "ceil", "round", "trunc", "softplus")
_CASTS = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}
# operations a kernel rounds in float32: their bounds widened as intervals.py widens them (which imports torch)
_ROUNDED = ("exp", "exp2", "log", "sqrt", "tanh", "erf", "softplus", "logistic2", "recip", "div")
_ROUNDING = 2.0 ** -20
_FLT_EDGE = 2.0 ** 127


class _Emitter:
    """Triton lines computing a predicate's interval per (row block, chunk of key blocks)."""

    def __init__(self, w, grid_axes, tensors_rank):
        self.w, self.row, self.loop = w, w.row, w.loop
        self.grid_axes, self.rank = grid_axes, tensors_rank
        self.pre: list[str] = []    # before the key loop (rows, grid values, constants)
        self.body: list[str] = []   # per chunk of key blocks
        self.memo: dict = {None: {}, w.row: {}, w.loop: {}}
        self.count = 0
        self.top = (self.new("-" + INF, False), self.new(INF, False))

    def new(self, code: str, in_loop: bool) -> str:
        var = f"v{self.count}"
        self.count += 1
        (self.body if in_loop else self.pre).append(f"{var} = {code}")
        return var

    def emit(self, t: Term, mode: str | None = None) -> tuple[str, str]:
        """t's interval over the block pair (mode None), or exactly at each row (mode row) or key (mode loop)."""
        memo = self.memo[mode]
        if t not in memo:
            ranged = t.free & {self.row, self.loop}
            if mode is None and len(ranged) == 1 and t.op not in ("axis", "dim", "const"):
                ax = next(iter(ranged))   # a value of one axis: at each position, summarized per block
                memo[t] = self.blockwise(self.emit(t, ax), ax)
            else:
                memo[t] = self.node(t, mode, self.loop in t.free)
        return memo[t]

    def summary(self, ax) -> tuple[int, str]:
        """The tile axis a block summary of `ax` reduces over, and the indexing that shapes it for the pairs:
        here a row's values lie along axis 0 of a row block, a key's along axis 1 of a chunk of key blocks."""
        return (0, "") if ax == self.row else (1, "")

    def blockwise(self, v, ax):
        ok = "ok_i" if ax == self.row else "ok_j"
        axis, shape = self.summary(ax)
        in_loop = ax == self.loop
        lo = self.new(f"tl.min(tl.where({ok}, tl.where({v[0]} == {v[0]}, {v[0]}, -{INF}), {INF}), "
                      f"axis={axis}){shape}", in_loop)
        hi = self.new(f"tl.max(tl.where({ok}, tl.where({v[1]} == {v[1]}, {v[1]}, {INF}), -{INF}), "
                      f"axis={axis}){shape}", in_loop)
        return lo, hi

    def node(self, t: Term, mode, in_loop: bool):
        op, at, ar = t.op, t.attrs, t.args

        def new(code):
            return self.new(code, in_loop)

        def exact(code):
            v = new(code)
            return v, v
        if op == "axis":
            ax = at[0]
            if ax == self.row:
                return ("pi", "pi") if mode == self.row else ("ai_lo", "ai_hi")
            if ax == self.loop:
                return ("pj", "pj") if mode == self.loop else ("aj_lo", "aj_hi")
            return f"g_{ax}", f"g_{ax}"
        if op == "dim":
            return exact(f"{at[0]}.to(tl.float64)")
        if op == "const":
            return exact(f"tl.full([], float({str(float(at[0]))!r}), tl.float64)")
        subs = [self.emit(x, mode) for x in ar]
        if op == "load":
            return self.load(at[0], subs, new, in_loop)
        if op == "un":
            out = self.unary(at[0], subs[0], new)
            out = self.rounded(*out, new) if at[0] in _ROUNDED else out
            return out if at[0] == "not" else self.poisoned(out, subs, new)
        if op == "bin":
            out = self.binary(at[0], subs[0], subs[1], new)
            out = self.rounded(*out, new) if at[0] in _ROUNDED else out
            return out if ops.OPS["bin"][at[0]].group in ("compare", "logic") else self.poisoned(out, subs, new)
        if op == "where":
            return self.where(*subs, new)
        if op == "cast":
            a = subs[0]
            if at[0] not in _CASTS:
                return a
            conv = f".to(tl.float32).to({_CASTS[at[0]]}).to(tl.float64)"
            return (exact(f"{a[0]}{conv}") if a[0] == a[1] else (new(f"{a[0]}{conv}"), new(f"{a[1]}{conv}")))
        raise ValueError(f"cannot classify blocks of {op}")

    def rounded(self, lo, hi, new):
        """[lo, hi] widened to hold the same operation rounded in float32 (as intervals._iv_rounded)."""
        edge, tiny = f"{_FLT_EDGE!r}", f"{2.0 ** -126!r}"
        lo = new(f"tl.where(tl.abs({lo}) == {INF}, {lo}, {lo} - tl.abs({lo}) * {_ROUNDING!r} - {tiny})")
        hi = new(f"tl.where(tl.abs({hi}) == {INF}, {hi}, {hi} + tl.abs({hi}) * {_ROUNDING!r} + {tiny})")
        return new(f"tl.where({lo} <= -{edge}, -{INF}, {lo})"), new(f"tl.where({hi} >= {edge}, {INF}, {hi})")

    def widen(self, lo, hi, new):
        """An interval with NaN bounds widened to every value (an undefined result could be anything; the whole
        line also stands for a value that may be NaN, as in intervals._iv)."""
        defined = new(_and(f"{lo} == {lo}", f"{hi} == {hi}"))
        return new(f"tl.where({defined}, {lo}, -{INF})"), new(f"tl.where({defined}, {hi}, {INF})")

    def poisoned(self, out, operands, new):
        """An arithmetic result where an operand may be NaN (the whole line): the whole line (intervals.py's
        _iv_poisoned)."""
        lo, hi = out
        for a_lo, a_hi in operands:
            if a_lo != a_hi:
                top = new(_and(f"{a_lo} == -{INF}", f"{a_hi} == {INF}"))
                lo, hi = new(f"tl.where({top}, -{INF}, {lo})"), new(f"tl.where({top}, {INF}, {hi})")
        return lo, hi

    def load(self, name, index, new, in_loop):
        if any(lo != hi for lo, hi in index):   # a range of indices: every value (loose, still sound)
            return self.top
        offset = " + ".join(f"tl.minimum(tl.maximum(tl.where({i} == {i}, {i}, 0.0), 0.0), "
                            f"({name}_n{k} - 1).to(tl.float64)).to(tl.int64) * {name}_s{k}"
                            for k, (i, _) in enumerate(index)) or "0"
        raw = new(f"tl.load({name}_ptr + {offset})")
        if self.w.spec.inputs[name].dtype == "i64":   # float64 holds integers exactly up to 2^53: past that,
            # ids could compare equal here and not in the kernel, so every block is partial (tested per element)
            (self.body if in_loop else self.pre).append(f"inexact = tl.maximum(inexact, tl.max((tl.abs({raw}) > "
                                                        f"{2 ** 53}).to(tl.int32) + tl.zeros([1], tl.int32), axis=None))")
        v = new(f"{raw}.to(tl.float64)")
        return v, v

    def truth(self, a, new):
        """A number as a condition (nonzero is true): (always, maybe) in {0, 1}."""
        lo, hi = a
        return (new(f"tl.where({_or(f'{lo} > 0', f'{hi} < 0')}, 1.0, 0.0)"),
                new(f"tl.where({_and(f'{lo} == 0', f'{hi} == 0')}, 0.0, 1.0)"))

    def unary(self, fn, a, new):
        lo, hi = a
        if lo == hi and (fn in _EXACT_UN or fn == "not"):
            v = new(f"tl.where({lo} == 0, 1.0, 0.0)" if fn == "not" else ops.OPS["un"][fn].triton.format(lo))
            return v, v
        if fn == "neg":
            return new(f"-{hi}"), new(f"-{lo}")
        if fn == "abs":
            inside = new(_and(f"{lo} <= 0", f"{hi} >= 0"))
            return (new(f"tl.where({inside}, 0.0, tl.minimum(tl.abs({lo}), tl.abs({hi})))"),
                    new(f"tl.maximum(tl.abs({lo}), tl.abs({hi}))"))
        if fn == "not":
            t_lo, t_hi = self.truth(a, new)
            return new(f"1.0 - {t_hi}"), new(f"1.0 - {t_lo}")
        if fn in _INCREASING:
            form = ops.OPS["un"][fn].triton
            return self.widen(new(form.format(lo)), new(form.format(hi)), new)
        if fn == "logistic2":   # 1 / (1 + 2^x) decreases
            return self.widen(new(f"1.0 / (1.0 + tl.math.exp2({hi}))"), new(f"1.0 / (1.0 + tl.math.exp2({lo}))"),
                              new)
        if fn == "recip":
            inside = new(_and(f"{lo} <= 0", f"{hi} >= 0"))
            return self.widen(new(f"tl.where({inside}, -{INF}, 1.0 / {hi})"),
                              new(f"tl.where({inside}, {INF}, 1.0 / {lo})"), new)
        return self.top

    def corners(self, form, a, b, new):
        values = [new(form.format(x, y)) for x in a for y in b]
        lo = hi = None
        for v in values:   # a NaN corner is kept (the whole line, by widen)
            keep = "tl.where({0} != {0}, {0}, tl.where({1} != {1}, {1}, tl.{2}({0}, {1})))"
            lo = v if lo is None else new(keep.format(lo, v, "minimum"))
            hi = v if hi is None else new(keep.format(hi, v, "maximum"))
        return self.widen(lo, hi, new)

    def binary(self, fn, a, b, new):
        (alo, ahi), (blo, bhi) = a, b
        if alo == ahi and blo == bhi:
            v = new(_exact_binary(fn, alo, blo))
            return v, v
        if fn == "add":
            return self.widen(new(f"{alo} + {blo}"), new(f"{ahi} + {bhi}"), new)
        if fn == "sub":
            return self.widen(new(f"{alo} - {bhi}"), new(f"{ahi} - {blo}"), new)
        if fn == "mul":
            return self.corners("({} * {})", a, b, new)
        if fn in ("div", "floordiv"):
            lo, hi = self.corners("({} / {})" if fn == "div" else "tl.floor({} / {})", a, b, new)
            ok = new(_or(f"{blo} > 0", f"{bhi} < 0"))
            return new(f"tl.where({ok}, {lo}, -{INF})"), new(f"tl.where({ok}, {hi}, {INF})")
        if fn == "max":
            return new(f"tl.maximum({alo}, {blo})"), new(f"tl.maximum({ahi}, {bhi})")
        if fn == "min":
            return new(f"tl.minimum({alo}, {blo})"), new(f"tl.minimum({ahi}, {bhi})")
        if fn == "mod":
            # a remainder by a positive divisor c: within [0, c); the identity where a fits in one period of c;
            # a negative dividend: within (-c, c) (C's remainder, or torch's)
            period = new(f"tl.floor({alo} / {blo})")
            same = new(_and(f"{blo} == {bhi}", f"{period} == tl.floor({ahi} / {blo})", f"tl.abs({alo}) < {INF}",
                            f"tl.abs({ahi}) < {INF}", f"{alo} >= 0"))
            lo = new(f"tl.where({same}, {alo} - {period} * {blo}, tl.where({alo} >= 0, 0.0, -{bhi}))")
            hi = new(f"tl.where({same}, {ahi} - {period} * {blo}, {bhi})")
            return new(f"tl.where({blo} > 0, {lo}, -{INF})"), new(f"tl.where({blo} > 0, {hi}, {INF})")
        if fn in ("lt", "le", "gt", "ge"):
            if fn in ("gt", "ge"):
                (alo, ahi), (blo, bhi), fn = b, a, {"gt": "lt", "ge": "le"}[fn]
            rel = "<" if fn == "lt" else "<="
            return (new(f"tl.where({ahi} {rel} {blo}, 1.0, 0.0)"), new(f"tl.where({alo} {rel} {bhi}, 1.0, 0.0)"))
        if fn in ("eq", "ne"):
            always = new(_and(f"{alo} == {ahi}", f"{blo} == {bhi}", f"{alo} == {blo}"))
            maybe = new(_and(f"{alo} <= {bhi}", f"{blo} <= {ahi}"))
            if fn == "eq":
                return new(f"tl.where({always}, 1.0, 0.0)"), new(f"tl.where({maybe}, 1.0, 0.0)")
            return new(f"tl.where({maybe}, 0.0, 1.0)"), new(f"tl.where({always}, 0.0, 1.0)")
        if fn in ("and", "or"):
            (tlo_a, thi_a), (tlo_b, thi_b) = self.truth(a, new), self.truth(b, new)
            pick = "tl.minimum" if fn == "and" else "tl.maximum"
            return new(f"{pick}({tlo_a}, {tlo_b})"), new(f"{pick}({thi_a}, {thi_b})")
        natural = new(_and(f"{alo} >= 0", f"{blo} >= 0", f"{ahi} < {INF}", f"{bhi} < {INF}"))
        if fn == "bitand":
            lo, hi = "0.0", f"tl.minimum({ahi}, {bhi})"
        elif fn in ("bitor", "bitxor"):   # below the next power of two of the larger operand
            top = new(f"tl.math.exp2(tl.ceil(tl.log2(tl.maximum({ahi}, {bhi}) + 1.0))) - 1.0")
            lo, hi = (f"tl.maximum({alo}, {blo})" if fn == "bitor" else "0.0"), top
        elif fn == "shl":
            lo, hi = f"{alo} * tl.math.exp2({blo})", f"{ahi} * tl.math.exp2({bhi})"
        elif fn == "shr":
            lo, hi = f"tl.floor({alo} / tl.math.exp2({bhi}))", f"tl.floor({ahi} / tl.math.exp2({blo}))"
        else:
            return self.top
        return self.widen(new(f"tl.where({natural}, {lo}, -{INF})"), new(f"tl.where({natural}, {hi}, {INF})"), new)

    def where(self, c, a, b, new):
        if c[0] == c[1] and a[0] == a[1] and b[0] == b[1]:
            v = new(f"tl.where({c[0]} != 0, {a[0]}, {b[0]})")
            return v, v
        t_lo, t_hi = self.truth(c, new)
        return (new(f"tl.where({t_lo} == 1, {a[0]}, tl.where({t_hi} == 0, {b[0]}, tl.minimum({a[0]}, {b[0]})))"),
                new(f"tl.where({t_lo} == 1, {a[1]}, tl.where({t_hi} == 0, {b[1]}, tl.maximum({a[1]}, {b[1]})))"))


def _and(*conds: str) -> str:
    """Conditions joined by and, as nested wheres: Triton's interpreter cannot & a 0-d and a 1-d condition."""
    code = conds[-1]
    for c in reversed(conds[:-1]):
        code = f"tl.where({c}, {code}, False)"
    return code


def _or(*conds: str) -> str:
    code = conds[-1]
    for c in reversed(conds[:-1]):
        code = f"tl.where({c}, True, {code})"
    return code


def _exact_binary(fn: str, a: str, b: str) -> str:
    """fn of two exact float64 operands, as the interval runtime computes it (floors, truth values 0/1)."""
    group = ops.OPS["bin"][fn].group
    if fn == "floordiv":
        return f"tl.floor({a} / {b})"
    if fn == "mod":
        return f"({a} - {b} * tl.floor({a} / {b}))"
    if group == "compare":
        return f"tl.where({ops.OPS['bin'][fn].triton.format(a, b)}, 1.0, 0.0)"
    if group == "logic":
        return f"tl.where({(_and if fn == 'and' else _or)(f'{a} != 0', f'{b} != 0')}, 1.0, 0.0)"
    if group == "integer":   # bit operations on the integers the values hold
        return ops.OPS["bin"][fn].triton.format(f"{a}.to(tl.int64)", f"{b}.to(tl.int64)") + ".to(tl.float64)"
    return ops.OPS["bin"][fn].triton.format(a, b)


def _ranks(pred: Term) -> dict[str, int]:
    """Each tensor the predicate reads, with its rank (the number of indices it is read with)."""
    return {t.attrs[0]: len(t.args) for t in ir.walk(pred) if t.op == "load"}


def kernel_params(table, sizes: list[str]) -> tuple[list[str], list[str]]:
    """A classifying kernel's parameters for the tensors the predicate reads (pointer, sizes, strides), and
    its integer parameters (the sizes and those), which it does not specialize on."""
    ranks = _ranks(table.pred)
    tensor_params = [p for t in table.tensors for p in
                     [f"{t}_ptr"] + [f"{t}_n{k}" for k in range(ranks[t])] + [f"{t}_s{k}" for k in range(ranks[t])]]
    return tensor_params, sizes + [p for p in tensor_params if not p.endswith("_ptr")]


# a classifying kernel launched as a programmatic dependent (runtime: _dependent_launch): it waits for the writes
# of the kernel before it (the tensors' new values), then lets the kernel reading its lists launch, to wait in
# its turn for these
DEPENDENT_HEAD = ["if DEPENDENT:", "    gdc_wait()", "    gdc_launch_dependents()"]


def class_lines(live: str, always: str, maybe: str, key_n: str) -> list[str]:
    """is_full and is_partial per block pair from the predicate's truth interval: full where it always holds
    over a whole key block and every id read is exact (`inexact`), partial where it may hold and the block is
    not full; `live` marks the pairs that exist (`kbs`: the key block of each)."""
    return [f"is_full = {_and(live, f'{always} == 1', f'kbs * BLOCK_LOOP + BLOCK_LOOP <= {key_n}', 'inexact == 0')}",
            f"is_partial = {_and(live, _or(f'{maybe} != 0', 'inexact != 0'), 'is_full == 0')}"]
