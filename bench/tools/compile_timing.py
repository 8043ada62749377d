"""Where a first call's Triton compile time goes, per generated module: the seconds of the first launch of each
kernel the module can run (Gluon and Triton where it has both), of a second length in the other divisibility
class (a multiple of 16 or not, which Triton specializes on), and whether a compile in a background thread
lets the calling thread run on (the share of its pure-Python progress it keeps while the thread compiles).

    python -m bench.tools.compile_timing --specs specs --modules DIR [--sizes "B=1,S=4096"] [--other S=4999]

Triton's kernel cache starts empty (TRITON_CACHE_DIR is set to a new folder before Triton is imported).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_timing_")

import torch  # noqa: E402

from bench.common import import_package, load  # noqa: E402

import_package()
from neptune_eqsat.frontend.reference import random_inputs  # noqa: E402
from neptune_eqsat.spec import load_spec  # noqa: E402


def seconds(call):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def python_progress(stop):
    """Iterations per second of a pure-Python loop run until the event `stop` is set."""
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        n += 1
    return n / (time.perf_counter() - t0)


def progress_while(call):
    """(seconds the call took in a thread, share of the Python progress the main thread kept meanwhile)."""
    alone, finished, took = threading.Event(), threading.Event(), []
    threading.Timer(0.3, alone.set).start()
    base = python_progress(alone)

    def worker():
        took.append(seconds(call))
        finished.set()
    t = threading.Thread(target=worker)
    t.start()
    rate = python_progress(finished)
    t.join()
    return took[0], rate / base


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--modules", required=True)
    ap.add_argument("--ops", default=None)
    ap.add_argument("--sizes", default="B=1,S=4096")
    ap.add_argument("--other", default="S=4999", help="the sizes changed for the second length")
    ap.add_argument("--config", type=json.loads, default={}, help="entries added to the module's config, as JSON")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    paths = sorted(Path(args.modules).glob("*.py"))
    if args.ops:
        paths = [p for p in paths if p.stem in args.ops.split(",")]
    for path in paths:
        spec = load_spec(Path(args.specs) / path.name)
        t0 = time.perf_counter()
        mod = load(path)
        imported = time.perf_counter() - t0
        sizes = {k: int(v) for k, v in (p.split("=") for p in args.sizes.split(","))}
        other = dict(sizes, **{k: int(v) for k, v in (p.split("=") for p in args.other.split(","))})
        first = [x.cuda() for x in random_inputs(spec, sizes, seed=1).values()]
        second = [x.cuda() for x in random_inputs(spec, other, seed=2).values()]
        backends = ["gluon", "triton"] if "BACKEND" in mod.CONFIG else [None]
        for backend in backends:
            config = {**mod.CONFIG, **args.config, **({} if backend is None else {"BACKEND": backend})}
            a = seconds(lambda: mod.forward(*first, config=config))
            again = seconds(lambda: mod.forward(*first, config=config))
            b, kept = progress_while(lambda: mod.forward(*second, config=config))
            print(f"{path.stem:20s} {backend or 'triton':6s} import {imported:5.2f} s  first {a:6.2f} s  "
                  f"again {again * 1e3:7.2f} ms  other length in a thread {b:6.2f} s, main thread kept "
                  f"{kept:4.0%} of its progress", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
