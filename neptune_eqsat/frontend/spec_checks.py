"""Checks of a spec beyond one expression's types: extents, whether an index can be fractional, and whether every
run-time size the computation runs over is a size some input carries (a call learns sizes from its inputs)."""
from __future__ import annotations

import keyword

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.ir import ops


def extent_problem(value, dim_type, kinds: str = "an int or a Dim") -> str | None:
    """Why `value` is not an extent (an int of at least 1, or a `dim_type`), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, dim_type)):
        return f"must be {kinds}, got {value!r}"
    return f"must be at least 1, got {value}" if isinstance(value, int) and value < 1 else None


def fractional_part(t: Term) -> Term | None:
    """The part of an index term that can take a value that is not a whole number (a fraction, a true
    division, exp of an integer), or None: indices are positions. A floating-point input read as an index
    holds whole numbers (a label kept as a float, as the shipped cross-entropy specs keep it)."""
    if t.op == "const":
        return None if float(t.attrs[0]).is_integer() else t
    if t.op in ("load", "cast"):
        return None
    if t.op == "un":
        if t.attrs[0] in ("floor", "ceil", "round", "trunc"):
            return None
        if not ops.UN[t.attrs[0]].keeps_integer:
            return t
    if t.op == "bin":
        if t.attrs[0] == "floordiv" or t.attrs[0] in ir.LOGIC or ops.BIN[t.attrs[0]].group == "compare":
            return None
        if t.attrs[0] == "div":
            return t
    args = t.args[1:] if t.op == "where" else t.args   # a where's condition is a truth value, not the index
    return next((f for f in map(fractional_part, args) if f is not None), None)


def size_of_no_input(spec) -> tuple[str, str | None] | None:
    """(what is wrong, the spec line or None) where the computation runs over a run-time size that no input's
    shape carries (an axis over it reduced or written, or the size read as a value), else None."""
    def name(extent):   # a Dim's name; None for a fixed extent
        return None if isinstance(extent, int) else extent.name
    carried = {name(e) for t in spec.inputs.values() for e in t.shape} - {None} | set(spec.derived)
    used_axes = set(spec.output_axes) | {a for o in spec.also for a in o.axes}
    for t in ir.walk(spec.root_term):
        if ir.is_reduction(t):
            used_axes.add(t.attrs[1])
        if t.op == "dim" and t.attrs[0] not in carried:
            return (f"size {t.attrs[0]} is the size of no input's dimension, so a call cannot know it (declare an "
                    f"input with it in its shape)", t.origin)
    for ax in sorted(used_axes):
        size = name(spec.axes_.get(ax, 1))
        if size is not None and size not in carried:
            return (f"axis {ax} runs over {size}, the size of no input's dimension, so a call cannot know it "
                    f"(declare the inputs with {size} in their shape, or give axis {ax} a fixed extent)", None)
    return None


def unknown_dims(spec, names) -> str | None:
    """What is wrong where sizes are given for `names` that are not all dims of the spec, else None."""
    unknown = [n for n in names if n not in spec.dims_]
    if not unknown:
        return None
    return f"unknown dim {', '.join(unknown)}; spec {spec.name} has dims {', '.join(spec.dims_) or '(none)'}"


def misnamed(spec) -> str | None:
    """What is wrong with a name the spec chose (the spec's, a dim's, an axis's, an input's, an output's), else
    None: each becomes a name in the generated module (a parameter, a kernel's name), so it must be a Python
    identifier other than a keyword."""
    named = [("spec", spec.name), *(("dim", n) for n in spec.dims_), *(("axis", n) for n in spec.axes_),
             *(("input", n) for n in spec.inputs), ("output", spec.output_name),
             *(("output", o.name) for o in spec.also)]
    for kind, name in named:
        if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
            return (f"{kind} {name!r} is not a name a generated module can use: names are Python identifiers "
                    f"(letters, digits and _, not starting with a digit) other than keywords")
    return None
