"""Grouped-query decode attention: 64 query heads share 8 kv heads, head dim 128. The Q newest queries (Q = 1 for plain decode, 2-16 for
speculative decoding) sit at the end of a KV cache of length SKV and see keys j <= SKV - Q + i."""
from neptune_eqsat.spec import *

spec = Spec("gqa_dc")
B, Q, SKV = spec.dims(B=1, Q=1, SKV=32768)
H, HKV, D = 64, 8, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=Q, j=SKV, d=D, e=D)
q = spec.input("q", f16, B, H, Q, D)
k = spec.input("k", f16, B, HKV, SKV, D)
v = spec.input("v", f16, B, HKV, SKV, D)
hk = h // (H // HKV)

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)
s = where(j <= i + SKV - Q, s, -inf)                    # bottom-right causal
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
l = sum(j, p)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / where(l == 0, 1, l)
spec.output("o", f16, o, b, h, i, e)
