"""Times the generated Gluon kernels of global, causal and grouped-query prefill with one program per tile and with
persistent programs (WS_PERSISTENT), and, where a causal mask makes later row blocks longer, in both tile orders
(WS_ORDER 1: one head after another, each longest first; 2: the longest row blocks of every head first, persistent
programs running alternate rounds backwards), beside cuDNN, at S = 1k/4k/16k. Each output is compared with the
module's Triton kernel first. Run from the repository root on a Hopper GPU:

    python -m bench.tools.gluon_persistent [--modules DIR] [--sizes 1024,4096,16384] [--rings 128x3,64x4]
                                     [--ops global_pf,causal_pf,gqa_pf]

--rings lists the key/value rings to time, as key block x stages (WS_BLOCK_J x WS_STAGES); by default the
module's own.
"""
import argparse
from pathlib import Path

import torch
import triton

from bench.common import GENERATED, cudnn_attention, load


def median_of_three(fn):
    return sorted(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))[1]


ap = argparse.ArgumentParser()
ap.add_argument("--modules", default=str(GENERATED), help="folder of the generated modules")
ap.add_argument("--sizes", default="1024,4096,16384")
ap.add_argument("--rings", default="", help="key block x stages, e.g. 128x3,64x4 (default: the module's)")
ap.add_argument("--ops", default="global_pf,causal_pf,gqa_pf")
args = ap.parse_args()
print(torch.cuda.get_device_name(), args.modules)
HEADS = {"global_pf": (32, 32), "causal_pf": (32, 32), "gqa_pf": (64, 8)}
rings = [tuple(map(int, r.split("x"))) for r in args.rings.split(",") if r]
for op in args.ops.split(","):
    hq, hk = HEADS[op]
    m = load(Path(args.modules) / f"{op}.py")
    orders = (1, 2) if "WS_ORDER" in m.CONFIG else (None,)
    for S in map(int, args.sizes.split(",")):
        q = torch.randn(1, hq, S, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, hk, S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        ref = m.forward(q, k, v, config={"BACKEND": "triton"}).float()
        c = median_of_three(lambda: cudnn_attention(q, k, v, causal=op != "global_pf"))
        cells = []
        for ring in rings or [None]:
            for persistent in (0, 1):
                for order in orders:
                    cfg = {"BACKEND": "gluon", "WS_PERSISTENT": persistent} | ({"WS_ORDER": order} if order else {})
                    if ring:
                        cfg |= {"WS_BLOCK_J": ring[0], "WS_STAGES": ring[1]}
                    fn = lambda: m.forward(q, k, v, config=cfg)   # noqa: E731
                    err = (fn().float() - ref).abs().max().item()
                    ms = median_of_three(fn)
                    name = (f"{ring[0]}x{ring[1]} " if ring else "") + ("persistent" if persistent else "per-tile") + (
                        f" order {order}" if order else "")
                    cells.append(f"{name} {ms * 1e3:.1f} us ({c / ms:.2f}x, err {err:.0e})")
        sep = "\n    " if rings else " | "
        print(f"{op} S={S} cuDNN {c * 1e3:.1f} us{sep}" + sep.join(cells), flush=True)
