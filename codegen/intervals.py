"""Interval arithmetic over blocks of indices, in torch: the run-time half of block classification (blocks.py).

A value is a pair (lo, hi) of float64 tensors that broadcast against each other: every element the value
takes over a block of rows x a block of keys lies in [lo, hi]. A condition is an interval over {0, 1}: lo = 1
means true for every element, hi = 0 false for every one. Each operation returns an interval holding every
result of its operands' elements (never a narrower one: a NaN bound widens to infinity), so a block found
"never" holds no kept element and a block found "always" no masked one, whatever the predicate.

Imports only torch; everything below the marker is copied into each generated module that classifies blocks.
"""
import math

import torch

# ---- copied into every generated module from here on
_IV_INCREASING = {
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "sqrt": torch.sqrt, "tanh": torch.tanh,
    "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
}
_IV_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}


# A value known exactly (every position of one axis, a constant) is the pair (v, v) of one tensor: operations
# on exact operands compute the value once, as the kernel does, rather than as two bounds.
_EXACT_UN = {
    "neg": torch.neg, "abs": torch.abs, "not": lambda x: (x == 0).double(), "recip": torch.reciprocal,
    "logistic2": lambda x: 1 / (1 + torch.exp2(x)),
}
_EXACT_BIN = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "floordiv": lambda a, b: torch.floor(a / b), "mod": lambda a, b: a - b * torch.floor(a / b),
    "lt": lambda a, b: (a < b).double(), "le": lambda a, b: (a <= b).double(), "gt": lambda a, b: (a > b).double(),
    "ge": lambda a, b: (a >= b).double(), "eq": lambda a, b: (a == b).double(), "ne": lambda a, b: (a != b).double(),
    "and": lambda a, b: ((a != 0) & (b != 0)).double(), "or": lambda a, b: ((a != 0) | (b != 0)).double(),
    "bitand": lambda a, b: torch.bitwise_and(a.long(), b.long()).double(),
    "bitor": lambda a, b: torch.bitwise_or(a.long(), b.long()).double(),
    "bitxor": lambda a, b: torch.bitwise_xor(a.long(), b.long()).double(),
    "shl": lambda a, b: torch.bitwise_left_shift(a.long(), b.long()).double(),
    "shr": lambda a, b: torch.bitwise_right_shift(a.long(), b.long()).double(),
}


# Operations a kernel rounds (in float32) where this runtime rounds in float64, so a value at a comparison's edge
# can land on either side of it (tanh(19) is 1 in float32, 1 - 2^-53 here): their bounds are widened by far more
# than either rounding, values past float32's range reach infinity, and values float32 flushes reach zero.
_ROUNDED = ("exp", "exp2", "log", "sqrt", "tanh", "erf", "softplus", "logistic2", "recip", "div")
_ROUNDING = 2.0 ** -20
_FLT_EDGE = 2.0 ** 127


def _iv_rounded(lo, hi):
    """[lo, hi] widened to hold the same operation rounded in float32 (an infinite bound stays)."""
    lo = torch.where(torch.isinf(lo), lo, lo - lo.abs() * _ROUNDING - 2.0 ** -126)
    hi = torch.where(torch.isinf(hi), hi, hi + hi.abs() * _ROUNDING + 2.0 ** -126)
    return torch.where(lo <= -_FLT_EDGE, -math.inf, lo), torch.where(hi >= _FLT_EDGE, math.inf, hi)


def _exact(*values):
    return all(v[0] is v[1] for v in values)


def _iv(lo, hi):
    """An interval with NaN bounds widened to every value (an undefined result could be anything). The whole
    line [-inf, inf] also stands for a value that may be NaN: arithmetic keeps it (_iv_poisoned), and a
    comparison of it may hold or not."""
    undefined = torch.isnan(lo) | torch.isnan(hi)
    return torch.where(undefined, -math.inf, lo), torch.where(undefined, math.inf, hi)


_TRUTH_OPS = ("lt", "le", "gt", "ge", "eq", "ne", "and", "or")


def _iv_poisoned(out, *operands):
    """An arithmetic result where an operand may be NaN (the whole line): the whole line (NaN propagates,
    and abs, exp or max of it is no narrower)."""
    lo, hi = out
    for a in operands:
        if not _exact(a):
            top = (a[0] == -math.inf) & (a[1] == math.inf)
            lo, hi = torch.where(top, -math.inf, lo), torch.where(top, math.inf, hi)
    return lo, hi


def _iv_top(a, b=None):
    """Every real number, in the broadcast shape of the operands."""
    shape = a[0].shape if b is None else torch.broadcast_shapes(a[0].shape, b[0].shape)
    return (torch.full(shape, -math.inf, dtype=torch.float64, device=a[0].device),
            torch.full(shape, math.inf, dtype=torch.float64, device=a[0].device))


def _iv_const(value, device):
    """A constant, filled on the device (a copy from the host could not be captured in a CUDA graph)."""
    v = torch.full((), float(value), dtype=torch.float64, device=device)
    return v, v


def _iv_blockwise(v, pos, block):
    """A value computed at every position of one axis (dimension `pos`) summarized per block of `block`
    positions: the least and greatest value in each block."""
    lo, hi = torch.broadcast_tensors(torch.nan_to_num(v[0], nan=-math.inf), torch.nan_to_num(v[1], nan=math.inf))
    n = lo.shape[pos]
    if lo.dim() == 0 or n == 1:
        return lo, hi
    blocks = -(-n // block)
    out = []
    for x, fill, reduce in ((lo, math.inf, torch.amin), (hi, -math.inf, torch.amax)):
        x = x.movedim(pos, -1)
        if blocks * block != n:
            x = torch.cat([x, x.new_full(x.shape[:-1] + (blocks * block - n,), fill)], -1)
        out.append(reduce(x.reshape(x.shape[:-1] + (blocks, block)), -1).movedim(-1, pos))
    return out[0], out[1]


def _iv_truth(a):
    """A number as a condition (nonzero is true)."""
    lo, hi = a
    always = (lo > 0) | (hi < 0)
    never = (lo == 0) & (hi == 0)
    return always.double(), (~never).double()


def _iv_un(fn, a):
    out = _iv_un_rounded_as_here(fn, a)
    out = _iv_rounded(*out) if fn in _ROUNDED else out
    return out if fn == "not" else _iv_poisoned(out, a)


def _iv_un_rounded_as_here(fn, a):
    lo, hi = a
    if _exact(a) and (fn in _EXACT_UN or fn in _IV_INCREASING):
        v = (_EXACT_UN.get(fn) or _IV_INCREASING[fn])(lo)
        return v, v
    if fn == "neg":
        return -hi, -lo
    if fn == "abs":
        inside = (lo <= 0) & (hi >= 0)
        return torch.where(inside, 0.0, torch.minimum(lo.abs(), hi.abs())), torch.maximum(lo.abs(), hi.abs())
    if fn == "not":
        t_lo, t_hi = _iv_truth(a)
        return 1 - t_hi, 1 - t_lo
    if fn in _IV_INCREASING:
        f = _IV_INCREASING[fn]
        return _iv(f(lo), f(hi))
    if fn == "logistic2":   # 1 / (1 + 2^x) decreases
        return _iv(1 / (1 + torch.exp2(hi)), 1 / (1 + torch.exp2(lo)))
    if fn == "recip":
        inside = (lo <= 0) & (hi >= 0)
        return _iv(torch.where(inside, -math.inf, 1 / hi), torch.where(inside, math.inf, 1 / lo))
    return _iv_top(a)


def _iv_corners(f, a, b):
    """The hull of f at the four corners: exact for an f monotone in each argument on the box."""
    values = torch.stack(torch.broadcast_tensors(*[f(x, y) for x in a for y in b]))
    return _iv(values.amin(0), values.amax(0))   # (amin and amax give NaN where a corner is NaN)


def _iv_excludes_zero(b):
    return (b[0] > 0) | (b[1] < 0)


def _iv_bin(fn, a, b):
    out = _iv_bin_rounded_as_here(fn, a, b)
    out = _iv_rounded(*out) if fn in _ROUNDED else out
    return out if fn in _TRUTH_OPS else _iv_poisoned(out, a, b)


def _iv_bin_rounded_as_here(fn, a, b):
    (alo, ahi), (blo, bhi) = a, b
    if _exact(a, b) and fn in _EXACT_BIN:
        v = _EXACT_BIN[fn](alo, blo)
        return v, v
    if fn == "add":
        return _iv(alo + blo, ahi + bhi)
    if fn == "sub":
        return _iv(alo - bhi, ahi - blo)
    if fn == "mul":
        return _iv_corners(torch.mul, a, b)
    if fn in ("div", "floordiv"):
        f = torch.div if fn == "div" else (lambda x, y: torch.floor(x / y))
        lo, hi = _iv_corners(f, a, b)
        ok = _iv_excludes_zero(b)
        return torch.where(ok, lo, -math.inf), torch.where(ok, hi, math.inf)
    if fn == "max":
        return torch.maximum(alo, blo), torch.maximum(ahi, bhi)
    if fn == "min":
        return torch.minimum(alo, blo), torch.minimum(ahi, bhi)
    if fn == "mod":
        # a remainder by a positive divisor c: within [0, c); the identity where a fits in one period of c
        ok = blo > 0
        period = torch.floor(alo / blo)
        same = (blo == bhi) & (period == torch.floor(ahi / blo)) & torch.isfinite(alo) & torch.isfinite(ahi)
        # Triton's remainder of a negative integer is negative (C's), torch's is not: allow both
        lo = torch.where(same & (alo >= 0), alo - period * blo, torch.where(alo >= 0, 0.0, -bhi))
        hi = torch.where(same & (alo >= 0), ahi - period * blo, bhi)
        return torch.where(ok, lo, -math.inf), torch.where(ok, hi, math.inf)
    if fn in ("lt", "le", "gt", "ge"):
        if fn in ("gt", "ge"):
            (alo, ahi), (blo, bhi), fn = b, a, {"gt": "lt", "ge": "le"}[fn]
        if fn == "lt":
            return (ahi < blo).double(), (alo < bhi).double()
        return (ahi <= blo).double(), (alo <= bhi).double()
    if fn in ("eq", "ne"):
        always = (alo == ahi) & (blo == bhi) & (alo == blo)
        maybe = (alo <= bhi) & (blo <= ahi)
        return (always.double(), maybe.double()) if fn == "eq" else ((~maybe).double(), (~always).double())
    if fn in ("and", "or"):
        (alo, ahi), (blo, bhi) = _iv_truth(a), _iv_truth(b)
        pick = torch.minimum if fn == "and" else torch.maximum
        return pick(alo, blo), pick(ahi, bhi)
    natural = (alo >= 0) & (blo >= 0) & torch.isfinite(ahi) & torch.isfinite(bhi)
    if fn == "bitand":
        lo, hi = torch.zeros_like(alo + blo), torch.minimum(ahi, bhi)
    elif fn in ("bitor", "bitxor"):
        # below the next power of two of the larger operand
        top = torch.exp2(torch.ceil(torch.log2(torch.maximum(ahi, bhi) + 1))) - 1
        lo = torch.maximum(alo, blo) if fn == "bitor" else torch.zeros_like(top)
        hi = top
    elif fn == "shl":
        lo, hi = alo * torch.exp2(blo), ahi * torch.exp2(bhi)
    elif fn == "shr":
        lo, hi = torch.floor(alo / torch.exp2(bhi)), torch.floor(ahi / torch.exp2(blo))
    else:
        return _iv_top(a, b)
    return _iv(torch.where(natural, lo, -math.inf), torch.where(natural, hi, math.inf))


def _iv_where(c, a, b):
    if _exact(c, a, b):
        v = torch.where(c[0] != 0, a[0], b[0])
        return v, v
    t_lo, t_hi = _iv_truth(c)
    lo = torch.where(t_lo == 1, a[0], torch.where(t_hi == 0, b[0], torch.minimum(a[0], b[0])))
    hi = torch.where(t_lo == 1, a[1], torch.where(t_hi == 0, b[1], torch.maximum(a[1], b[1])))
    return lo, hi


def _iv_cast(dtype, a):
    """Rounding to a narrower float never reverses an order, so the rounded bounds bound the rounded values."""
    dt = _IV_DTYPES[dtype]
    if _exact(a):
        v = a[0].to(dt).double()
        return v, v
    return a[0].to(dt).double(), a[1].to(dt).double()


def _iv_axis_blocks(n, block, pos, ndim, device):
    """The axis in blocks of `block` along dimension `pos`: [start, last index] of each block."""
    start = torch.arange(0, n, block, dtype=torch.float64, device=device)
    shape = [1] * ndim
    shape[pos] = -1
    return start.reshape(shape), torch.clamp(start + block - 1, max=n - 1).reshape(shape)


def _iv_axis_points(n, pos, ndim, device):
    """Every value of the axis, one per element along dimension `pos`."""
    shape = [1] * ndim
    shape[pos] = -1
    v = torch.arange(n, dtype=torch.float64, device=device).reshape(shape)
    return v, v


def _iv_load(t, index, ranged):
    """t read at an interval index, one interval per dimension: the least and greatest element of the box. A
    dimension in `ranged` may span many elements (it depends on a block's rows or keys): one such dimension is
    answered by range-minimum tables along it; with more, those dimensions are reduced whole (wider, still
    sound). The others are exact (one element) and gathered."""
    t = t.double()
    # gathers by torch.take: indexing with a 0-d index tensor reads it on the host, which a CUDA graph capture
    # (the block lists' build) does not allow
    if not ranged and _exact(*index):   # read at exact indices: one gather
        flat, size = 0, 1
        for d in reversed(range(t.dim())):
            flat = flat + torch.clamp(index[d][0], 0, t.shape[d] - 1).long() * size
            size *= t.shape[d]
        v = torch.take(t, torch.as_tensor(flat, device=t.device))   # (a 0-d tensor: no index at all)
        return v, v
    shape = torch.broadcast_shapes(*(x.shape for pair in index for x in pair))
    lows, highs = t, t
    gathered = []   # (dimension, index) of the dimensions left to gather, in order
    wide = [d for d in ranged if d < t.dim()]
    table_dim = wide[0] if len(wide) == 1 else None
    for d in sorted(wide, reverse=True) if table_dim is None else []:
        lows, highs = lows.amin(d, keepdim=True), highs.amax(d, keepdim=True)
    for d in range(t.dim()):
        n = lows.shape[d]
        lo = torch.clamp(index[d][0], 0, n - 1).long()
        hi = torch.clamp(index[d][1], 0, n - 1).long()
        gathered.append((d, lo, hi))
    # flat offsets of the exact dimensions (their low and high bounds agree where they are exact); an index
    # expected to be exact may come out as a range (a bit operation's bounds): there, the whole tensor's least
    # and greatest elements
    strides = [math.prod(lows.shape[d + 1:]) for d in range(t.dim())]
    flat = torch.zeros(shape, dtype=torch.long, device=t.device)
    exact = torch.ones(shape, dtype=torch.bool, device=t.device)
    for d, lo, hi in gathered:
        if d != table_dim:
            flat = flat + lo * strides[d]
            exact = exact & (lo == hi)
    everywhere = (t.amin(), t.amax()) if t.numel() else (t.new_full((), math.inf), t.new_full((), -math.inf))
    if table_dim is None:
        return (torch.where(exact, torch.take(lows, flat), everywhere[0]),
                torch.where(exact, torch.take(highs, flat), everywhere[1]))
    _, lo, hi = gathered[table_dim]
    hi = torch.maximum(hi, lo)
    level = torch.floor(torch.log2((hi - lo + 1).double())).long()
    mins, maxs = _iv_range_tables(lows, table_dim)
    size = lows.numel()
    step = strides[table_dim]
    first = flat + level * size + lo * step
    last = flat + level * size + (hi - (1 << level) + 1) * step
    return (torch.where(exact, torch.minimum(torch.take(mins, first), torch.take(mins, last)), everywhere[0]),
            torch.where(exact, torch.maximum(torch.take(maxs, first), torch.take(maxs, last)), everywhere[1]))


def _iv_range_tables(t, dim):
    """Sparse tables along `dim`: level k holds the least (greatest) of the 2^k elements from each position."""
    n = t.shape[dim]
    mins, maxs = [t], [t]
    width = 1
    while 2 * width <= n:
        lo, hi = mins[-1], maxs[-1]
        tail = n - width
        pad_shape = list(t.shape)
        pad_shape[dim] = width
        # positions whose window would run past the end are never queried at this level
        mins.append(torch.cat([torch.minimum(lo.narrow(dim, 0, tail), lo.narrow(dim, width, tail)),
                               t.new_full(pad_shape, math.inf)], dim))
        maxs.append(torch.cat([torch.maximum(hi.narrow(dim, 0, tail), hi.narrow(dim, width, tail)),
                               t.new_full(pad_shape, -math.inf)], dim))
        width *= 2
    return torch.stack(mins), torch.stack(maxs)


def _iv_classes(pred, shape, n_keys, block_keys, key_pos):
    """Each block's class: 0 no element kept, 2 every element kept and the key block whole, 1 otherwise."""
    always, maybe = _iv_truth(pred)
    starts = torch.arange(0, n_keys, block_keys, device=always.device)
    key_shape = [1] * len(shape)
    key_shape[key_pos] = -1
    whole = (starts + block_keys <= n_keys).reshape(key_shape)
    cls = torch.where(maybe == 0, 0, torch.where((always == 1) & whole, 2, 1))
    return torch.broadcast_to(cls, shape).to(torch.int8)


def _block_lists(cls):
    """Per (program's table entry, row block): the partial key blocks, then the full ones, as
    [count, block indices ascending...] rows of int32 (a [entries, 2, key blocks + 1] block), followed by the
    row blocks in order of decreasing work summed over the entries (the order programs start in, so the
    longest run first and the last wave is short), then whether that work is skewed, then the numbers of
    partial and of full blocks in all the lists, flat."""
    n_rb, n_kb = cls.shape[-2], cls.shape[-1]
    cls = cls.flatten(0, -2)   # (not reshape(-1, n_kb): no key blocks at all is a size, e.g. an empty KV shard)
    out = torch.zeros(cls.shape[0], 2, n_kb + 1, dtype=torch.int32, device=cls.device)
    for slot, kind in ((0, 1), (1, 2)):
        hit = cls == kind
        out[:, slot, 0] = hit.sum(-1, dtype=torch.int32)
        out[:, slot, 1:] = torch.sort((~hit).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    work = (out[:, 0, 0] + out[:, 1, 0]).reshape(-1, n_rb).sum(0)
    order = torch.sort(-work, stable=True).indices.to(torch.int32)
    # last: 1 where a few row blocks hold most of the work (global tokens: their row sees every key)
    skewed = (work.max() > 4 * work.float().mean()).to(torch.int32).reshape(1) if work.numel() else \
        torch.zeros(1, dtype=torch.int32, device=cls.device)
    totals = out[:, :, 0].sum(0, dtype=torch.int32)
    return torch.cat([out.reshape(-1), order, skewed, totals])
