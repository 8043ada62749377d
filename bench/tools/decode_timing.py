"""Time a generated decode module and SDPA's cuDNN backend under several timing methods, to tell the kernels'
speed apart from the timer's:

    python -m bench.tools.decode_timing [--ops gqa_dc,causal_dc] [--kv 4096,32768]

- do_bench: triton.testing.do_bench, as bench.suite.attention times (it zero-fills 256 MB before every call, so the
  call starts with the L2 cache full of dirty lines it must write back)
- dirty_flush: the same by hand, with CUDA events around each call
- clean_flush: a 256 MB read before every call instead (the cache holds clean lines)
- no_flush: back-to-back eager calls (host time per call shows where a library is launch-bound)
- graph: ten calls captured in a CUDA graph, replayed back to back (no host cost)

GB/s counts the bytes of Q, K, V and O. Imports only torch and triton.
"""
import argparse

import torch
import triton

from bench.common import FLUSH_BYTES, GENERATED, HEADS, cudnn_attention, event_median, host_us, load


def graph_ms(fn, inner=10, replays=20):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / (inner * replays)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="gqa_dc,causal_dc")
    ap.add_argument("--kv", default="4096,32768")
    args = ap.parse_args()
    dirty = torch.empty(FLUSH_BYTES // 4, device="cuda", dtype=torch.int32)
    clean = torch.empty(FLUSH_BYTES // 2, device="cuda", dtype=torch.float16).normal_()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}")
    for op in args.ops.split(","):
        hq, hkv = HEADS[op]
        mod = load(GENERATED / f"{op}.py")
        for S in map(int, args.kv.split(",")):
            q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, hkv, S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
            gb = (2 * q.numel() + 2 * k.numel()) * 2 / 1e9
            for name, fn in (("neptune", lambda: mod.forward(q, k, v)), ("cudnn", lambda: cudnn_attention(q, k, v))):
                fn()
                torch.cuda.synchronize()
                ms = {"do_bench": triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"),
                      "dirty_flush": event_median(fn, dirty.zero_), "clean_flush": event_median(fn, clean.sum),
                      "no_flush": event_median(fn, lambda: None), "graph": graph_ms(fn)}
                print(f"{op} KV={S} {name:8s} " + "  ".join(f"{k} {v * 1e3:6.1f} us {gb / v * 1e3:5.0f} GB/s"
                                                        for k, v in ms.items())
                      + f"  host {host_us(fn):5.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
