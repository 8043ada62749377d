"""Grouped-query causal prefill attention: 64 query heads share 8 kv heads, head dim 128, query i sees keys j <= i."""
from neptune_eqsat.spec import *

spec = Spec("gqa_pf")
B, S = spec.dims(B=1, S=4096)
H, HKV, D = 64, 8, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, HKV, S, D)
v = spec.input("v", f16, B, HKV, S, D)
hk = h // (H // HKV)

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)
s = where(i >= j, s, -inf)                              # masked scores are -inf
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))                     # a fully masked row has max -inf: all its weights are 0
l = sum(j, p)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / where(l == 0, 1, l)   # ... and its output is 0
spec.output("o", f16, o, b, h, i, e)
