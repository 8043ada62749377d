"""Launcher lines that refuse a call whose sizes would make a kernel read outside an input.

A kernel reads `x[r, j + 1]` with no bound check of its own: where the extents are sizes given at run time the
spec cannot be checked when it is compiled (an index into a fixed extent is, frontend/spec.py), so each call
checks them, from its sizes, before it launches. An index computed from positions and sizes alone is bounded
by interval arithmetic over its axes; the check is emitted only where those intervals are exact (every axis
read once, through operations that attain their bounds: sums, constant multiples, min, max, constant
divisions and remainders, abs), so an index it reports out of range does leave the input at these sizes, and
a call it lets through reads inside. Indices that read an input's values (`offsets[doc[i]]`) depend on those
values: FlexAttention calls check them (frontend/bounds.py), exactly, per call.
"""
from __future__ import annotations

import textwrap
from collections import Counter

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.spec import SpecError


def _ext_code(ext) -> str:
    return str(ext) if isinstance(ext, int) else ext.name


def _interval(spec, t: Term) -> tuple[str, str] | None:
    """Python expressions over the sizes for the least and the greatest value of t, or None where the
    interval would not be exact."""
    op, at, ar = t.op, t.attrs, t.args
    if op == "axis":
        return "0", f"({_ext_code(spec.extent(at[0]))} - 1)"
    if op == "dim":
        return at[0], at[0]
    if op == "const":
        return repr(at[0]), repr(at[0])
    if op == "cast":
        return _interval(spec, ar[0])
    subs = [_interval(spec, a) for a in ar]
    if None in subs:
        return None
    if op == "un" and at[0] == "neg":
        (lo, hi), = subs
        return f"(-{hi})", f"(-{lo})"
    if op == "un" and at[0] == "abs":
        (lo, hi), = subs
        return f"(0 if {lo} <= 0 <= {hi} else min(abs({lo}), abs({hi})))", f"max(abs({lo}), abs({hi}))"
    if op != "bin":
        return None
    fn, ((alo, ahi), (blo, bhi)) = at[0], subs
    if fn == "add":
        return f"({alo} + {blo})", f"({ahi} + {bhi})"
    if fn == "sub":
        return f"({alo} - {bhi})", f"({ahi} - {blo})"
    if fn in ("min", "max"):
        return f"{fn}({alo}, {blo})", f"{fn}({ahi}, {bhi})"
    const = ar[1].attrs[0] if ar[1].op == "const" else None
    if fn == "mul" and (ar[0].op == "const" or const is not None):
        c, (lo, hi) = (const, (alo, ahi)) if const is not None else (ar[0].attrs[0], (blo, bhi))
        return (f"({c!r} * {lo})", f"({c!r} * {hi})") if c >= 0 else (f"({c!r} * {hi})", f"({c!r} * {lo})")
    if fn in ("floordiv", "mod") and const is not None and const > 0:
        c = repr(const)
        if fn == "floordiv":
            return f"math.floor({alo} / {c})", f"math.floor({ahi} / {c})"
        same = f"math.floor({alo} / {c}) == math.floor({ahi} / {c})"   # within one period: no wrap
        if not _unit_step(ar[0]):   # a wrap then leaves gaps ((3 j) % 6 takes 0 and 3): no exact bounds
            return None
        return f"({alo} % {c} if {same} else 0)", f"({ahi} % {c} if {same} else {c} - 1)"
    return None


def _unit_step(t: Term) -> bool:
    """Does t take every integer between its bounds (an axis shifted by constants and sizes, or negated)?"""
    if t.op == "axis":
        return True
    if t.op == "un" and t.attrs[0] == "neg" or t.op == "cast":
        return _unit_step(t.args[0])
    if t.op == "bin" and t.attrs[0] in ("add", "sub"):
        a, b = t.args
        if b.op in ("const", "dim"):
            return _unit_step(a)
        if a.op in ("const", "dim"):
            return _unit_step(b)
    return False


def _exact(t: Term) -> bool:
    """Is every axis read once in t (so independent intervals attain their bounds together)?"""
    counts = Counter(x.attrs[0] for x in _leaves(t) if x.op == "axis")
    return all(n == 1 for n in counts.values())


def _leaves(t: Term):
    """Every leaf of t, once per occurrence (ir.walk visits a shared subterm once)."""
    if not t.args:
        yield t
    for a in t.args:
        yield from _leaves(a)


def guard_lines(spec) -> tuple[list[str], list[str]]:
    """Launcher lines (after the sizes are read) raising IndexError where an index of positions and sizes leaves
    its input's dimension at the call's sizes; the sizes they read."""
    lines, dims, seen = [], [], set()
    for t in ir.walk(spec.root_term):
        if t.op != "load" or t.attrs[0] not in spec.inputs:
            continue
        shape = spec.inputs[t.attrs[0]].shape
        for pos, idx in enumerate(t.args):
            if idx.op == "axis" and spec.extent(idx.attrs[0]) == shape[pos] or (t.attrs[0], pos, idx) in seen:
                continue
            seen.add((t.attrs[0], pos, idx))
            if any(x.op == "load" for x in ir.walk(idx)) or not _exact(idx):
                continue
            bounds = _interval(spec, idx)
            if bounds is None:
                continue
            used = [d.attrs[0] for d in ir.walk(idx) if d.op == "dim"] + \
                [spec.extent(a).name for a in idx.free if not isinstance(spec.extent(a), int)]
            if not used and isinstance(shape[pos], int):
                continue   # fixed sizes only: checked when the spec was written
            dims += used + ([] if isinstance(shape[pos], int) else [shape[pos].name])
            what = f"{t.attrs[0]}: dimension {pos} is read at index {ir.show(idx)}"
            lines += [f"    _lo, _hi, _n = {bounds[0]}, {bounds[1]}, {_ext_code(shape[pos])}",
                      "    if _lo < 0 or _hi >= _n:",
                      f"        raise IndexError({what!r} + f', which runs from {{_lo:g}} to {{_hi:g}} at these sizes, "
                      f"outside the {{_n}} it has')"]
    return lines, list(dict.fromkeys(dims))


# ---- index terms as torch code on the host ---------------------------------------------------------------------
# The module-level helpers the code calls, and the names it reads: `t` (input name -> tensor), `sizes` (size name
# -> value) and `dev`. A standalone module's backward scatters gradients at such indices (backward_module.py);
# a launcher checks the indices read from an input's values with it (data_guard_lines).
INDEX_HELPERS = textwrap.dedent('''
    def _ar(n, pos, rank, dev):
        shape = [1] * rank
        shape[pos] = n
        return torch.arange(n, device=dev).view(shape)


    def _num(x, dev):
        return torch.tensor(x, device=dev)
    ''').strip()
_INFIX = {"add": "+", "sub": "-", "mul": "*", "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}
# comparisons and logic give 0 or 1 as int64, as the kernels take a truth value in arithmetic (torch adds two
# bools as a logical or), and logic reads any nonzero number as true (not its bits)
_CALL = {"floordiv": "torch.div({}, {}, rounding_mode='floor')", "mod": "torch.remainder({}, {})",
         "max": "torch.maximum({}, {})", "min": "torch.minimum({}, {})",
         "lt": "({} < {}).long()", "le": "({} <= {}).long()", "gt": "({} > {}).long()", "ge": "({} >= {}).long()",
         "eq": "({} == {}).long()", "ne": "({} != {}).long()",
         "and": "(({} != 0) & ({} != 0)).long()", "or": "(({} != 0) | ({} != 0)).long()"}


def index_code(t: Term, axes: tuple[str, ...], spec) -> str:
    """A torch expression for the index term t, broadcast over `axes` (a tensor of int64 values)."""
    op, at, ar = t.op, t.attrs, t.args
    if op == "axis":
        return f"_ar({_extent(spec, at[0])}, {axes.index(at[0])}, {len(axes)}, dev)"
    if op == "dim":
        return f"_num(sizes[{at[0]!r}], dev)"
    if op == "const":
        return f"_num({int(at[0]) if at[0] == int(at[0]) else at[0]!r}, dev)"
    if op == "load":
        if len(ar) == 1 and ar[0].op == "axis" and axes == ar[0].attrs \
                and spec.extent(axes[0]) == spec.inputs[at[0]].shape[0]:
            return f"t[{at[0]!r}].long()"   # a vector read along its own axis, over that axis: its values
        index = ", ".join(f"{index_code(a, axes, spec)}.long()" for a in ar)
        return f"t[{at[0]!r}][({index},)].long()"
    if op == "un" and at[0] in ("neg", "abs"):
        inner = index_code(ar[0], axes, spec)
        return f"(-{inner})" if at[0] == "neg" else f"{inner}.abs()"
    if op == "bin" and at[0] in _INFIX:
        return f"({index_code(ar[0], axes, spec)} {_INFIX[at[0]]} {index_code(ar[1], axes, spec)})"
    if op == "bin" and at[0] in _CALL:
        return _CALL[at[0]].format(*(index_code(a, axes, spec) for a in ar))
    if op == "where":
        return "torch.where({} != 0, {}, {})".format(*(index_code(a, axes, spec) for a in ar))
    if op == "cast":
        return index_code(ar[0], axes, spec)
    raise SpecError(f"spec {spec.name}: the index {ir.show(t)} of a gradient has no host form in a standalone "
                    f"module ({op} {at})")


def _extent(spec, ax: str) -> str:
    ext = spec.axes_[ax]
    return str(ext) if isinstance(ext, int) else f"sizes[{ext.name!r}]"


# ---- indices that read an input's values ------------------------------------------------------------------------
# `x[r, t[r]]` (a label per row) reads inside x only where t's values do: each call checks them exactly, before
# it replays or launches anything, unless t's storage and version are those of the last call it checked: on the
# CPU raising IndexError, on a GPU by a device-side assertion, as torch checks the labels of its cross-entropy
# (waiting for the values would stall every call that writes new labels). A read
# inside a where's branch is left to the where (`where(t[r] == -100, 0, ... x[r, t[r]])` guards it), as is an
# index of more than one axis (checking it would cost the kernel's own work). FlexAttention's captured tensors
# are checked by its front end, which knows the call's lengths.
def _unguarded_loads(root: Term) -> set[Term]:
    """The loads some path from the root reaches through no where's branch (through its condition it may)."""
    out: set[Term] = set()
    seen: set[Term] = set()

    def go(t: Term) -> None:
        if t in seen:
            return
        seen.add(t)
        if t.op == "load":
            out.add(t)
        for k, a in enumerate(t.args):
            if not (t.op == "where" and k > 0):
                go(a)
    go(root)
    return out


def _guarded_loads(root: Term) -> dict[Term, set[tuple]]:
    """Loads under where's branches, each with the guards of the paths that reach it: a tuple of (condition,
    branch) pairs, branch True where the load is read when the condition holds (ignore_index's where(t == -100,
    0, x[r, t[r]]) reads x only where t != -100)."""
    out: dict[Term, set[tuple]] = {}
    seen: set[tuple] = set()   # (term, guards) walked: a value reused at every level is walked once a guard set

    def go(t: Term, guards: tuple) -> None:
        if (t, guards) in seen or len(seen) > 100_000 or len(out) > 256:
            return
        seen.add((t, guards))
        if t.op == "load" and guards:
            out.setdefault(t, set()).add(guards)
        for k, a in enumerate(t.args):
            go(a, guards + (((t.args[0], k == 1),) if t.op == "where" and k > 0 else ()))
    go(root, ())
    return out


def _size_code(spec, ext) -> str | None:
    """An extent as the launcher reads it from the inputs' shapes (before any size is bound)."""
    if isinstance(ext, int):
        return str(ext)
    for name, tensor in spec.inputs.items():
        if ext in tensor.shape:
            return f"{name}.shape[{tensor.shape.index(ext)}]"
    return None


def data_guard_lines(spec) -> list[str]:
    """forward's first lines: IndexError where an index that reads an input's values leaves its dimension."""
    lines, seen = [], set()
    unguarded = _unguarded_loads(spec.root_term)
    guarded = _guarded_loads(spec.root_term)
    for t in ir.walk(spec.root_term):   # children first: an index's own reads are checked before it is
        if t.op != "load" or t.attrs[0] not in spec.inputs or (t not in unguarded and t not in guarded):
            continue
        paths = [()] if t in unguarded else sorted(guarded[t], key=repr)
        shape = spec.inputs[t.attrs[0]].shape
        for pos, idx in enumerate(t.args):
            reads = sorted({x.attrs[0] for x in ir.walk(idx) if x.op == "load"})
            if not reads or len(idx.free) > 1 or (t.attrs[0], pos, idx) in seen:
                continue
            if any(spec.inputs[r].source != f"input {r}" for r in reads):
                continue   # a tensor a front end describes (a traced callable's capture): it checks the call
            seen.add((t.attrs[0], pos, idx))
            try:
                code = index_code(idx, tuple(idx.free), spec)
                # under guards: the positions where some path reads it (a path whose guard reads other axes is
                # left unchecked, as a read it cannot place)
                kept = [" & ".join(f"(({index_code(c, tuple(idx.free), spec)}) {'!=' if taken else '=='} 0)"
                                   for c, taken in path) or "True" for path in paths
                        if all(set(c.free) <= set(idx.free) for c, _ in path)]
            except SpecError:   # an operation the host form lacks: the kernel still holds it inside (loads.py)
                continue
            if not kept:
                continue
            if "True" not in kept:
                code = f"(lambda c, m: c[m.expand_as(c)])({code}, {' | '.join(f'({k})' for k in kept)})"
            dims = [spec.dims_.get(d.attrs[0]) for d in ir.walk(idx) if d.op == "dim"]
            used = {spec.extent(a) for a in idx.free} | set(dims)
            sizes = {d.name: _size_code(spec, d) for d in used if d is not None and not isinstance(d, int)}
            n = _size_code(spec, shape[pos])
            if n is None or None in dims or None in sizes.values():   # a size no input's shape gives
                continue
            env = (f"{{{', '.join(f'{r!r}: {r}' for r in reads)}}}, "
                   f"{{{', '.join(f'{d!r}: {c}' for d, c in sizes.items())}}}, {reads[0]}.device")
            key = ", ".join(f"({r}.data_ptr(), {r}._version, tuple({r}.shape))" for r in reads)
            what = f"{t.attrs[0]}: dimension {pos} is read at index {ir.show(idx)}"
            inference = " or ".join(f"{r}.is_inference()" for r in reads)   # no version counter: never kept
            lines += [f"    _read = None if {inference} else ({key},)",
                      f"    if _read is None or forward.__dict__.get({what!r}) != _read:"]
            for r in (r for r in reads if spec.inputs[r].dtype in ir.FLOAT_DTYPES):   # labels kept as floats
                whole = f"{what}: {r} holds values that are not whole numbers, or NaN (an index is a position)"
                lines += [f"        if {r}.is_cuda:",
                          f"            torch._assert_async(({r} == {r}.floor()).all(), {whole!r})",
                          f"        elif ({r} != {r}.floor()).any():",
                          f"            raise IndexError({whole!r})"]
            lines += [f"        _ix = (lambda t, sizes, dev: {code})({env}).reshape(-1)",   # names of its own
                      "        if _ix.is_cuda:",   # checked on the GPU, as torch checks its gathers: no wait
                      f"            torch._assert_async(((_ix >= 0) & (_ix < {n})).all(), {what + ' leaves the tensor'!r})",
                      "        elif _ix.numel():",
                      "            _lo, _hi = (int(v) for v in torch.aminmax(_ix))",
                      f"            if _lo < 0 or _hi >= {n}:",
                      f"                raise IndexError({what!r} + f', which takes values {{_lo}} to {{_hi}}, outside the "
                      f"{{{n}}} it has')"]
            lines += [f"        forward.__dict__[{what!r}] = _read"]
    return lines
