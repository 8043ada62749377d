"""Time each generated module over a small grid of its tunables (block sizes, warps, stages, and for split
decode kernels the chunk count) on the GPU.

    python -m bench.tools.sweep_configs [--ops causal_pf,causal_dc,...] [--seqs 4096,16384] [--kv 32768]
                                        [--modules bench/generated] [--json FILE]

Prints, per op and length, the median time of every config and the best one. Imports only torch and triton.
A call with a config replays its recorded launches like a plain call, so short kernels are timed, not Python.
"""
import argparse
import itertools
import json
import math
from pathlib import Path

import torch
import triton

from bench.common import GENERATED, HEADS, load

PREFILL_GRID = [dict(BLOCK_I=bm, BLOCK_J=bn, num_warps=w, num_stages=s)
                for bm, bn, w, s in itertools.product((64, 128), (64, 128), (4, 8), (2, 3))]
# decode: chunk counts per tile that put about 1, 2, 3 or 4 programs on each SM (0: the launcher's own count)
PROGRAMS_PER_SM = (0, 1, 2, 3, 4)
# loads: unpipelined, through pointers with the read-once hint (STREAM 1) or through descriptors (which take no
# hint), or pipelined 2-3 deep through pointers or descriptors (the pipeliner drops the hint: STREAM 0)
DECODE_LOADS = [dict(num_stages=1, STREAM=1, USE_TMA=tma) for tma in (0, 1)] + [
    dict(num_stages=s, STREAM=0, USE_TMA=tma) for s, tma in itertools.product((2, 3), (0, 1))]
DECODE_GRID = [dict(BLOCK_J=bn, num_warps=w, **loads, programs_per_sm=p)
               for bn, w, loads, p in itertools.product((32, 64, 128, 256), (4, 8), DECODE_LOADS, PROGRAMS_PER_SM)]


def decode_config(grid_entry: dict, tiles: int, sms: int) -> dict:
    """A decode grid entry as a module config: programs per SM become a chunk count per (batch, kv head) tile."""
    cfg = dict(grid_entry)
    per_sm = cfg.pop("programs_per_sm")
    cfg["CHUNKS"] = -(-per_sm * sms // tiles) if per_sm else 0
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=",".join(HEADS))
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--kv", default="32768")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--modules", default=str(GENERATED))
    ap.add_argument("--json", help="also write every config's time here")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}", flush=True)
    everything = []
    for op in args.ops.split(","):
        mod = load(Path(args.modules) / f"{op}.py")
        hq, hkv = HEADS[op]
        decode = op.endswith("_dc")
        grid = PREFILL_GRID
        if decode:   # one tile per batch entry and kv head (GQA packs a group's query heads into its rows)
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            grid = [decode_config(c, args.batch * hkv, sms) for c in DECODE_GRID]
        B = args.batch
        for S in map(int, (args.kv if decode else args.seqs).split(",")):
            q = torch.randn(B, hq, 1 if decode else S, 128, device="cuda", dtype=torch.float16)
            k = torch.randn(B, hkv, S, 128, device="cuda", dtype=torch.float16)
            v = torch.randn_like(k)
            extra = [torch.rand(hq, device="cuda")] if op.startswith("alibi") else []
            times = []
            for cfg in grid:
                try:
                    ms = triton.testing.do_bench(lambda: mod.forward(q, k, v, *extra, config=cfg), warmup=10, rep=40)
                except Exception:  # a config may not fit in shared memory
                    ms = math.inf
                times.append((ms, cfg))
            times.sort(key=lambda t: t[0])
            default = {k: mod.CONFIG[k] for k in grid[0]}
            default_ms = next((t for t, c in times if c == default), math.nan)
            if math.isnan(default_ms):
                default_ms = triton.testing.do_bench(lambda: mod.forward(q, k, v, *extra), warmup=10, rep=40)
            gbs = (q.numel() * 2 + 2 * k.numel() * 2 + q.numel() * 2) / 1e9
            rate = (lambda ms: f"{gbs / ms * 1e3:7.0f} GB/s") if decode else (lambda ms: "")
            print(f"{op} B={B} S={S}: best {times[0][0]:.3f} ms {rate(times[0][0])} {times[0][1]}; "
                  f"default {default_ms:.3f} ms {rate(default_ms)}", flush=True)
            for ms, cfg in times[:6]:
                print(f"    {ms:8.3f} ms {rate(ms)} {cfg}")
            everything += [{"op": op, "B": B, "S": S, "ms": ms if math.isfinite(ms) else None, "config": cfg}
                           for ms, cfg in times]
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "triton": triton.__version__, "times": everything}, indent=1))


if __name__ == "__main__":
    main()
