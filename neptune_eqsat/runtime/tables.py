"""Block tables of listed masks at run time, copied into each generated module with launch.py: the lists of
partial and full key blocks each row block visits, kept per sizes when the mask reads positions only (built
by torch operations, codegen/intervals.py), rebuilt by one kernel from the tensors it reads otherwise, when
they change (codegen/block_kernel.py)."""
import functools
import weakref

import torch

from neptune_eqsat.runtime.ahead import _warming

# ---- copied into every generated module from here on
_TABLES = {}   # (builder, block sizes, sizes, device) -> (block table of a predicate of positions only, skewed)


def _block_table(rec, build, consts, tensors):
    """The key blocks each row block visits, and whether a few row blocks hold most of the work (None where it is
    not read): built once per sizes when the mask reads positions only (reading the flag then is the only wait
    for the GPU it costs), and again whenever the tensors it reads change."""
    if not tensors:
        key = (build, *consts)
        hit = _TABLES.get(key)
        if hit is None:
            if len(_TABLES) > 256:
                _TABLES.clear()
            t = build(*consts)
            hit = _TABLES[key] = (t, bool(t[-1].item()))
        return (rec.constant(hit[0]) if rec is not None else hit[0]), hit[1]
    rebuild = functools.partial(_derived_table, build, consts)
    t = rebuild(*tensors)
    return (rec.derived(rebuild, tensors, t) if rec is not None else t), None


def _row_order(skewed, cfg, config):
    """The row order of a listed mask's programs: the config's where it names one; across heads (2) where a
    few row blocks hold most of the work, so they start first in every head; else the default."""
    if config and "ROW_ORDER" in config or not skewed:
        return cfg["ROW_ORDER"]
    return 2


def _derived_table(build, consts, *tensors):
    """build(*consts, *tensors), kept while those same tensors live unwritten (torch counts every in-place
    write in a tensor's version; a write torch does not see, such as a custom kernel's, must bump it)."""
    device = tensors[0].device
    key = (build, *consts, *((t.shape, t.stride(), t.dtype, device) for t in tensors))
    seen = _SEEN.get(key)
    if seen is not None and all(ref() is t and t._version == version for (ref, version), t in zip(seen[0], tensors)):
        return seen[1]   # the same tensors, not written to since (torch counts every in-place write)
    table = build(*consts, *tensors)   # one kernel (codegen/block_kernel.py)
    if _warming():   # a warm pass only compiles it: nothing was built
        return table
    _SEEN[key] = ([(weakref.ref(t), t._version) for t in tensors], table)
    return table


# (builder, sizes, the tensors' layouts) -> (weak refs to the tensors of the last build, their versions), its table
_SEEN = {}
