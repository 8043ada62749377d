"""Run one attention kernel a few times so a profiler can read it, e.g.

    ncu --clock-control none --section SpeedOfLight -k regex:'_kernel|sdpa|fprop|fmha' --launch-skip 3 \
        --launch-count 1 python -m bench.tools.profile_kernels gqa_dc neptune --seq 32768

systems: neptune (the generated module in bench/generated), cudnn (SDPA's cuDNN backend), fa4 (FlashAttention-4's
flash_attn_func as bench.suite.attention runs it, needs flash-attn-4; not ALiBi), and for global and
causal prefill the variants of the frozen experiment
bench/experiments/2026-11-22-prefill-kernel-shapes/prefill_variants.py, written VARIANT:BLOCK_J:STAGES (e.g. tma:128:3).
Imports only torch and triton.
"""
import argparse
import json

import torch

from bench.common import BENCH, GENERATED, HEADS, cudnn_attention, load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=sorted(HEADS))
    ap.add_argument("system")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--config", type=json.loads, default=None,
                    help='neptune: config entries to override, as JSON (e.g. \'{"USE_TMA": 1}\')')
    args = ap.parse_args()
    hq, hkv = HEADS[args.op]
    decode = args.op.endswith("_dc")
    causal = args.op in ("causal_pf", "gqa_pf")
    q = torch.randn(1, hq, 1 if decode else args.seq, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, hkv, args.seq, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    extra = ()
    if args.op == "alibi_dc":
        extra = (torch.rand(hq, device="cuda", dtype=torch.float32),)
    if args.system == "neptune":
        mod = load(GENERATED / f"{args.op}.py")
        fn = lambda: mod.forward(q, k, v, *extra, config=args.config)
    elif args.system == "cudnn":
        fn = lambda: cudnn_attention(q, k, v, causal)
    elif args.system == "fa4":   # as bench.suite.attention runs it
        from bench.suite.attention_ops import OPS
        from bench.suite.attention_systems import Case, fa4
        fn = fa4(Case(OPS[args.op], q, k, v, None, "cuda"))
        if fn is None:
            raise SystemExit(f"fa4 cannot express {args.op}")
    else:
        pv = load(BENCH / "experiments" / "2026-11-22-prefill-kernel-shapes" / "prefill_variants.py",
                  prefix="bench_experiment_")
        variant, bj, stages = args.system.split(":")
        run = pv.launcher(variant, causal, dict(BLOCK_I=128, BLOCK_J=int(bj), num_warps=8,
                                               num_stages=int(stages)), 2 if causal else 0)
        fn = lambda: run(q, k, v)
    torch.cuda.synchronize()
    for _ in range(args.calls):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
