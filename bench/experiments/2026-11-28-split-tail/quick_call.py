"""One backward call of a generated global-attention module (32 heads, fp16) at S = 4000 and 4096, to see that
it returns (run under `timeout` before a longer timing: a kernel whose programs wait on each other hangs).

    PYTHONPATH=. timeout 60 python bench/experiments/2026-11-28-split-tail/quick_call.py MODULE
"""
import sys

import torch

from bench.common import load_module

module = load_module(sys.argv[1])
for S in (4000, 4096):
    q, k, v = (torch.randn(1, 32, S, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out, saved = module.forward_saved(q, k, v)
    grads = module.backward(q, k, v, out=out, grad_out=torch.randn_like(out), saved=saved)
    torch.cuda.synchronize()
    print("returned", S, [g.abs().max().item() for g in grads], flush=True)
