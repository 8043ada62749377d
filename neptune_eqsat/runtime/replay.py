"""Record and replay, copied into each generated module with launch.py (the modules import only torch and
triton).

Triton's per-call argument binding and specialization costs tens of microseconds, more than a short decode
kernel runs. On the GPU a call is therefore recorded the second time its signature is seen (shapes, strides,
dtypes, 16-byte alignment, device; a decode cache that grows every call never repeats one, and recording costs
more than a launch): the compiled kernels, their grids and integer arguments are the same for every call with
that signature, so later calls replay the launches with only the tensors changed. What is the same for every
call on a stream (ticket counters, constant tables, workspaces as views of the stream's arenas) is bound once
per stream; a call allocates its outputs and launches.
"""
import math

import torch
import triton

from neptune_eqsat.runtime.descriptors import _is_descriptor, _redescribe

# ---- copied into every generated module from here on
_REPLAYS = {}    # signature of the inputs -> (replay of the recorded launches, Futures that make it stale)
_SEEN_ONCE = {}  # signatures called once, not recorded yet
_MAX_REPLAYS = 1024   # the most of either kept, least recently used dropped first


def _replay(key):
    """The replay recorded for a call like this one; None where there is none, or where a kernel the recorded
    call did not take (compiling then, in the background) is ready now: the call is then run and recorded again."""
    entry = _REPLAYS.pop(key, None)
    if entry is None:
        return None
    replay, stale_when = entry
    if any(f.done() for f in stale_when):
        return None
    _REPLAYS[key] = entry   # the most recently used last
    return replay


def _recorded_when_seen_before(rec, key):
    """The recording of a call whose signature was seen before, else None: recording costs more host time than
    the call's launches, and a decode cache that grows by a token a call never repeats its signature."""
    if _SEEN_ONCE.pop(key, None) is not None:
        return rec
    while len(_SEEN_ONCE) >= _MAX_REPLAYS:
        _SEEN_ONCE.pop(next(iter(_SEEN_ONCE)))
    _SEEN_ONCE[key] = True
    return None


def _keep_replay(key, replay, stale_when):
    """Keep a call's replay, dropping the least recently used beyond _MAX_REPLAYS (a decode cache that grows
    by a token a call has a new signature every call)."""
    while len(_REPLAYS) >= _MAX_REPLAYS:
        _REPLAYS.pop(next(iter(_REPLAYS)))
    _REPLAYS[key] = (replay, stale_when)


def _signature(*tensors):
    return tuple((t.shape, t.stride(), t.dtype, t.data_ptr() % 16, t.device) for t in tensors)


def _replay_enabled():
    return getattr(triton, "knobs", None) is not None


def _run(compiled, grid, stream, args):
    """Launch a compiled kernel the way Triton does, including its launch hooks when a profiler set them (an
    empty chain of hooks is passed as none: building the launch's metadata for it costs microseconds)."""
    hooks = triton.knobs.runtime
    enter, leave = _hook(hooks.launch_enter_hook), _hook(hooks.launch_exit_hook)
    meta = compiled.launch_metadata(grid, stream, *args) if enter is not None else None
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, meta, enter,
                 leave, *args)


def _hook(chain):
    """A launch hook, or None where it is a chain of no hooks."""
    return None if getattr(chain, "calls", True) == [] else chain


class _Recording:
    """The allocations and launches of one GPU call, for replay."""

    def __init__(self, inputs):
        self.buffers, self.allocs, self.launches = list(inputs), [], []

    def empty(self, shape, dtype, device, kind="empty"):
        """A buffer each replay allocates again: uninitialized, or with kind "zeros" (one the kernels add into)."""
        t = _NEW[kind](shape, device=device, dtype=dtype)
        self.buffers.append(t)
        self.allocs.append((kind, (shape, dtype)))
        return t

    def tickets(self, t, count):
        self.buffers.append(t)
        self.allocs.append(("tickets", count))
        return t

    def constant(self, t):
        """A tensor every replay reads as it is (a block table of the sizes only)."""
        self.buffers.append(t)
        self.allocs.append(("constant", t))
        return t

    def derived(self, build, tensors, t):
        """A tensor each replay builds again, as build(*tensors), from the call's tensors (a block table of
        their values)."""
        slots = tuple(next(n for n, b in enumerate(self.buffers) if b is x) for x in tensors)
        self.buffers.append(t)
        self.allocs.append(("derived", (build, slots)))
        return t

    def launched(self, compiled, grid, args, constexprs):
        """Keep the launch as its argument list with the places of its tensors and tensor descriptors, the
        buffers they come from and the descriptors' block shapes (None for a bare tensor)."""
        template = list(args) + list(constexprs)
        tensors = []
        for pos, a in enumerate(args):
            described = _is_descriptor(a)
            if described or isinstance(a, torch.Tensor):
                base = a.base if described else a
                slot = next(n for n, b in enumerate(self.buffers) if b is base)
                tensors.append((pos, slot, (list(a.block_shape), getattr(a, "layout", None)) if described else None))
                template[pos] = None
        self.launches.append((compiled, grid, template, tuple(tensors)))

    def replay(self, device, out):
        """A function of the inputs that allocates and launches as recorded; it returns the buffer(s) `out`
        was (a tensor, or a tuple of a kernel's outputs). What is the same for every call on a stream (the
        ticket counters, constant tables, and workspaces that are not returned and take at most _KEEP_BYTES,
        views of the stream's arenas) is bound once per stream, with the launch arguments that read it; a call
        fills in the rest. Calls captured in a CUDA graph get workspaces of their own."""
        n_inputs = len(self.buffers) - len(self.allocs)
        out_slots = [next(n for n, b in enumerate(self.buffers) if b is o) for o in (out if isinstance(out, tuple)
                                                                                 else (out,))]
        fixed = {n_inputs + n for n, (kind, what) in enumerate(self.allocs)
                 if kind in ("tickets", "constant")
                 or kind == "empty" and n_inputs + n not in out_slots and _nbytes(*what) <= _KEEP_BYTES}
        per_call = [(n_inputs + n, kind, what) for n, (kind, what) in enumerate(self.allocs)
                    if n_inputs + n not in fixed]
        allocs, launches, bound = self.allocs, self.launches, {}

        def bind(stream, captured):
            bufs, ordinal = {}, 0
            for slot, (kind, what) in enumerate(allocs, n_inputs):
                if slot not in fixed:
                    continue
                if kind == "tickets":
                    bufs[slot] = _ticket_buffer(device, stream, what)
                elif kind == "constant":
                    bufs[slot] = what
                else:
                    bufs[slot] = (torch.empty(what[0], device=device, dtype=what[1]) if captured
                                  else _workspace(device, stream, ordinal, *what))
                    ordinal += 1
            calls = []
            for compiled, grid, template, tensors in launches:
                args = template.copy()
                for pos, slot, described in tensors:
                    if slot in fixed:
                        args[pos] = bufs[slot] if described is None else _redescribe(bufs[slot], *described)
                calls.append((compiled, grid, args, [t for t in tensors if t[1] not in fixed]))
            return calls

        def replay(*inputs):
            stream = _current_stream(device)
            if _capturing(device):
                calls = bind(stream, captured=True)
            else:
                calls = bound.get(stream) or bound.setdefault(stream, bind(stream, captured=False))
            bufs = list(inputs) + [None] * len(allocs)
            for slot, kind, what in per_call:
                if kind in _NEW:
                    bufs[slot] = _NEW[kind](what[0], device=device, dtype=what[1])
                else:
                    build, slots = what
                    bufs[slot] = build(*(bufs[s] for s in slots))
            for compiled, grid, template, tensors in calls:
                args = template.copy()
                for pos, slot, described in tensors:   # same signature: the recorded layout takes a descriptor
                    args[pos] = bufs[slot] if described is None else _redescribe(bufs[slot], *described)
                _run(compiled, grid, stream, args)
            return tuple(bufs[s] for s in out_slots) if isinstance(out, tuple) else bufs[out_slots[0]]
        return replay


_KEEP_BYTES = 64 * 2**20   # workspaces up to this size are views of a stream's arenas: larger ones cost less to
                           # allocate every call than the kernels that fill them run
_ARENAS = {}   # (device, stream, ordinal) -> bytes that the ordinal-th kept workspace of any replay views


def _workspace(device, stream, ordinal, shape, dtype):
    """A workspace as a view of an arena of the stream, which every replay's workspace of the same ordinal
    shares: calls on one stream run one after another, and distinct ordinals never overlap within a call."""
    nbytes = _nbytes(shape, dtype)
    arena = _ARENAS.get((device, stream, ordinal))
    if arena is None or arena.numel() < nbytes:
        arena = _ARENAS[(device, stream, ordinal)] = torch.empty(nbytes, device=device, dtype=torch.uint8)
    return arena[:nbytes].view(dtype).view(shape)


def _nbytes(shape, dtype):
    return math.prod(shape) * dtype.itemsize


def _capturing(device):
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_NEW = {"empty": torch.empty, "zeros": torch.zeros}


def _empty(rec, shape, dtype, device, kind="empty"):
    return rec.empty(shape, dtype, device, kind) if rec is not None else _NEW[kind](shape, device=device, dtype=dtype)


def _zeros(rec, shape, dtype, device):
    """A buffer the kernels add into."""
    return _empty(rec, shape, dtype, device, kind="zeros")


_TICKETS = {}    # (device, stream) -> int32 counters, all zero between calls


def _ticket_buffer(device, stream, count):
    """Zeroed counters for a split kernel's tiles. Every kernel leaves them zero again (the last program of a
    tile resets its ticket), so one buffer per stream serves every call without clearing; kernels on other
    streams may run at the same time, so they get their own."""
    t = _TICKETS.get((device, stream))
    if t is None or t.numel() < count:
        t = _TICKETS[(device, stream)] = torch.zeros(max(count, 1024), device=device, dtype=torch.int32)
    return t


def _current_stream(device):
    if device.type != "cuda":
        return 0
    # (a device named without an index, torch.device("cuda"), is the current one)
    return triton.runtime.driver.active.get_current_stream(
        device.index if device.index is not None else torch.cuda.current_device())


def _tickets(rec, device, count):
    stream = _current_stream(device)
    t = _ticket_buffer(device, stream, count)
    return rec.tickets(t, count) if rec is not None else t
