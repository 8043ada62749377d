"""What a data-dependent mask's per-call classification costs with and without dependent launches (the
classifying kernel and the attention kernel launched as programmatic dependents, runtime/tables.py):

    python bench/experiments/2026-11-26-per-call-classification/dependent_launch.py [--seqs 4096,16384]

For each document case, with NEPTUNE_EQSAT_DEPENDENT_LAUNCH 0 then 1 (replays and lists dropped between):
- `control`: a tensor of the ids' size and dtype, not read by the mask, written before every call: the same
  write as `new` costs, with the lists kept;
- `new`: the mask's ids written before every call (values unchanged, version bumped): lists rebuilt.
`new - control` is what the rebuild costs a call. do_bench medians in microseconds, every output checked
against float64 first.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import triton.testing  # noqa: E402

from bench import common  # noqa: E402
from bench.suite.masks import check, masks, written_in_place  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from per_call import flex_case  # noqa: E402


def dependent(module, on):
    os.environ["NEPTUNE_EQSAT_DEPENDENT_LAUNCH"] = "1" if on else "0"
    module._dependent_launch.cache_clear()
    for table in ("_REPLAYS", "_SEEN_ONCE", "_BUILDS", "_SEEN"):
        getattr(module, table).clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=1, help="times to alternate off and on")
    ap.add_argument("--cases", default="document_causal,document,document_causal_gqa_softcap,"
                                       "document_causal_decode_q1,document_causal_decode_q4")
    a = ap.parse_args()
    print(f"GPU: {common.gpu_name()}")
    for S in map(int, a.seqs.split(",")):
        table = masks(S, "cuda")
        for name in a.cases.split(","):
            call, module, data, mask_mod, score_mod, q, k, v = flex_case(table[name], S)
            other = [t.clone() for t in data]
            line = f"{name:<28} S={S:<6}"
            for on in (0, 1) * a.rounds:
                dependent(module, on)
                times = {}
                for label, written in (("control", other), ("new", data)):
                    def fn(written=written):
                        for t in written:
                            written_in_place(t)
                        return call()
                    err, ok = check(fn(), q, k, v, mask_mod, score_mod)
                    assert ok, (name, S, on, label, err)
                    times[label] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
                cost = times["new"] - times["control"]
                line += (f"  dependent={on}: control {times['control']:7.1f} new {times['new']:7.1f} "
                         f"rebuild {cost:5.1f} ({100 * cost / times['control']:4.1f}%)")
            print(line, flush=True)


if __name__ == "__main__":
    main()
