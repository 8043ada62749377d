"""Block tables of listed masks at run time, copied into each generated module with launch.py: the lists of
partial and full key blocks each row block visits (built by the module's builders, codegen/intervals.py),
kept per sizes when the mask reads positions only, rebuilt from the tensors it reads otherwise, on the GPU as
one replayed CUDA graph."""
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


_GRAPHS = {}   # (builder, sizes, the tensors' layouts) -> (CUDA graph, its input copies, its table)


def _derived_table(build, consts, *tensors):
    """build(*consts, *tensors), kept while those same tensors live unwritten (torch counts every in-place
    write in a tensor's version; a write torch does not see, such as a custom kernel's, must bump it)."""
    device = tensors[0].device
    key = (build, *consts, *((t.shape, t.stride(), t.dtype, device) for t in tensors))
    seen = _SEEN.get(key)
    if seen is not None and all(ref() is t and t._version == version for (ref, version), t in zip(seen[0], tensors)):
        return seen[1]   # the same tensors, not written to since (torch counts every in-place write)
    table = _build_table(key, build, consts, tensors)
    _SEEN[key] = ([(weakref.ref(t), t._version) for t in tensors], table)
    return table


_SEEN = {}   # the _GRAPHS key -> (weak refs to the tensors of the last build, their versions), its table


def _build_table(key, build, consts, tensors):
    """On the GPU the build's few dozen small operations run as one CUDA graph, captured on the first call and
    replayed on copies of the tensors: the table of a call is ready before the kernel of the same stream
    reads it, and the next build on that stream overwrites it only after."""
    device = tensors[0].device
    if device.type != "cuda" or _warming():   # a warm pass on another thread must not capture
        return build(*consts, *tensors)
    entry = _GRAPHS.get(key)
    if entry is None:
        inputs = [t.clone() for t in tensors]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):   # once outside the capture: lazy initializations do not belong in it
            build(*consts, *inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread-local: CUDA calls of other threads (NCCL's watchdog in a distributed job, a kernel compiling in
        # the background) must not invalidate this capture, as they did in the default global mode
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            table = build(*consts, *inputs)
        entry = _GRAPHS[key] = (graph, inputs, table)
    graph, inputs, table = entry
    for copy, t in zip(inputs, tensors):
        copy.copy_(t)
    graph.replay()
    return table
