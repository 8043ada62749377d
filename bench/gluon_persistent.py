"""Times the generated Gluon kernels of global, causal and grouped-query prefill with one program per tile and with
persistent programs (WS_PERSISTENT), beside cuDNN, at S = 1k/4k/16k; each output is compared with the module's
Triton kernel first. Run from the repository root on a Hopper GPU: python bench/gluon_persistent.py
"""
import sys, torch, triton
sys.path.insert(0, "bench")
from sweep_configs import cudnn_attention, load
print(torch.cuda.get_device_name())
for op, hq, hk in (("global_pf", 32, 32), ("causal_pf", 32, 32), ("gqa_pf", 64, 8)):
    m = load(__import__("pathlib").Path(f"bench/generated/{op}.py"))
    for S in (1024, 4096, 16384):
        q = torch.randn(1, hq, S, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, hk, S, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        ref = m.forward(q, k, v, config={"BACKEND": "triton"}).float()
        t = {}
        for p in (0, 1):
            fn = lambda: m.forward(q, k, v, config={"BACKEND": "gluon", "WS_PERSISTENT": p})
            err = (fn().float() - ref).abs().max().item()
            t[p] = [triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3)]
            t[p] = (sorted(t[p])[1], err)
        causal = op != "global_pf"
        c = sorted(triton.testing.do_bench(lambda: cudnn_attention(q, k, v, causal=causal), warmup=25, rep=100, return_mode="median") for _ in range(3))[1]
        print(f"{op} S={S}: grid-per-tile {t[0][0]*1e3:.1f} us ({c/t[0][0]:.2f}x cuDNN, err {t[0][1]:.1e})  persistent {t[1][0]*1e3:.1f} us ({c/t[1][0]:.2f}x cuDNN, err {t[1][1]:.1e})  cuDNN {c*1e3:.1f} us", flush=True)
