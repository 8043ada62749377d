"""The launch runtime of the generated modules, copied into each of them (they import only torch and triton).

A call that does not replay (replay.py) runs _setup, which reads the module's data (INPUTS, CONFIG,
INTERPRETER_CONFIG, TUNED, TUNED_FOR) passed to it and checks the inputs: the module's forward holds only its
own launches, each through _launch, which keeps the compiled kernel per argument specialization.
"""
import functools
import os

import torch
import triton

from neptune_eqsat.runtime.configs import bucket, split_count
from neptune_eqsat.runtime.ahead import (_AHEAD, _QuickConfig, _after_this_call, _ahead_enabled, _compiled,
                                         _future, _quick_call, _submit, _wait, _warming)
from neptune_eqsat.runtime.descriptors import _is_descriptor
from neptune_eqsat.runtime.replay import _Recording, _current_stream, _replay_enabled, _run

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"   # a generated module sets it above its kernels

# ---- copied into every generated module from here on
_COMPILED = {}   # (grid, (kernel, config, argument specialization)) -> compiled kernel
_ANY_LENGTH = {}   # a kernel -> (its twin for the quick tier (ahead.py), the positions of its length parameters)


def _any_length(kernel, length_params):
    """(The kernel compiled once for every value of its length parameters (sizes, chunk counts), their
    positions among its parameters)."""
    twin = kernel if _INTERPRETED else triton.jit(do_not_specialize=list(length_params))(kernel.fn)
    names = list(kernel.arg_names) if hasattr(kernel, "arg_names") else []
    return twin, frozenset(names.index(p) for p in length_params if p in names)


@functools.lru_cache(maxsize=None)
def _sm_count(device):
    return torch.cuda.get_device_properties(device).multi_processor_count


def _program_slots(device):
    return _sm_count(device) if device.type == "cuda" else 4


def _group_size(order, row_blocks, grid, device):
    """The grid indices a Gluon kernel's programs take at a time (its GROUP; a forward kernel's ORDER 3, a
    gradient kernel's every order): all of them for ORDER 2, else as many as one wave of programs (one a
    multiprocessor) covers with their row blocks, at least one."""
    if order == 2:
        return grid
    return max(1, min(grid, round(_program_slots(device) / max(row_blocks, 1))))


def _kept(cache, key, build):
    """cache[key], built by build() the first time it is asked for; the cache starts over past 256 keys (lengths
    that change every call make new keys every call)."""
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 256:
            cache.clear()
        hit = cache[key] = build()
    return hit


def _plan_slots(row_blocks, grid, group, programs):
    """ORDER 3's plan for `programs` programs (codegen/tile_order.py): program p runs slots plan[p] ..
    plan[p + 1] - 1, and slot k is position plan[programs + 1 + k] of the grouped order (GROUP grid indices at
    a time, longest row block first). Positions go out in that order, each to the program that frees first
    if a tile's work is its row block's key blocks (r + 1 under a causal mask) plus one for its start and end:
    what a GPU starting a program a tile on each multiprocessor that frees up does, for persistent programs
    that keep a tile's first loads beside the last tile's end. With a program a tile, program p runs position
    p."""
    import heapq
    free, owner = [(0, p) for p in range(programs)], []
    for first in range(0, grid, group):
        members = min(group, grid - first)
        for r in range(row_blocks - 1, -1, -1):
            for _ in range(members):
                at, p = free[0]
                owner.append(p)
                heapq.heapreplace(free, (at + r + 2, p))
    starts = [0] * (programs + 1)
    for p in owner:
        starts[p + 1] += 1
    for p in range(programs):
        starts[p + 1] += starts[p]
    fill, order = starts[:-1], [0] * len(owner)
    for pos, p in enumerate(owner):
        order[fill[p]] = pos
        fill[p] += 1
    return starts + order


# Planning takes host time that grows with the tiles (about 1 ms a thousand, once per sizes): beyond this many
# tiles a program, ORDER 3 runs a program per tile, which the GPU balances as well.
PLANNED_TILES = 64
_PLANS = {}   # (row blocks, grid, group, programs, device) -> ORDER 3's plan on the device


def _tile_plan(rec, order, row_blocks, grid, group, programs, device):
    """(the programs to start, the ORDER the forward Gluon kernel runs, the tile_plan it reads) for a kernel
    with ORDER: ORDER 3 with fewer programs than tiles runs as ORDER 4, reading the plan (kept per sizes);
    anything else reads one unread entry."""
    tiles = row_blocks * grid
    planned = order == 3 and programs < tiles
    if planned and tiles > PLANNED_TILES * programs:
        programs, planned = tiles, False
    key = (row_blocks, grid, group, programs, device) if planned else device
    hit = _kept(_PLANS, key, lambda: torch.tensor(_plan_slots(row_blocks, grid, group, programs) if planned else [0],
                                                  dtype=torch.int32, device=device))
    return programs, order + planned, (rec.constant(hit) if rec is not None else hit)


def _split_pieces(tiles, loop_blocks, slots):
    """The pieces of a Gluon gradient kernel's tail (codegen/gluon_split_tail.py): (SPLIT_FIRST, the pieces'
    count, the table). The tiles of the whole waves run one a program; the loop blocks of those of the last,
    partial wave are cut into one run a multiprocessor, at least 16 blocks each, and a run crossing a tile's end
    into two pieces: the first pieces launch first, in run order, the second ones longest first; a tile's
    piece launched last writes its outputs. No split where the waves are whole, the last one nearly full, or a
    run would save less than two blocks of a tile (a piece's start and its slot cost about that)."""
    rest, units = tiles % slots, tiles % slots * loop_blocks
    runs = min(slots, units // 16)
    if rest == 0 or 10 * rest > 9 * slots or runs <= rest or -(-units // runs) + 2 >= loop_blocks:
        return tiles, 0, []
    firsts, seconds = [], []
    for q in range(runs):
        lo, hi = q * units // runs, (q + 1) * units // runs
        t = lo // loop_blocks
        end = min(hi, (t + 1) * loop_blocks)
        firsts.append((t, lo - t * loop_blocks, end - t * loop_blocks))
        if end < hi:
            seconds.append((t + 1, 0, hi - end))
    pieces = sorted(firsts + seconds)
    order = [pieces.index(p) for p in firsts + sorted(seconds, key=lambda p: p[1] - p[2])]
    launched = {j: n for n, j in enumerate(order)}
    writers = {t: max((j for j, p in enumerate(pieces) if p[0] == t), key=launched.get) for t in range(rest)}
    starts = [next((j for j, p in enumerate(pieces) if p[0] >= t), len(pieces)) for t in range(rest + 1)]
    return tiles - rest, len(pieces), (order + [x for k in range(3) for x in (p[k] for p in pieces)]
                                      + [int(writers[p[0]] == j) for j, p in enumerate(pieces)] + starts)


_SPLITS = {}   # (tiles, loop blocks, multiprocessors, device) -> (SPLIT_FIRST, pieces, table on the device)


def _split_table(rec, tiles, loop_blocks, device, on=True):
    """(SPLIT_FIRST, TAIL, table) of a Gluon gradient kernel whose tiles are equal work, kept per sizes; with
    the split off, every tile a program of its own."""
    key = (tiles, loop_blocks, _program_slots(device) if on else 0, device)

    def build():
        first, n, table = _split_pieces(tiles, loop_blocks, key[2]) if on else (tiles, 0, [])
        return first, n, torch.tensor(table or [0], dtype=torch.int32, device=device)
    hit = _kept(_SPLITS, key, build)
    return hit[0], hit[1], (rec.constant(hit[2]) if rec is not None else hit[2])


_chunk_counts = functools.lru_cache(maxsize=4096)(split_count)


@functools.lru_cache(maxsize=None)
def _gpu_name(device):
    return torch.cuda.get_device_name(device)


@functools.lru_cache(maxsize=None)
def _hopper(device):
    return torch.cuda.get_device_capability(device)[0] == 9


def _specialization(a):
    """What Triton specializes a kernel argument on: dtypes, 16-byte alignment, ints equal to 1, divisible by 16
    or beyond 32 bits, a descriptor's block shape."""
    if type(a) is int:
        return a == 1, a % 16 == 0, -2**31 <= a < 2**31
    if a is None or isinstance(a, float):
        return a
    if _is_descriptor(a):
        return a.base.dtype, tuple(a.block_shape)
    return a.dtype, a.data_ptr() % 16 == 0


def _launch(rec, kernel, grid, args, cfg, constexprs, unspecialized=()):
    """Launch a kernel; on the GPU keep the compiled kernel per argument specialization. In a warm pass
    (ahead.py) request its compile instead; a launch whose compile runs in the background waits for it. A
    call of the quick tier launches the kernel's twin that no size or chunk count specializes.
    `unspecialized`: the positions of integer arguments the kernel does not specialize on (do_not_specialize)."""
    first = args[0].base if _is_descriptor(args[0]) else args[0]
    if first.device.type != "cuda" or not _replay_enabled():
        _fitted(kernel, grid, args, cfg)
        return
    if _quick_call() and kernel in _ANY_LENGTH:
        kernel, unspecialized = _ANY_LENGTH[kernel]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    compile_key = _compile_key(kernel, args, cfg, constexprs, unspecialized)
    key = (grid, compile_key)
    compiled = _COMPILED.get(key)
    if _warming():
        if compiled is None and not _compiled(compile_key):
            _AHEAD.needed.append((compile_key, lambda background=False: _submit(compile_key, first.device, kernel,
                                                                                grid, args, cfg, background)))
        return
    if compiled is None:
        _wait(compile_key)
        compiled = _COMPILED[key] = _fitted(kernel, grid, args, cfg)
    else:
        _run(compiled, grid, _current_stream(first.device), list(args) + list(constexprs))
    if rec is not None:
        rec.launched(compiled, grid, args, constexprs)


def _compile_key(kernel, args, cfg, constexprs, unspecialized=()):
    """What Triton compiles a kernel once for: the kernel, its config and constants, its arguments'
    specialization (of an integer at a position in `unspecialized`, only whether it fits 32 bits)."""
    spec = [(-2**31 <= a < 2**31) if n in unspecialized else _specialization(a) for n, a in enumerate(args)]
    return (kernel, *cfg.items(), *constexprs, *spec)


def _gluon_ready(kernel, args, cfg, constexprs, config):
    """Does this call take the Gluon kernel? It compiles in 2-5 s against 1-2 s for the Triton kernel of the
    same plan (an H100), so while it compiles in the background calls take the Triton kernel, and their
    replays go stale when it is ready (_replay). Always for a call with a config of its own, or where
    compiling ahead is off."""
    if config is not None or not _ahead_enabled() or not _replay_enabled():
        return True
    key = _compile_key(kernel, args, cfg, constexprs)
    future = _future(key)
    if future is None:
        _after_this_call(lambda background=True: _submit(key, args[0].base.device, kernel, (1, 1, 1), args, cfg,
                                                         background))
        return False
    if not future.done() and _warming():
        _AHEAD.pending.append(future)
    return future.done()


def _interpreter_lock():
    """One lock per process for kernels run by Triton's interpreter, which keeps the running kernel's state in
    globals: two threads interpreting at once corrupt each other (and the process). Kept on the interpreter's
    module, so that every generated module and the package share it."""
    import threading
    from triton.runtime import interpreter
    return interpreter.__dict__.setdefault("_one_at_a_time", threading.RLock())


def _fitted(kernel, grid, args, cfg):
    """Launch (compiling where needed) with cfg; where the kernel needs more shared memory than the GPU has
    (each pipeline stage buffers its loads, and a tile gathered from a table is large), with fewer stages."""
    if os.environ.get("TRITON_INTERPRET") == "1":   # interpreted (set for the calls of CPU tensors)
        with _interpreter_lock():
            return kernel[grid](*args, **cfg)
    while True:
        try:
            return kernel[grid](*args, **cfg)
        except _OUT_OF_RESOURCES:
            if cfg.get("num_stages", 1) <= 1:
                raise
            cfg = dict(cfg, num_stages=cfg["num_stages"] - 1)


_OUT_OF_RESOURCES = getattr(getattr(getattr(triton, "runtime", None), "errors", None), "OutOfResources", ())


def _bind(sizes, name, x, want, dtype, first_name, first):
    """Check input `name` (its type, dtype, device and shape against the spec's) and read its run-time sizes."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.device != first.device:
        raise ValueError(f"{name}: on device {x.device}, but {first_name} is on {first.device}")
    if x.dim() != len(want):
        raise ValueError(f"{name}: expected {len(want)} dimensions {list(want)}, got shape {tuple(x.shape)}")
    for pos, (w, got) in enumerate(zip(want, x.shape)):
        if isinstance(w, int):
            if w != got:
                raise ValueError(f"{name}: dimension {pos} must be {w}, got {got}")
        elif sizes.setdefault(w, got) != got:
            raise ValueError(f"{name}: dimension {pos} is {w} = {got}, but another input has {w} = {sizes[w]}")


def _bind_inputs(inputs, tensors):
    """Check a call's tensors against the module's INPUTS table (name -> (dtype name, shape), in the order of
    forward's arguments) and read the run-time sizes from their shapes."""
    sizes = {}
    first_name, first = next(iter(inputs)), tensors[0]
    for (name, (dtype, shape)), x in zip(inputs.items(), tensors):
        _bind(sizes, name, x, shape, getattr(torch, dtype), first_name, first)
    return sizes


def _measured_config(tuned, tuned_for, gpu_name, shape_bucket):
    """The tunables measured best on this GPU for this shape bucket (`tuned`: GPU name -> shape bucket ->
    config), else those measured on `tuned_for`, the GPU the module was made for."""
    table = tuned.get(gpu_name, {})
    return table[shape_bucket] if shape_bucket in table else tuned.get(tuned_for, {}).get(shape_bucket, {})


def _over(cfg, config):
    """cfg with config's entries over it; a table entry (a split plan's COMBINE) entry by entry."""
    for k, v in config.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v


def _setup(inputs, gpu_config, interpreter_config, tuned, tuned_for, tensors, config):
    """What a call does before its launches, from the module's data (INPUTS, CONFIG, INTERPRETER_CONFIG, TUNED,
    TUNED_FOR) and the call's tensors and config: check the inputs and read their sizes; choose the tunables
    (on the GPU CONFIG with what was measured for its name and the call's shape bucket, on the CPU
    INTERPRETER_CONFIG; the caller's config over either; for a call of the quick tier, CONFIG with the module's
    QUICK entries over it, a split plan's COMBINE entry by entry); on the GPU start the recording of its
    launches for replay. Marks this thread's launches as the quick tier's or not. Returns (sizes, device, cfg,
    rec)."""
    sizes = _bind_inputs(inputs, tensors)
    device = tensors[0].device
    if device.type == "cpu" and not _INTERPRETED:
        raise RuntimeError("CPU tensors run under Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    cfg = dict(interpreter_config if device.type == "cpu" else gpu_config)
    _AHEAD.quick = isinstance(config, _QuickConfig)
    if _AHEAD.quick:
        _over(cfg, config)
        config = None
    if device.type == "cuda" and not _AHEAD.quick:
        cfg.update(_measured_config(tuned, tuned_for, _gpu_name(device), bucket(sizes)))
    if config:
        unknown = sorted(set(config) - set(gpu_config) - set(interpreter_config))
        if unknown:   # a misspelt tunable would be ignored: the call runs another config than the one asked
            known = ", ".join(sorted(set(gpu_config) | set(interpreter_config)))
            raise KeyError(f"config: no tunable {', '.join(map(repr, unknown))} (this module's: {known})")
        _over(cfg, config)
    rec = _Recording(tensors) if device.type == "cuda" and _replay_enabled() and not _warming() else None
    return sizes, device, cfg, rec
