"""Outputs that every program adds its share to (Schedule.accumulated) declared in a 16-bit dtype: the programs
add into an fp32 workspace (`outK`, zeroed), and a small kernel of the module rounds it once into the output
(`outK_rounded`) after the adds, so that the sum is never rounded share by share.

The derived backward keeps dQ in fp32 in its kernel spec and casts it on the host: running this rounding kernel
as the gradient pass's programmatic dependent, so that it rounds each head as the pass's last wave finishes it,
saved at most 12 us of a 1.32 ms global bf16 backward at S = 4096 on an H100 and cost more elsewhere
(bench/experiments/2026-11-27-rounding-beside-last-wave).
"""
from __future__ import annotations

from .embedded import TORCH_DTYPE
from .triton_kernel import outputs

ROUND_BLOCK = 4096        # elements a rounding program reads (16 KB of fp32)

ROUND_KERNEL = '''
@triton.jit
def {name}_round_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
    """dst = src rounded to dst's dtype, both contiguous runs of numel elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(src_ptr + offs, mask=ok)
    tl.store(dst_ptr + offs, x.to(dst_ptr.dtype.element_ty), mask=ok)
'''


def rounded(spec, accumulated) -> list[int]:
    """The accumulated further outputs (positions in spec.also) declared in a dtype other than fp32."""
    return [k for k in accumulated if spec.also[k].dtype != "f32"]


def output_lines(spec, accumulated: tuple[int, ...] = ()) -> tuple[str, str]:
    """The launcher's allocation of every output (one string, for its place in the launch lines), and what
    forward returns: the output, or a tuple of them in the spec's order. Outputs the programs add their
    shares to (Schedule.accumulated) start at zero; a 16-bit one is an fp32 workspace and the output it is
    rounded into."""
    lines, stems, ks = [], [], rounded(spec, accumulated)
    for k, (stem, axes, dtype, _) in enumerate(outputs(spec)):
        shape = spec.output_shape if stem == "out" and spec.output_shape else [spec.extent(a) for a in axes]
        dims = ", ".join(str(e) if isinstance(e, int) else e.name for e in shape) + ("," if len(shape) == 1 else "")
        if k - 1 in ks:
            lines += [f"    {stem} = _zeros(rec, ({dims}), torch.float32, device)   # the programs' sums, rounded into:",
                      f"    {stem}_rounded = _empty(rec, ({dims}), {TORCH_DTYPE[dtype]}, device)"]
            stems.append(f"{stem}_rounded")
            continue
        lines.append(f"    {stem} = {'_zeros' if k - 1 in accumulated else '_empty'}(rec, ({dims}), {TORCH_DTYPE[dtype]}, device)")
        stems.append(stem)
    return "\n".join(lines), (stems[0] if len(stems) == 1 else f"({', '.join(stems)})")


def round_launch(name: str, spec, w, ks: list[int]) -> list[str]:
    """The launcher's lines rounding each output of `ks` once the kernel adding into it has run (stream order)."""
    lines = []
    for k in ks:
        stem = f"out{k + 1}"
        numel = " * ".join(w.ext(a) for a in spec.also[k].axes)
        lines.append(f"    _launch(rec, {name}_round_kernel, (-(-({numel}) // {ROUND_BLOCK}),), ({stem}, {stem}_rounded, "
                     f"{numel}), {{'num_warps': 4, 'BLOCK': {ROUND_BLOCK}}}, ({ROUND_BLOCK},))")
    return lines
