"""Global (non-causal) prefill attention: 32 query heads, 32 kv heads, head dim 128."""
from neptune_eqsat.spec import *

spec = Spec("global_pf")
B, S = spec.dims(B=1, S=4096)
H, HKV, D = 32, 32, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, HKV, S, D)
v = spec.input("v", f16, B, HKV, S, D)
hk = h // (H // HKV)                                    # the kv head that query head h reads

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)   # scores, fp32
m = max(j, s)
p = exp(s - m)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / sum(j, p)
spec.output("o", f16, o, b, h, i, e)
