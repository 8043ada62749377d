"""Two folders of generated modules side by side: what a change to the rules or the generator does to the
kernels. For every op, the module of --before and the module of --after run on the same inputs, are both
checked against the benchmark's float64 reference, and are timed in turns (--rounds), so a drifting clock
weighs on both alike. Prints each pair and the ratio after / before (above 1: the change is faster).

    python -m bench.tools.compare_modules --before DIR --after DIR [--ops softcap_pf,softcap_dc]
                                          [--seqs 1024,4096,16384] [--kv 4096,32768] [--rounds 5] [--after-quick]

--after-quick runs the after side's quick tier (its QUICK config: the kernels a first call runs while the tuned
ones compile, runtime/ahead.py), e.g. against the same folder as before, to see what those calls cost.
"""
import argparse
import dataclasses
import functools
import sys
import types
from pathlib import Path

import torch

from bench.suite import attention

SIDES = ("before", "after")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="folder of <op>.py")
    ap.add_argument("--after", required=True, help="folder of <op>.py")
    ap.add_argument("--ops", type=attention.name_list(list(attention.OPS)), default=["softcap_pf", "softcap_dc"])
    ap.add_argument("--seqs", type=attention.int_list, default=[1024, 4096, 16384])
    ap.add_argument("--kv", type=attention.int_list, default=[4096, 32768])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--after-quick", action="store_true", help="the after side runs its modules' quick tier")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    timer = attention.cuda_timer(50, 300)
    rows = []
    for name in args.ops:
        op = attention.OPS[name]
        for side in SIDES:
            module = attention.load_module(Path(getattr(args, side)) / f"{name}.py")
            if side == "after" and args.after_quick:
                module = types.SimpleNamespace(forward=functools.partial(
                    module.forward, config=module._QuickConfig(module.QUICK)))
            attention.BUILDERS[side] = (
                lambda case, module=module: attention.neptune(dataclasses.replace(case, module=module)))
        for S in (args.seqs if op.mode == "prefill" else args.kv):
            attention.bench_shape(rows, op, 1, S, list(SIDES), timer=timer, rounds=args.rounds)
    print(f"\n{'op':11s} {'S':>6s} {'before ms':>10s} {'after ms':>10s}  after / before")
    for (name, S), pair in group_pairs(rows).items():
        if len(pair) == 2:
            print(f"{name:11s} {S:6d} {pair['before']:10.4f} {pair['after']:10.4f}  "
                  f"{pair['before'] / pair['after']:.3f}x")
        else:
            print(f"{name:11s} {S:6d} not both correct: {sorted(pair)}")


def group_pairs(rows) -> dict:
    pairs = {}
    for r in rows:
        if r["system"] in SIDES:
            pair = pairs.setdefault((r["op"], r["Skv"]), {})
            if r["status"] == "ok":
                pair[r["system"]] = r["ms"]
    return pairs


if __name__ == "__main__":
    sys.exit(main())
