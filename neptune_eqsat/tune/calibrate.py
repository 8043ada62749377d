"""Device calibration: the cost model's constants measured on the GPU here, stored as its device profile.

Each constant is a rate (or a time) from a microbenchmark, timed with warm-up and the median of repeated runs:
  bandwidth       a large device-to-device copy: bytes read + bytes written per second
  matrix_flops    a large fp16 matrix product (torch.mm): 2 * M * N * K flop per second
  vector_ops      a Triton kernel running independent chains of fp32 multiply-adds on every element of a large
                  tensor: a multiply-add counts 2 ops, as the cost model counts a mul and an add
  special_ops     the same with chains of exp2: exp2 per second
  launch_seconds  back-to-back launches of a trivial Triton kernel, host time included, per launch, made as
                  generated modules make them on the GPU (replayed without Triton's per-call argument binding);
                  call_launch_seconds, kept beside it, is the same through a plain Triton call
The profile (with the GPU's name and SM count) is merged into the user's devices file (see profiles.py), where
the cost model finds it by GPU name. Needs torch and triton only, so it runs where the kernels run:

    python -m neptune_eqsat.tune.calibrate [--out FILE]

Each benchmark takes its timer as an argument (a function of a callable returning its median seconds), so its
accounting can be checked without a GPU.
"""
from __future__ import annotations

import statistics
import time

import torch
import triton
import triton.language as tl

from neptune_eqsat.tune import profiles

CHAINS = 4   # independent chains per element: a chain waits on its previous step, four keep the units busy
ELEMENTS_PER_PROGRAM = 1024
TRIVIAL_KERNEL_TENSORS = 4   # the trivial kernel takes a generated kernel's kind of arguments: tensors ...
TRIVIAL_KERNEL_INTS = 12     # ... and strides


@triton.jit
def _multiply_add_chains(x_ptr, out_ptr, n, scale, shift, ITERATIONS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    a = tl.load(x_ptr + offs, mask=valid, other=0.0)
    b, c, d = a + 1.0, a + 2.0, a + 3.0
    for _ in range(ITERATIONS):   # CHAINS multiply-adds per iteration, none waiting on another
        a = a * scale + shift
        b = b * scale + shift
        c = c * scale + shift
        d = d * scale + shift
    tl.store(out_ptr + offs, a + b + c + d, mask=valid)


@triton.jit
def _exp2_chains(x_ptr, out_ptr, n, ITERATIONS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    a = tl.load(x_ptr + offs, mask=valid, other=0.0)
    b, c, d = a + 0.25, a + 0.5, a + 0.75
    for _ in range(ITERATIONS):   # exp2(-x) maps [0, 1] into [0.5, 1]: the chains stay finite
        a = tl.math.exp2(-a)
        b = tl.math.exp2(-b)
        c = tl.math.exp2(-c)
        d = tl.math.exp2(-d)
    tl.store(out_ptr + offs, a + b + c + d, mask=valid)


@triton.jit
def _trivial(p0, p1, p2, p3, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11):
    tl.store(p0 + s0 * 0, 0.0)


def gpu_timer(fn) -> float:
    """Median seconds of fn on the GPU (CUDA events; triton's warm-up and cache flush)."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3


def host_timer(fn, warmup: int = 3, repeats: int = 15) -> float:
    """Median wall-clock seconds of fn (which waits for the GPU itself)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_bandwidth(timer, device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Bytes per second of a copy of `nbytes` (read once, written once) between two device buffers."""
    src = torch.ones(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()
    return moved / timer(lambda: dst.copy_(src))


def matrix_rate(timer, device: str = "cuda", n: int = 8192) -> float:
    """fp16 flop per second of an n x n by n x n matrix product."""
    a = torch.randn(n, n, device=device).to(torch.float16)
    b = torch.randn(n, n, device=device).to(torch.float16)
    return 2 * n ** 3 / timer(lambda: torch.mm(a, b))


def vector_rate(timer, device: str = "cuda", n: int = 1 << 22, iterations: int = 256) -> float:
    """fp32 ops per second: CHAINS chains of `iterations` multiply-adds (2 ops each) on each of n elements. The
    few loads, stores and additions around the chains are not counted: with the defaults they are under 1%."""
    x = torch.rand(n, device=device)
    out = torch.empty_like(x)
    grid = (triton.cdiv(n, ELEMENTS_PER_PROGRAM),)
    seconds = timer(lambda: _multiply_add_chains[grid](x, out, n, 0.999, 0.001, ITERATIONS=iterations,
                                                        BLOCK=ELEMENTS_PER_PROGRAM))
    return 2 * CHAINS * iterations * n / seconds


def special_rate(timer, device: str = "cuda", n: int = 1 << 22, iterations: int = 64) -> float:
    """Transcendentals per second: CHAINS chains of `iterations` exp2 on each of n elements."""
    x = torch.rand(n, device=device)
    out = torch.empty_like(x)
    grid = (triton.cdiv(n, ELEMENTS_PER_PROGRAM),)
    seconds = timer(lambda: _exp2_chains[grid](x, out, n, ITERATIONS=iterations, BLOCK=ELEMENTS_PER_PROGRAM))
    return CHAINS * iterations * n / seconds


def launch_overhead(timer, device: str = "cuda", launches: int = 500, direct: bool | None = None) -> float:
    """Seconds per launch of `launches` back-to-back launches of a trivial kernel, waiting for the last: the
    host's work per launch, as long as it exceeds the kernel's (it does for a trivial one).

    `direct` launches the compiled kernel without Triton's per-call argument binding (tens of microseconds), as
    generated modules replay their launches on a GPU where Triton has `knobs` (3.4 on); by default, where they
    do. Otherwise each launch is a plain Triton call."""
    tensors = [torch.zeros(16, device=device) for _ in range(TRIVIAL_KERNEL_TENSORS)]
    args = [*tensors, *(16 * (k + 1) for k in range(TRIVIAL_KERNEL_INTS))]   # no 1: Triton would fold it
    if direct is None:
        direct = device.startswith("cuda") and getattr(triton, "knobs", None) is not None
    if direct:
        compiled = _trivial[(1,)](*args)   # the first call compiles; Triton returns the compiled kernel
        stream = torch.cuda.current_stream(device).cuda_stream
        launch = lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,  # noqa: E731
                                      None, None, None, *args)
    else:
        launch = lambda: _trivial[(1,)](*args)   # noqa: E731

    def burst() -> None:
        for _ in range(launches):
            launch()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    return timer(burst) / launches


def measure(device: str = "cuda", timer=gpu_timer, wall_timer=host_timer) -> dict:
    """The profile of the GPU `device`: its name, SM count and the measured constants."""
    props = torch.cuda.get_device_properties(device)
    return {"name": props.name, "sms": props.multi_processor_count,
            "bandwidth": memory_bandwidth(timer, device),
            "matrix_flops": matrix_rate(timer, device),
            "vector_ops": vector_rate(timer, device),
            "special_ops": special_rate(timer, device),
            "launch_seconds": launch_overhead(wall_timer, device),
            "call_launch_seconds": launch_overhead(wall_timer, device, direct=False),   # for comparison
            "measured": True, "torch": torch.__version__, "triton": triton.__version__}


UNITS = {"sms": ("SMs", 1.0), "bandwidth": ("GB/s", 1e9), "matrix_flops": ("TFLOP/s", 1e12),
         "vector_ops": ("Top/s", 1e12), "special_ops": ("Gop/s", 1e9), "launch_seconds": ("us", 1e-6),
         "call_launch_seconds": ("us", 1e-6)}


def table(profile: dict, previous: dict | None = None) -> str:
    """The measured constants, beside the profile they replace (if any)."""
    head = f"{profile['name']}" + (f"  (was: {'measured' if previous.get('measured') else 'nominal'} profile)"
                                   if previous else "")
    lines = [head, f"  {'field':20s} {'measured':>12s} {'previous':>12s}"]
    for name in [f for f in UNITS if f in profile]:
        unit, scale = UNITS[name]
        old = f"{previous[name] / scale:12.4g}" if previous and name in previous else f"{'-':>12s}"
        lines.append(f"  {name:20s} {profile[name] / scale:12.4g} {old}  {unit}")
    return "\n".join(lines)


def calibrate(out=None) -> str:
    """Measure the GPU here, store its profile (in `out`, default the user's devices file); returns a report."""
    if not torch.cuda.is_available():
        raise RuntimeError("calibration measures the GPU, and this machine has none")
    profile = measure()
    found = profiles.find(profile["name"])
    previous = profiles.load(out).get(profile["name"]) if out else None   # the entry this write replaces
    path = profiles.store(profile, out)
    return table(profile, previous or (found[1] if found else None)) + f"\nstored in {path}"


def _main(argv=None) -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="Measure the cost model's constants on this GPU and store them.")
    ap.add_argument("--out", default=None, help="devices file to write (default: the user's devices file)")
    args = ap.parse_args(argv)
    try:
        print(calibrate(args.out))
    except RuntimeError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    _main()
