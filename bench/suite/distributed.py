"""Attention across GPUs: decode over a KV cache sharded across the ranks (neptune_eqsat.distributed's
context_parallel_attention) and causal prefill by a ring (ring_attention), against the same attention on one GPU
and against PyTorch's context parallel with cuDNN's SDPA. Every output is checked before it is timed: against
the one-GPU output, and rows of it against float64.

    python -m bench.suite.distributed --generate                        where the compiler runs (no GPU): fills
                                                                        bench/generated/flex_cache
    torchrun --nproc-per-node 2 -m bench.suite.distributed [--out DIR]  on the GPUs (NCCL)
    torchrun --nproc-per-node 2 -m bench.suite.distributed --smoke      on the CPU (gloo, Triton's interpreter,
                                                                        tiny shapes, correctness only)

Shapes: B = 1, 32 query heads, 8 key/value heads, D = 128, fp16; decode over KV = 512k, prefill at S = 128k
(--decode-kv, --prefill-s). Times are medians of --iters calls after a warm-up, each call between barriers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

from bench.common import GENERATED

os.environ.setdefault("NEPTUNE_EQSAT_CACHE", str(GENERATED / "flex_cache"))   # carried to the GPU machine

HEADS, KV_HEADS, D = 32, 8, 128


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def problems(decode_kv: int, prefill_s: int) -> dict:
    """name -> (query length, key length, mask_mod); decode queries are the newest position."""
    return {"decode": (1, decode_kv, None), "prefill": (prefill_s, prefill_s, causal)}


def tensors(L: int, S: int, device, seed: int = 0):
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    make = lambda h, n: torch.randn(1, h, n, D, generator=g).half().to(device)   # noqa: E731
    return make(HEADS, L), make(KV_HEADS, S), make(KV_HEADS, S)


def float64_rows(q, k, v, rows: list[int], mask_mod) -> "torch.Tensor":
    """Reference rows of the whole attention (all heads), in float64 on the CPU."""
    import torch
    qq = q[:, :, rows].double().cpu()
    kk = k.double().cpu().repeat_interleave(HEADS // KV_HEADS, dim=1)
    vv = v.double().cpu().repeat_interleave(HEADS // KV_HEADS, dim=1)
    s = qq @ kk.transpose(-1, -2) / math.sqrt(D)
    if mask_mod is not None:
        keep = torch.tensor([[bool(mask_mod(0, 0, r, j)) for j in range(k.shape[2])] for r in rows])
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ vv


def timed(call, iters: int, barrier) -> float:
    """Median seconds of one call, each between barriers (every rank in step)."""
    import torch
    call()
    times = []
    for _ in range(iters):
        barrier()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_context_parallel(q, k, v, is_causal: bool, world: int):
    """PyTorch's context parallel around cuDNN's SDPA (experimental API): a callable, or the reason it cannot
    run here. It shards its buffers itself, so it is given the whole tensors on every rank."""
    import torch
    import torch.nn.functional as F
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel
        mesh = init_device_mesh("cuda", (world,))
        qq, kk, vv = (x.clone() for x in (q, k.repeat_interleave(HEADS // KV_HEADS, dim=1),
                                           v.repeat_interleave(HEADS // KV_HEADS, dim=1)))

        def call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), context_parallel(mesh, buffers=(qq, kk, vv),
                                                                            buffer_seq_dims=(2, 2, 2)):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=is_causal)
        call()
        return call
    except Exception as e:   # noqa: BLE001 - an anchor that cannot run is reported, not fatal
        return f"{type(e).__name__}: {str(e)[:160]}"


def generate(decode_kv: int, prefill_s: int) -> None:
    """Fill the flex cache with the modules the GPU run needs (split plans for the ranks, the one-GPU plans),
    tracing on tiny CPU tensors: the cache key holds the problem (heads, dims, dtype, decode or prefill), not the
    lengths."""
    import torch
    from bench.common import import_package
    import_package()
    from neptune_eqsat import flex_attention
    from neptune_eqsat.distributed import _split_plan
    for name, (L, S, mask) in problems(decode_kv, prefill_s).items():
        small_l = 1 if L == 1 else 32
        q, k, v = tensors(small_l, 48, "cpu")
        _split_plan(q, k, v, None, mask, None, True)
        with torch.no_grad():
            flex_attention(q, k, v, mask_mod=mask, enable_gqa=True)
        print(f"{name}: modules in {os.environ['NEPTUNE_EQSAT_CACHE']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--decode-kv", type=int, default=512 * 1024)
    ap.add_argument("--prefill-s", type=int, default=128 * 1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    if args.generate:
        generate(args.decode_kv, args.prefill_s)
        return 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.decode_kv, args.prefill_s, args.iters = 50, 40, 1
    import torch
    import torch.distributed as dist
    from bench.common import import_package
    import_package()
    from neptune_eqsat import flex_attention
    from neptune_eqsat.distributed import context_parallel_attention, ring_attention

    dist.init_process_group("gloo" if args.smoke else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu") if args.smoke else torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = []
    for name, (L, S, mask) in problems(args.decode_kv, args.prefill_s).items():
        q, k, v = tensors(L, S, device)
        cut = [S * r // world for r in range(world + 1)]
        k_mine, v_mine = (x[:, :, cut[rank]:cut[rank + 1]].contiguous() for x in (k, v))
        with torch.no_grad():
            if name == "decode":
                def ours():
                    return context_parallel_attention(q, k_mine, v_mine, mask_mod=mask, enable_gqa=True)
                mine = slice(0, L)
            else:
                q_mine = q[:, :, cut[rank]:cut[rank + 1]].contiguous()

                def ours():
                    return ring_attention(q_mine, k_mine, v_mine, mask_mod=mask, enable_gqa=True)
                mine = slice(cut[rank], cut[rank + 1])
            got = ours()
            one = flex_attention(q, k, v, mask_mod=mask, enable_gqa=True)   # every rank: the whole, for the check
            err = (got.double() - one[:, :, mine].double()).abs().max().item()
            picks = sorted({mine.start, (mine.start + mine.stop) // 2, mine.stop - 1})
            ref = float64_rows(q, k, v, picks, mask)
            err64 = (one[:, :, picks].double().cpu() - ref).abs().max().item()
            row = {"case": name, "L": L, "S": S, "world": world, "err_vs_one_gpu": err, "err_one_gpu_vs_f64": err64}
            if not (err <= 2e-2 and err64 <= 2e-2):   # NaN fails too
                row["status"] = "WRONG"
            elif not args.smoke:
                row["neptune_ranks_ms"] = timed(ours, args.iters, dist.barrier) * 1e3
                one_ms = timed(lambda: flex_attention(q, k, v, mask_mod=mask, enable_gqa=True), args.iters,
                               dist.barrier) * 1e3
                row["neptune_one_gpu_ms"] = one_ms
                row["speedup_vs_one_gpu"] = one_ms / row["neptune_ranks_ms"]
                anchor = torch_context_parallel(q, k, v, mask is not None, world)
                if callable(anchor):
                    row["torch_cp_cudnn_ms"] = timed(anchor, args.iters, dist.barrier) * 1e3
                    row["vs_torch_cp_cudnn"] = row["torch_cp_cudnn_ms"] / row["neptune_ranks_ms"]
                else:
                    row["torch_cp_cudnn"] = anchor
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        if args.smoke:
            print("smoke passed" if all(r.get("status") != "WRONG" for r in rows) else "smoke FAILED")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
            with open(os.path.join(args.out, "distributed.json"), "w") as f:
                json.dump({"gpu": gpu, "world": world, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return 0 if all(r.get("status") != "WRONG" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
