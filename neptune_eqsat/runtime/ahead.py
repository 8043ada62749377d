"""Compiling ahead, copied into each generated module with launch.py: a first call on a GPU runs quick kernels
that compile fast and serve every length, while the kernels tuned for its shape compile in the background;
later calls take those once they are ready. A new sequence length therefore never waits for a compile.

Two tiers of the same plan:
* **quick** (the module's QUICK over CONFIG, no measured config): one masked loop per pass instead of masked,
  full and masked loops (ONE_LOOP), a split plan's combine as its own kernel (compiled beside the partials'
  kernel, not inside it), matrix-product tiles at half the side in 4 warps, no software pipelining, loads
  through pointers, no Gluon kernel; and sizes and chunk counts unspecialized
  (_ANY_LENGTH in launch.py), so that a length of another class or another chunk count compiles nothing.
  Strides stay specialized (wide loads need them divisible by 16), and in the usual layouts a new length
  keeps their class.
* **tuned** (CONFIG with what was measured for the GPU and shape bucket): lengths stay specialized because
  knowing one is a multiple of 16 makes kernels faster (codegen/kernel.py's grid_sizes); Triton compiles
  again for an integer that is 1, a multiple of 16 or neither. After a first call, the tuned kernels of its
  lengths' other class compile in the background too.

A call recorded for replay while tuned kernels it did not take were compiling is replayed until one of them
is ready, then recorded again (launch.py's _replay).

Triton's compile releases the interpreter lock for much of its work (MLIR, LLVM, ptxas): on an H100's host
the calling thread kept 58-102% of its Python progress while a kernel compiled on another. Its Python parts
still contend, so compiles that nothing waits for start after the call's own, one at a time. A compile thread
also builds the kernel's launcher (a C module Triton compiles per signature; for a compile the call waits for,
on another thread while the kernel compiles) and, for a kernel the call waits for, loads it: work a first
launch would otherwise do on the calling thread.

A warm pass runs the module's forward with the launches replaced by compile requests (no kernel runs, no
replay is recorded, no CUDA graph is captured). Warm passes run on the calling thread: the compile threads
launch nothing and load a kernel only while the caller waits for it, so none of our GPU work runs beside the
caller's (a CUDA graph it captures right after must not see another thread's launch or module load). Calls
with a config of their own do none of this, and NEPTUNE_EQSAT_COMPILE_AHEAD=0 turns it off for all calls:
every kernel then compiles when it first launches, as Triton does by itself.
"""
import concurrent.futures
import math
import os
import threading
import types

import torch
import triton

# ---- copied into every generated module from here on
_AHEAD = threading.local()   # a warm pass's requests on this thread (.needed, .later, .pending); .quick: see _setup
_PENDING = {}                # a kernel's compile key (config, argument specialization) -> its Future
_BACKGROUND = []             # every Future submitted, for wait_for_compiles
_POOLS = {}                  # the compile threads, started on first use: "waited" and "background"


def _ahead_enabled():
    return os.environ.get("NEPTUNE_EQSAT_COMPILE_AHEAD", "1") != "0"


def _pool(background):
    """The threads for compiles a call waits for (several, so that they compile together), or the one thread
    for those nothing waits for yet: one at a time, so that they hold the interpreter lock as little as they
    can while the caller goes on (the next first call traces and optimizes in Python)."""
    kind = "background" if background else "waited"
    if kind not in _POOLS:
        workers = 1 if background else max(2, min(8, os.cpu_count() or 2))
        _POOLS[kind] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"neptune-compile-{kind}")
    return _POOLS[kind]


def _in_background(device, job, background=False):
    """job() on a compile thread, with `device` current there (Triton compiles for the current device)."""
    def on_device():
        if device.type != "cuda":
            return job()
        with torch.cuda.device(device):
            return job()
    future = _pool(background).submit(on_device)
    if len(_BACKGROUND) > 256:   # keep the list to the compiles that may still run
        _BACKGROUND[:] = [f for f in _BACKGROUND if not f.done()]
    _BACKGROUND.append(future)
    return future


def _submit(key, device, kernel, grid, args, cfg, background=False):
    """The Future of compiling `kernel` for these arguments (Triton's warmup: compile, keep, do not launch),
    then building its launcher and, where the caller waits for it, loading it; one per compile key.
    `background`: nothing waits for it yet."""
    def compile_and_load():
        compiled = kernel.warmup(*args, grid=grid, **cfg)
        try:
            if background:   # its launcher only: loading it into the GPU's context (a CUDA call) while the
                # caller captures a CUDA graph on another thread would break that capture
                triton.runtime.driver.active.launcher_cls(compiled.src, compiled.metadata)
            else:   # the caller waits for it: loaded here, launched at once there
                compiled._init_handles()
        except Exception:   # noqa: BLE001 - out of shared memory, say: the launch raises it where it is handled
            pass
        return compiled
    future = _PENDING.get(key)
    if future is None:
        launcher = not background and device.type == "cuda" and _binder(kernel, device)
        future = _PENDING[key] = _in_background(device, compile_and_load, background)
        if launcher:   # its launcher meanwhile, on another thread
            _in_background(device, lambda: _launcher_ahead(kernel, args, cfg))
    return future


def _binder(kernel, device):
    """Make the kernel's per-device binder here, before two threads would each make one (the second's compiled
    kernels would land in a cache the launch does not read); False where the kernel has none."""
    try:
        with torch.cuda.device(device):
            kernel.device_caches[triton.runtime.driver.active.get_current_device()]
        return True
    except Exception:   # noqa: BLE001 - not a Triton kernel
        return False


def _launcher_ahead(kernel, args, cfg):
    """Build the launcher Triton compiles for a kernel (a C module per signature, cached on disk; 0.2-0.5 s of
    a C compiler on an H100's host) while the kernel compiles, so that loading the kernel finds it built. This
    takes Triton's internals (the kernel's binder, _pack_args, ASTSource, the driver's launcher class); where
    they differ, or a detail of the compiled kernel changes the launcher (its tensor descriptors' layout),
    the launcher is built when the kernel loads, as it would be without this."""
    try:
        driver = triton.runtime.driver.active
        backend, binder = kernel.device_caches[driver.get_current_device()][3:]
        bound, specialization, options = binder(*args, **cfg)
        _, signature, constexprs, attrs = kernel._pack_args(backend, dict(cfg), bound, specialization, options)
        meta = types.SimpleNamespace(tensordesc_meta=None, num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                                     profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False,
                                     launch_pdl=False)
        driver.launcher_cls(kernel.ASTSource(kernel, signature, constexprs, attrs), meta)
    except Exception:   # noqa: BLE001 - an optimization only
        pass


def _future(key):
    """The Future of the background compile of `key`; None where none was submitted."""
    return _PENDING.get(key)


def _compiled(key):
    """Has the background compile of `key` finished (a launch of another grid, or an earlier warm pass)?"""
    future = _future(key)
    return future is not None and future.done()


def _wait(key):
    """Wait for the background compile of `key`, if any (its error, if any, is raised by the launch itself)."""
    future = _future(key)
    if future is not None:
        concurrent.futures.wait([future])


def wait_for_compiles():
    """Block until every background compile started so far has finished (a benchmark calls this before it
    times, so that no compile shares the CPU with the timed calls)."""
    while True:
        pending = [f for f in _BACKGROUND if not f.done()]
        if not pending:
            _BACKGROUND.clear()
            return
        concurrent.futures.wait(pending)


class _QuickConfig(dict):
    """The config of a call running the quick tier (QUICK over CONFIG): launches take _ANY_LENGTH's kernels."""


def _quick_call():
    """Does the forward running on this thread run the quick tier (set by _setup)?"""
    return getattr(_AHEAD, "quick", False)


def _warm_pass(forward, tensors, config):
    """Run forward with its launches replaced by compile requests: (the compiles the call would wait for, as
    (key, submit) pairs; those it puts off, as submit callables (a Gluon kernel); the compiles of kernels it
    would take if they were ready, as Futures). submit(background) returns the compile's Future. A failure
    here is not the call's: the call itself compiles what is left and reports it."""
    _AHEAD.needed, _AHEAD.later, _AHEAD.pending = [], [], []
    try:
        forward(*tensors, config=config)
    except Exception:   # noqa: BLE001 - the real call raises it, with its context
        pass
    finally:
        found = _AHEAD.needed, _AHEAD.later, _AHEAD.pending
        _AHEAD.needed = _AHEAD.later = _AHEAD.pending = None
    return found


def _warming():
    """Is this thread running a warm pass (compile, do not launch)?"""
    return getattr(_AHEAD, "needed", None) is not None


def _after_this_call(submit):
    """submit() once the kernels this call waits for are compiled, when a warm pass runs; else now. Compiles
    on several threads share the interpreter lock for their Python parts: one that nothing waits for yet
    would slow the call's own (on an H100 concurrent compiles made first calls 30-50% slower)."""
    if _warming():
        _AHEAD.later.append(submit)
    else:
        submit()


def _other_length(n):
    """A length in Triton's other specialization class: n + 1 after a multiple of 16, else the next multiple."""
    return n + 1 if n % 16 == 0 else n + 16 - n % 16


def _zeros_like_layout(x, shape):
    """Zeros of `shape` laid out as x is (its dimensions in the same order of strides), so that strides fall in
    the same classes as the caller's."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    t = torch.zeros([shape[d] for d in order], dtype=x.dtype, device=x.device)
    return t.permute([order.index(d) for d in range(x.dim())])


def _sibling_inputs(inputs, lengths, tensors):
    """Inputs like `tensors` with every length of `lengths` (a size Triton specializes on, not 1) moved to the
    other specialization class; None when there is none, or when they would take over a quarter of the free
    GPU memory."""
    sizes = {}
    for (dtype, shape), x in zip(inputs.values(), tensors):
        sizes.update((d, n) for d, n in zip(shape, x.shape) if isinstance(d, str))
    moved = {d: _other_length(sizes[d]) for d in lengths if sizes.get(d, 1) > 1}
    if not moved:
        return None
    sizes.update(moved)
    shapes = [[sizes[d] if isinstance(d, str) else d for d in shape] for dtype, shape in inputs.values()]
    need = sum(math.prod(s) * x.element_size() for s, x in zip(shapes, tensors))
    if tensors[0].is_cuda and need > torch.cuda.mem_get_info(tensors[0].device)[0] // 4:
        return None
    return [_zeros_like_layout(x, s) for x, s in zip(tensors, shapes)]


def _compile_ahead(forward, tensors, config, inputs, lengths, quick=None):
    """Before the launches of a GPU call that does not replay: (the config it runs with, the Futures whose
    completion makes its replay stale). Where its tuned kernels are compiled, the call runs them. Otherwise
    it runs the quick tier (`quick`: the module's QUICK), compiling its kernels together and waiting for
    them, and the tuned kernels (with any compiles they put off, a Gluon kernel) and those of its lengths'
    other class compile in the background; without `quick` it waits for the tuned kernels instead. Nothing
    for a call with a config of its own (a tuner's or an experiment's: it runs exactly what it names,
    compiled when launched)."""
    capturing = tensors[0].is_cuda and torch.cuda.is_current_stream_capturing()
    if config is not None or _warming() or not _ahead_enabled() or capturing:
        return config, ()   # (inside a CUDA graph capture a warm pass's allocations would be captured too)
    needed, later, pending = _warm_pass(forward, tensors, None)
    if not needed:
        return None, pending + [submit(True) for submit in later]
    first = any(_future(key) is None for key, _ in needed)   # not submitted by an earlier call
    if quick is not None:
        config = _QuickConfig(quick)
        concurrent.futures.wait([submit() for _, submit in _warm_pass(forward, tensors, config)[0]])
        tuned = [submit(True) for _, submit in needed]   # in the background: the call does not wait for them
    else:
        concurrent.futures.wait([submit() for _, submit in needed])
        tuned = []
    stale_when = tuned + [submit(True) for submit in later] + pending
    if first:   # on this thread, as every warm pass: its zero inputs are GPU work, which no other thread of
        # ours does beside the caller's
        try:
            _warm_siblings(forward, inputs, lengths, tensors)
        except Exception:   # noqa: BLE001 - out of memory for the zero inputs, say: the call goes on without it
            pass
    return config, stale_when


def _warm_siblings(forward, inputs, lengths, tensors):
    """A warm pass of the call at its lengths' other class: its tuned kernels' compiles are submitted, not
    waited for."""
    siblings = _sibling_inputs(inputs, lengths, tensors)
    if siblings is not None:
        needed, later, _ = _warm_pass(forward, siblings, None)
        for submit in [s for _, s in needed] + later:
            submit(True)
