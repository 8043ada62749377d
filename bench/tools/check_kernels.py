"""Check generated modules on the GPU against the float64 evaluation of their specs, with every kernel the
module can run (`BACKEND` gluon and triton where it has both), on random inputs at lengths that are not
multiples of the blocks. Kernels without an interpreter (Gluon) are checked here rather than in the tests.

    python -m bench.tools.check_kernels --specs DIR --modules DIR [--shapes "B=2,S=333;B=1,S=1000"] [--config JSON]

Each module DIR/X.py is paired with the spec DIR/X.py. A row fully masked by its spec must come out 0 (the
reference says so too), and no output may hold a NaN. Imports torch, triton and the egglog-free part of the
package (spec language and reference).
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from bench.common import import_package, load

import_package()   # neptune_eqsat from this checkout (its egglog-free part)
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance   # noqa: E402
from neptune_eqsat.spec import load_spec   # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", required=True)
    ap.add_argument("--modules", required=True)
    ap.add_argument("--shapes", default="B=2,S=333;B=1,S=1000")
    ap.add_argument("--config", type=json.loads, default={}, help='entries added to every config, as JSON')
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    failures = 0
    for path in sorted(Path(args.modules).glob("*.py")):
        spec = load_spec(Path(args.specs) / path.name)
        mod = load(path)
        backends = ["gluon", "triton"] if "BACKEND" in mod.CONFIG else [None]
        for shape in args.shapes.split(";"):
            sizes = {k: int(v) for k, v in (p.split("=") for p in shape.split(","))}
            inputs = random_inputs(spec, sizes, seed=1)
            ref = evaluate(spec, inputs)
            cuda = {n: x.cuda() for n, x in inputs.items()}
            for backend in backends:
                config = {**args.config, **({} if backend is None else {"BACKEND": backend})}
                out = mod.forward(*cuda.values(), config=config).cpu()
                err = (out.double() - ref).abs().max().item()
                zero_rows = int((ref.abs().amax(dim=-1) == 0).sum())
                nan = bool(torch.isnan(out).any())
                ok = err <= tolerance(spec.output_dtype) and not nan
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {spec.name:22s} {shape:14s} {backend or 'triton':6s} "
                      f"max error {err:.2e}  rows all zero in the reference: {zero_rows}  NaN: {nan}", flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
