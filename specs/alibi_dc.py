"""ALiBi decode attention: 32/32 heads and a per-head linear bias slope[h] * (j - pos) on the scores,
pos = SKV - Q + i being the query's position. The Q newest queries (Q = 1 for plain decode, 2-16 for
speculative decoding) sit at the end of a KV cache of length SKV and see keys j <= SKV - Q + i."""
from neptune_eqsat.spec import *

spec = Spec("alibi_dc")
B, Q, SKV = spec.dims(B=1, Q=1, SKV=32768)
H, HKV, D = 32, 32, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=Q, j=SKV, d=D, e=D)
q = spec.input("q", f16, B, H, Q, D)
k = spec.input("k", f16, B, HKV, SKV, D)
v = spec.input("v", f16, B, HKV, SKV, D)
slope = spec.input("slope", f32, H)
hk = h // (H // HKV)

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)
s = s + slope[h] * (j - (i + SKV - Q))                 # score mod: distance to the query's position
s = where(j <= i + SKV - Q, s, -inf)                    # bottom-right causal
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
l = sum(j, p)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / where(l == 0, 1, l)
spec.output("o", f16, o, b, h, i, e)
