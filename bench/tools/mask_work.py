"""The work each mask of bench.suite.masks leaves, and the throughput a time target would take: how many
(query, key) pairs the mask keeps, hence its FLOPs (4 * heads * pairs * D), and, from a masks.json of
bench.suite.masks, the TFLOP/s each system ran at and the TFLOP/s it would take to run `--ratio` times faster
than one of them (FlexAttention with its block mask built per call, say).

    python -m bench.tools.mask_work [--results DIR/masks.json] [--against flex_per_call] [--ratio 3]

Runs on the CPU (it evaluates the mask_mods over every pair, a row block at a time). A target above the GPU's
matrix-product ceiling (about 790 TFLOP/s dense fp16/bf16 on an H200 or H100, measured) cannot be met by any
kernel that computes the pairs the mask keeps.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.suite.masks import D, masks

ROWS_AT_ONCE = 512


def kept_pairs(mask_mod, queries: int, keys: int, query_offset: int = 0) -> int:
    """Pairs (q_idx, kv_idx) the mask keeps, q_idx in [0, queries), evaluated a block of rows at a time."""
    kv = torch.arange(keys)[None, :]
    b = h = torch.zeros((), dtype=torch.long)
    total = 0
    for start in range(0, queries, ROWS_AT_ONCE):
        q = torch.arange(start, min(start + ROWS_AT_ONCE, queries))[:, None] + query_offset
        total += int(torch.broadcast_to(mask_mod(b, h, q, kv), (q.shape[0], keys)).sum())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="", help="a masks.json: adds each system's TFLOP/s and the target's")
    ap.add_argument("--against", default="flex_per_call")
    ap.add_argument("--ratio", type=float, default=3.0)
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--heads", type=int, default=32)
    a = ap.parse_args()
    rows = json.loads(Path(a.results).read_text()) if a.results else []
    print(f"| mask | S | kept pairs | TFLOP | ms at 790 TFLOP/s | {a.against} ms | TFLOP/s for {a.ratio:g}x it "
          "| ours TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for S in map(int, a.seqs.split(",")):
        for name, (mask_mod, _, _, *decode) in masks(S, "cpu").items():
            if decode:   # decode rows are bound by reading K and V, not by matrix products
                continue
            tflop = 4 * a.heads * kept_pairs(mask_mod, S, S) * D / 1e12
            cells = [name, str(S), f"{round(tflop * 1e12 / (4 * a.heads * D)):,}", f"{tflop:.3f}",
                     f"{tflop / 790 * 1e3:.3f}"]
            found = [r for r in rows if r["mask"] == name and r["S"] == S]
            for r in found:
                theirs, ours = r.get(a.against, {}).get("ms"), r.get("neptune", {}).get("ms")
                need = f"{tflop * a.ratio / theirs * 1e3:.0f}" if theirs else "-"
                got = f"{tflop / ours * 1e3:.0f}" if ours else "-"
                print("| " + " | ".join(cells + [f"{theirs:.3f}" if theirs else "-", need, got]) +
                      f" ({r['dtype']}) |")
            if not found:
                print("| " + " | ".join(cells + ["-", "-", "-"]) + " |")


if __name__ == "__main__":
    main()
