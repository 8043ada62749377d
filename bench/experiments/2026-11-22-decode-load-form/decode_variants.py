"""Which load form should codegen emit for split decode? Times variants of a generated decode module beside
SDPA's cuDNN backend and a copy of the same bytes, under do_bench (the L2 cache starts full of dirty lines) and
with a clean flush, in rounds that take turns:

    emitted       the module as generated, with its tuned config
    stream        the module's STREAM switch on: K/V loads marked evict_first (read once: leave the cache to other
                  data), loaded straight to registers (num_stages=1: a pipelined load goes through cp.async, which
                  drops the hint)
    plain         the same configs with STREAM off (what the hint itself is worth)

    PYTHONPATH=. python bench/experiments/2026-11-22-decode-load-form/decode_variants.py
        [--ops gqa_dc,causal_dc,softcap_dc] [--kv 32768] [--rounds 3]

Every output is compared with SDPA's math backend in float32 first. Imports only torch and triton.
"""
import argparse
import itertools

import torch
import triton

from bench.common import FLUSH_BYTES, GENERATED, HEADS, cudnn_attention, load, time_in_rounds
from bench.suite.attention import COPY_ROW, same_bytes_copy

STREAM_GRID = [dict(BLOCK_J=bj, num_warps=w, num_stages=1, CHUNKS=c)
               for bj, w, c in itertools.product((64, 128), (4, 8), (16, 32, 64))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="gqa_dc,causal_dc,softcap_dc")
    ap.add_argument("--kv", default="32768")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    clean = torch.empty(FLUSH_BYTES // 2, device="cuda", dtype=torch.float16).normal_()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}")
    for op in args.ops.split(","):
        mod = load(GENERATED / f"{op}.py")
        assert "STREAM" in mod.CONFIG, f"{op}: the module has no STREAM switch (generate it again)"
        hq, hkv = HEADS[op]
        for S in map(int, args.kv.split(",")):
            q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, hkv, S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
            extra = [torch.rand(hq, device="cuda")] if op.startswith("alibi") else []
            want = None
            if not extra and op != "softcap_dc":
                want = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), enable_gqa=hq != hkv)
            nbytes = (2 * q.numel() + 2 * k.numel()) * 2
            gb = nbytes / 1e9
            systems = {"emitted": lambda: mod.forward(q, k, v, *extra), COPY_ROW: same_bytes_copy(nbytes)}
            if not extra and op != "softcap_dc":
                systems["cudnn"] = lambda: cudnn_attention(q, k, v)
            for name, stream in (("stream", 1), ("plain", 0)):
                for cfg in STREAM_GRID:
                    tag = f"{name} BJ={cfg['BLOCK_J']} w={cfg['num_warps']} chunks={cfg['CHUNKS']}"
                    config = {**cfg, "STREAM": stream, "USE_TMA": 0}
                    systems[tag] = (lambda config=config: mod.forward(q, k, v, *extra, config=config))
            time_in_rounds(systems, clean, gb, args.rounds, f"{op} KV={S}", want,
                           checked=lambda name: name != COPY_ROW)


if __name__ == "__main__":
    main()
