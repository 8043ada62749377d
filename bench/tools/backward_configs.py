"""Tunables of the backward's gradient kernels, measured: each kernel of a generated backward module (`python -m
bench.suite.backward --generate`) run with each candidate config while the others keep their defaults, the
whole backward timed (with the saved values from forward_saved, as a training step has them).

    python -m bench.tools.backward_configs --ops causal_pf,gqa_pf --seqs 4096,16384 --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench import common
from bench.suite.attention import D, OPS, alibi_slopes, work
from bench.suite.backward import GENERATED, load_module

# (rows, loop block, warps, pipeline stages): the rows are the kernel's output rows (keys for dK and dV,
# queries for dQ), the loop block what each step of its loop takes of the other axis
CANDIDATES = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (128, 32, 4, 3),
              (64, 64, 4, 3), (64, 128, 8, 3), (64, 64, 8, 2), (128, 64, 4, 2)]


def configs(module, kernel: str) -> list[dict]:
    cfg = module._module(kernel).CONFIG
    row, loop = (k for k in cfg if k.startswith("BLOCK_"))   # rows first (module.default_blocks)
    return [{row: r, loop: b, "num_warps": w, "num_stages": s} for r, b, w, s in CANDIDATES]


def main() -> None:
    import triton.testing
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="causal_pf")
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for name in args.ops.split(","):
        op = OPS[name]
        module = load_module(GENERATED / f"{name}_{args.dtype}.py")
        run_default = module._run
        for S in (int(s) for s in args.seqs.split(",")):
            q, k, v = (torch.randn(1, h, S, D, device="cuda", dtype=dt) for h in (op.hq, op.hkv, op.hkv))
            inputs = (q, k, v, alibi_slopes(op.hq, "cuda")) if op.mod == "alibi" else (q, k, v)
            out, saved = module.forward_saved(*inputs)
            grad = torch.randn_like(out)
            flops = 2.5 * work(op, 1, S, S)[0]
            for kernel in module.GRADIENT_KERNELS:
                for cfg in [None] + configs(module, kernel):
                    def run(name_, t, reads, cfg=cfg, kernel=kernel):
                        if name_ != kernel or cfg is None:
                            return run_default(name_, t, reads)
                        mod = module._module(name_)
                        return mod.forward(*(t[n].to(dtype).contiguous() for n, dtype in reads), config=cfg)
                    module._run = run
                    row = {"op": name, "S": S, "kernel": kernel, "config": cfg or "default"}
                    try:
                        ms = triton.testing.do_bench(lambda: module.backward(*inputs, out=out, grad_out=grad,
                                                                             saved=saved), warmup=20, rep=100)
                        row.update(ms=ms, tflops=flops / ms / 1e9)
                    except Exception as e:   # out of resources (shared memory, registers)
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                    module._run = run_default
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "backward_configs.json").write_text(json.dumps({"gpu": common.gpu_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
