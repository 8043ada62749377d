import sys, time, torch
sys.path.insert(0, "bench")
import masks as M
from neptune_eqsat import flex_attention, flex
import triton.testing as tt
S=4096
mm,sm,hkv=M.masks(S,"cuda")["document_causal"]
q,k,v=(torch.randn(1,32,S,128,device="cuda",dtype=torch.float16) for _ in range(3))
fn=lambda: flex_attention(q,k,v,mask_mod=mm)
fn(); torch.cuda.synchronize()
print("call", tt.do_bench(fn, rep=100))
mod=[m for m in flex._VARIANTS.values()][0].module
build=[getattr(mod,n) for n in dir(mod) if "_blocks0" in n][0]
cap=flex._CAPTURES[list(flex._CAPTURES)[0]][0].float()
print("build", tt.do_bench(lambda: build(128,128,q.device,S,S,cap), rep=100))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(3): fn()
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cpu_time_total", row_limit=25))
