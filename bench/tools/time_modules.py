"""Generated modules of one spec side by side (a default module and a tuned one, say): each checked against the
float64 evaluation of the spec, then timed in turns (median of triton.testing.do_bench per round).

    python -m bench.tools.time_modules SPEC MODULE [MODULE ...] --shape B=8,N=4096,M=4096 [--rounds 3]
"""
import argparse
import statistics
import sys

import torch
import triton.testing

from bench.common import import_package, load_module

import_package()
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance  # noqa: E402
from neptune_eqsat.spec import load_spec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("modules", nargs="+")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    spec = load_spec(args.spec)
    sizes = {k: int(v) for k, v in (p.split("=") for p in args.shape.split(","))}
    inputs = random_inputs(spec, sizes, seed=1)
    ref = evaluate(spec, inputs)
    cuda = [x.cuda() for x in inputs.values()]
    calls, failures = {}, 0
    for path in args.modules:
        forward = load_module(path, prefix="timed_").forward
        err = (forward(*cuda).double().cpu() - ref).abs().max().item()
        ok = err <= tolerance(spec.output_dtype)
        failures += not ok
        print(f"{path}: max error {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
        if ok:
            calls[path] = lambda f=forward: f(*cuda)
    times = {p: [] for p in calls}
    for _ in range(args.rounds):
        for p, call in calls.items():
            times[p].append(triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median"))
    first = None
    for p, ts in times.items():
        ms = statistics.median(ts)
        first = first or ms
        print(f"{p}: {ms:.4f} ms (rounds {', '.join(f'{t:.4f}' for t in ts)}); {first / ms:.3f}x the first")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
