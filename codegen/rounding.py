"""Outputs that every program adds its share to (Schedule.accumulated) declared in a 16-bit dtype, as the
derived backward declares dQ: the programs add into an fp32 workspace (`outK`, zeroed), and a small kernel
rounds it once into the output (`outK_rounded`) after the adds.

Where the adding kernel is the Gluon gradient pass, the rounding kernel runs as its programmatic dependent:
the pass's programs trigger the launch at their start, so the rounding kernel starts once every program of the
pass has started, in its last wave, on the multiprocessors no program of the pass is left for. Each program of
the pass counts its threads done per grid index (a head) once its bulk adds have landed; the rounding programs of
a grid index wait for that count, then round its rows. So the rounding of the heads finished before the last
wave overlaps that wave instead of following the pass (a separate cast of dQ took 34.5 us of a 1.38 ms global
bf16 backward at S = 4096 on an H100). Elsewhere (the Triton kernel, the interpreter, an output laid out with
its grid axes not leading) the rounding kernel runs after the adding kernel, waiting for nothing.
"""
from __future__ import annotations

from .embedded import TORCH_DTYPE
from .triton_kernel import outputs

ROUND_BLOCK = 4096        # elements a rounding program reads (16 KB of fp32)
COUNTING_THREADS = 256    # threads of the Gluon gradient pass that count themselves done: two warpgroups
# grid index g's count lies at done[g * COUNTER_STRIDE]: one 128-byte line each, so that the rounding programs
# waiting on the heads still running poll several L2 slices, not one, which the pass's own traffic shares
COUNTER_STRIDE = 32

ROUND_KERNEL = '''
@triton.jit
def {name}_round_kernel(src_ptr, dst_ptr, done_ptr, per_index, target, WAIT: tl.constexpr, BLOCK: tl.constexpr,
                       COUNTER_STRIDE: tl.constexpr):
    """dst = src rounded to dst's dtype; program axis 1 is the grid index whose per_index elements (a run of
    them) it rounds. With WAIT it first waits until done[grid index * COUNTER_STRIDE] counts `target` threads of the adding
    kernel done (each thread's load an acquire: their adds are seen)."""
    g = tl.program_id(1)
    if WAIT:   # a load, not an atomic: the pass's bulk adds share L2's atomic units with the waiting programs
        while tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [done_ptr + g * COUNTER_STRIDE],
                                        dtype=tl.int32, is_pure=False, pack=1) < target:
            tl.inline_asm_elementwise("nanosleep.u32 1000; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < per_index
    at = g.to(tl.int64) * per_index + offs
    # first out of L2: the pass still running beside keeps its operands and sums there
    x = tl.load(src_ptr + at, mask=ok, eviction_policy="evict_first")
    tl.store(dst_ptr + at, x.to(dst_ptr.dtype.element_ty), mask=ok, eviction_policy="evict_first")
'''

def count_helpers(later_stores: int) -> str:
    """The Gluon gradient pass's side, in PTX the language lacks: its launch trigger, and its count of threads
    done. `later_stores`: the bulk stores a consumer issues after its last add (its epilogue's outputs), which
    the count does not wait for: waiting for every bulk operation to land at each program's end (the outputs'
    stores too) made the pass 1.5% slower at global bf16 S = 4096 on an H100."""
    return f'''

@gluon.jit
def _launch_dependents():
    """Let the kernel launched as this one's programmatic dependent start once every program has got here."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _program_id_again():
    """The program's id read again, as an instruction with effects, which the compiler cannot merge with the
    kernel's first read: no register holds the grid index through the loop for the count at the end."""
    return gl.inline_asm_elementwise("mov.u32 $0, %ctaid.x;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _count_done(counter):
    """Count this thread done at `counter` (a release at GPU scope) once the bulk adds it issued have landed in
    global memory (not only left shared memory, which is all tma.store_wait waits for): every bulk group it
    committed but the last {later_stores} (the outputs' stores, which nothing here reads) is complete."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group {later_stores}; fence.proxy.async.global; "
                              "red.release.gpu.global.add.s32 [$1], 1; // $0", "=r,l", [counter],
                              dtype=gl.int32, is_pure=False, pack=1)
'''


def rounded(spec, accumulated) -> list[int]:
    """The accumulated further outputs (positions in spec.also) declared in a dtype other than fp32."""
    return [k for k in accumulated if spec.also[k].dtype != "f32"]


def counted_layout(o, grid: tuple[str, ...], loop: str, col: str) -> bool:
    """Are the output's grid axes its leading ones, in the grid's order, before [loop, column]? Then the rows of
    one grid index are one run of memory, which its programs finish together."""
    return tuple(o.axes) == (*grid, loop, col)


def output_lines(spec, accumulated: tuple[int, ...] = ()) -> tuple[str, str]:
    """The launcher's allocation of every output (one string, for its place in the launch lines), and what
    forward returns: the output, or a tuple of them in the spec's order. Outputs the programs add their
    shares to (Schedule.accumulated) start at zero; a 16-bit one is an fp32 workspace and the output it is
    rounded into."""
    lines, stems = [], []
    for k, (stem, axes, dtype, _) in enumerate(outputs(spec)):
        shape = spec.output_shape if stem == "out" and spec.output_shape else [spec.extent(a) for a in axes]
        dims = ", ".join(str(e) if isinstance(e, int) else e.name for e in shape) + ("," if len(shape) == 1 else "")
        if k - 1 in rounded(spec, accumulated):
            lines += [f"    {stem} = _zeros(rec, ({dims}), torch.float32, device)   # the programs' sums, rounded into:",
                      f"    {stem}_rounded = _empty(rec, ({dims}), {TORCH_DTYPE[dtype]}, device)"]
            stems.append(f"{stem}_rounded")
            continue
        lines.append(f"    {stem} = {'_zeros' if k - 1 in accumulated else '_empty'}(rec, ({dims}), {TORCH_DTYPE[dtype]}, device)")
        stems.append(stem)
    return "\n".join(lines), (stems[0] if len(stems) == 1 else f"({', '.join(stems)})")


def round_launch(name: str, spec, w, ks: list[int], counted: bool, row_ext: str, row_block: int) -> list[str]:
    """The launcher's lines rounding each output of `ks` after the adding kernel's launch. `counted`: the Gluon
    gradient kernel, when it ran (use_gluon), counts its threads done per grid index in `done`; its programs
    own `row_block` rows of `row_ext`."""
    lines = []
    grid = " * ".join(w.ext(g) for g in w.s.grid) or "1"
    for k in ks:
        stem, o = f"out{k + 1}", spec.also[k]
        numel = " * ".join(w.ext(a) for a in o.axes)
        plain = (f"(-(-({numel}) // {ROUND_BLOCK}), 1), ({stem}, {stem}_rounded, {'done' if counted else stem}, "
                 f"{numel}, 0), {{'num_warps': 4, 'WAIT': 0, 'BLOCK': {ROUND_BLOCK}, 'COUNTER_STRIDE': {COUNTER_STRIDE}}}, "
                 f"(0, {ROUND_BLOCK}, {COUNTER_STRIDE})")
        if not counted:
            lines.append(f"    _launch(rec, {name}_round_kernel, {plain})")
            continue
        per = " * ".join(w.ext(a) for a in o.axes[len(w.s.grid):])
        lines += ["    if use_gluon:   # started beside the pass's last wave, each grid index once it is done",
                  f"        _launch(rec, {name}_round_kernel, (-(-({per}) // {ROUND_BLOCK}), {grid}), ({stem}, "
                  f"{stem}_rounded, done, {per}, -(-{row_ext} // {row_block}) * {COUNTING_THREADS}), "
                  f"{{'num_warps': 4, 'WAIT': 1, 'BLOCK': {ROUND_BLOCK}, 'COUNTER_STRIDE': {COUNTER_STRIDE}, "
                  f"'launch_pdl': _dependent_launch(device)}}, (1, {ROUND_BLOCK}, {COUNTER_STRIDE}))",
                  "    else:",
                  f"        _launch(rec, {name}_round_kernel, {plain})"]
    return lines
