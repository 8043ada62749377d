"""Layout rewrite: pack the query heads that share a kv head into the rows of one tile (grouped-query).

When every key-side load reads head h only as h // G, the G heads of a group read the same keys and values.
Renaming the axes  h = hk * G + g  and putting the rows (i, g) of one group into one row axis r = i * G + g
makes the key loads independent of r: each program reads a key block once for the whole group instead of
once per head. The rewrite is an exact change of variables (the term is unchanged up to renaming), so no
proof is needed beyond the index identity (hk * G + g) // G = hk for 0 <= g < G, which it relies on.
Rows stay ordered by query position (i = r // G), so masks linear in i still give key bounds.
"""
from __future__ import annotations

from dataclasses import replace

from neptune_eqsat import ir
from neptune_eqsat.ir import Term
from neptune_eqsat.frontend.spec import Dim, Spec


def group_reads(term: Term, loop: str) -> list[tuple[str, int]]:
    """(head axis, group size) pairs: axes read as axis // G by every load that varies along the loop axis,
    and in no other way there."""
    found = []
    for t in ir.walk(term):
        if t.op == "bin" and t.attrs[0] == "floordiv" and t.args[0].op == "axis" and t.args[1].op == "const":
            g = int(t.args[1].attrs[0])
            if g > 1 and (t.args[0].attrs[0], g) not in found:
                found.append((t.args[0].attrs[0], g))
    out = []
    loads = [t for t in ir.walk(term) if t.op == "load" and loop in t.free]
    for h, g in found:
        grouped = ir.bin("floordiv", ir.axis(h), ir.const(g))
        hidden = [ir.substitute(x, {grouped: ir.const(0)}) for x in loads]
        if all(h not in x.free for x in hidden) and any(h in x.free for x in loads):
            out.append((h, g))
    return out


def pack_group_rows(spec: Spec, term: Term, row: str, loop: str) -> tuple[Spec, Term] | None:
    """The spec and term with rows (row, g) of each head group packed into one row axis, or None."""
    bound = {t.attrs[1] for t in ir.walk(term) if ir.is_reduction(t)}   # an axis a reduction rebinds keeps its name
    pairs = [(h, g) for h, g in group_reads(term, loop) if h in spec.output_axes and isinstance(spec.extent(h), int)
             and spec.extent(h) % g == 0 and h != row and not {h, row} & bound]
    if not pairs or row is None:
        return None
    h, g = pairs[0]
    hk, r = f"{h}_group", f"{row}_{h}"
    row_ext = spec.extent(row)
    if isinstance(row_ext, int):
        r_ext = row_ext * g
    else:
        r_ext = Dim(f"{row.upper()}_{h.upper()}_ROWS")
    rows_of_i = ir.bin("floordiv", ir.axis(r), ir.const(g))
    head = ir.bin("add", ir.bin("mul", ir.axis(hk), ir.const(g)), ir.bin("mod", ir.axis(r), ir.const(g)))
    mapping = {ir.bin("floordiv", ir.axis(h), ir.const(g)): ir.axis(hk), ir.axis(h): head, ir.axis(row): rows_of_i}
    packed = ir.substitute(term, mapping)
    axes = {}
    for a, e in spec.axes_.items():   # the new axes take the places of the old ones
        if a == h:
            axes[hk] = spec.extent(h) // g
        elif a == row:
            axes[r] = r_ext
        else:
            axes[a] = e
    out_axes = tuple(hk if a == h else r if a == row else a for a in spec.output_axes)
    index = tuple(ir.substitute(ir.axis(a), mapping) for a in spec.output_axes)
    dims = dict(spec.dims_)
    derived = dict(spec.derived)
    if isinstance(r_ext, Dim):
        dims[r_ext.name] = r_ext
        derived[r_ext.name] = (g, row_ext.name)
    typical = {**spec.typical, **({r_ext.name: g * spec.typical.get(row_ext.name, 1)} if isinstance(r_ext, Dim)
                                  else {})}
    new = replace(spec, name=spec.name, dims_=dims, typical=typical, axes_=axes, output_term=packed,
                  output_axes=out_axes, output_index=index,
                  output_shape=tuple(spec.extent(a) for a in spec.output_axes), derived=derived)
    return new, packed
