"""On a CUDA GPU: split-K modules give the same bits in one launch (the last chunk program of a tile combines)
as with the combine in a second kernel, over many back-to-back calls with fresh inputs. A partial result read
before it is visible, or a ticket not reset, shows up here as a mismatch.

    python -m bench.tools.check_split_repeat [--modules bench/generated] [--calls 50]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.common import GENERATED, load

SHAPES = [dict(B=1, Q=1, SKV=32768), dict(B=3, Q=1, SKV=4097), dict(B=8, Q=4, SKV=8197)]


def random_inputs(mod, sizes, gen):
    out = []
    for dtype, shape in mod.INPUTS.values():
        dims = [sizes[d] if isinstance(d, str) else d for d in shape]
        out.append(torch.randn(dims, generator=gen, device="cuda").to(getattr(torch, dtype)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", default=str(GENERATED))
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    for path in sorted(Path(args.modules).glob("*.py")):
        mod = load(path)
        if "COMBINE" not in getattr(mod, "CONFIG", {}):
            continue
        two_launches = {"COMBINE": {**mod.CONFIG["COMBINE"], "in_kernel": 0}}
        for sizes in SHAPES:
            batches = [random_inputs(mod, sizes, gen) for _ in range(args.calls)]
            one = [mod.forward(*x) for x in batches]   # back to back, replayed after the first
            two = [mod.forward(*x, config=two_launches) for x in batches]
            torch.cuda.synchronize()
            diff = sum(int((a != b).any()) for a, b in zip(one, two))
            nans = sum(int(torch.isnan(a).any()) for a in one)
            bad += diff + nans
            print(f"{path.stem:12s} {sizes}: {args.calls} calls, {diff} differ, {nans} with NaN")
    print("ok" if bad == 0 else f"FAILED: {bad}")
    return int(bad != 0)


if __name__ == "__main__":
    sys.exit(main())
