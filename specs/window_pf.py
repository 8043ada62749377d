"""Sliding-window causal prefill attention with soft-capping (Gemma-2 local layers): keys i-4095 .. i; 32/8 heads."""
from neptune_eqsat.spec import *

spec = Spec("window_pf")
B, S = spec.dims(B=1, S=4096)
H, HKV, D = 32, 8, 128
CAP, WINDOW = 50.0, 4096
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, HKV, S, D)
v = spec.input("v", f16, B, HKV, S, D)
hk = h // (H // HKV)

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)
s = CAP * tanh(s / CAP)
s = where((i >= j) & (i - j < WINDOW), s, -inf)
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
l = sum(j, p)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / where(l == 0, 1, l)
spec.output("o", f16, o, b, h, i, e)
