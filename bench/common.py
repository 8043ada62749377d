"""What the benchmark's scripts share: the folders, loading a generated module from its file, the ten operators'
heads, SDPA's cuDNN call, timing in rounds (do_bench and a clean flush), the GPU's name and the default results
folder of a run.

Imports nothing beyond the standard library at the top: torch and triton are imported where a function needs
them, so `--help` and the CPU self-check run without them.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# A benchmark times each module's final kernels from its first call, with no compile in the background sharing
# the CPU (runtime/ahead.py); bench.suite.first_call, which measures first calls, turns compiling ahead on.
os.environ.setdefault("NEPTUNE_EQSAT_COMPILE_AHEAD", "0")

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent                     # the repository: specs/ and the package neptune_eqsat
SPECS = ROOT / "specs"
GENERATED = BENCH / "generated"         # written by bench.suite.generate_modules (not committed)
RESULTS = BENCH / "results"             # <gpu>/<date>-<suite>/, listed in results/INDEX.md
TUNING = BENCH / "tuning"               # <gpu>.json: the tuning databases the generated modules' tables hold

# (query heads, kv heads) of the ten operators, as bench.suite.attention runs them
HEADS = {"global_pf": (32, 32), "causal_pf": (32, 32), "gqa_pf": (64, 8), "alibi_pf": (32, 32),
         "softcap_pf": (32, 16), "window_pf": (32, 8), "causal_dc": (32, 32), "gqa_dc": (64, 8),
         "alibi_dc": (32, 32), "softcap_dc": (32, 16)}
FLUSH_BYTES = 256 * 2**20               # the L2 flush of a timed call (what do_bench zero-fills)


def load_module(path, prefix: str = "neptune_generated_"):
    """Import a generated module from its file, registered in sys.modules as `prefix + stem` (as Triton and
    dataclasses expect). A module that fails to import is not left registered."""
    path = Path(path)
    name = f"{prefix}{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


load = load_module


def import_package():
    """neptune_eqsat from this checkout (also when the package is not installed: its subpackages rules/ and
    codegen/ then sit beside it, where pyproject.toml maps them from)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import neptune_eqsat
    for sub in ("rules", "codegen"):
        name = f"neptune_eqsat.{sub}"
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            spec = importlib.util.spec_from_file_location(name, ROOT / sub / "__init__.py",
                                                          submodule_search_locations=[str(ROOT / sub)])
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    return neptune_eqsat


def cudnn_attention(q, k, v, causal=False):
    """SDPA through its cuDNN backend (grouped-query heads where K/V have fewer heads than Q)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=q.shape[1] != k.shape[1])


def event_median(fn, before, calls=200):
    """Median ms of `calls` calls of fn, each timed with CUDA events after `before()` (a cache flush, say)."""
    import torch
    pairs = []
    for _ in range(calls):
        before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in pairs)
    return ms[len(ms) // 2]


def time_in_rounds(systems: dict, clean, gb: float, rounds: int, title: str, want=None,
                   checked=lambda name: True, width: int = 32) -> None:
    """Call every system once (dropping those that fail, comparing the output of those `checked` says with
    `want`), then time them under do_bench and with a clean flush (`clean.sum()` before each call), in rounds
    that take turns, and print the medians fastest first (GB/s of `gb` gigabytes per call)."""
    import torch
    import triton
    for name, fn in list(systems.items()):
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as e:   # a config may not fit
            print(f"  {name}: {type(e).__name__}: {str(e)[:80]}")
            del systems[name]
            continue
        if want is not None and checked(name):
            err = (out.double() - want.double()).abs().max().item()
            assert err < 2e-2, f"{title} {name}: max error {err}"
    times = {name: {"do_bench": [], "clean": []} for name in systems}
    for _ in range(rounds):
        for name, fn in systems.items():
            times[name]["do_bench"].append(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))
            times[name]["clean"].append(event_median(fn, clean.sum, calls=60))
    med = {n: {m: sorted(v)[len(v) // 2] for m, v in t.items()} for n, t in times.items()}
    print(f"{title} ({gb * 1e3:.0f} MB of Q, K, V, O; medians of {rounds} rounds)")
    for name, t in sorted(med.items(), key=lambda kv: kv[1]["do_bench"]):
        print(f"  {name:{width}s} do_bench {t['do_bench'] * 1e3:6.1f} us {gb / t['do_bench'] * 1e3:5.0f} GB/s"
              f"   clean flush {t['clean'] * 1e3:6.1f} us {gb / t['clean'] * 1e3:5.0f} GB/s", flush=True)


def host_us(fn, calls=2000):
    """Host microseconds per call of `calls` back-to-back calls (the GPU synchronized before and after): what a
    launch-bound call (decode) pays."""
    import torch
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def host_profile(fn, calls, top):
    """Print the functions of most host time (their own, and with their callees) over `calls` calls, per call."""
    import cProfile
    import pstats
    import torch
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = [(tt, ct, f"{Path(f).name}:{line} {name}") for (f, line, name), (_, _, tt, ct, _) in stats.items()]
    for title, key in (("own time", 0), ("with callees", 1)):
        print(f"    host, by {title}:")
        for tt, ct, where in sorted(rows, key=lambda r: -r[key])[:top]:
            print(f"      own {tt / calls * 1e6:7.1f} us  with callees {ct / calls * 1e6:7.1f} us  {where}")


def gpu_name() -> str:
    """The GPU's full name (nvidia-smi's, else torch's; "cpu" where there is none)."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:
        pass
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:
        pass
    return "cpu"


def gpu_short(name: str) -> str:
    """The results folder of a GPU: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", name)
    return model.group(1).lower() if model else (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu")


def default_out(suite: str) -> Path:
    """Where a run writes when --out is not given: $OUT if set, else bench/results/<gpu>/<today>-<suite>/."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return RESULTS / gpu_short(gpu_name()) / f"{time.strftime('%Y-%m-%d')}-{suite}"
