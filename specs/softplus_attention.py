"""Softplus attention: causal, each key weighted by softplus(score), normalized by the row's total weight."""
from neptune_eqsat.spec import *

spec = Spec("softplus_attention")
B, S = spec.dims(B=1, S=4096)
H, D = 32, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, H, S, D)
v = spec.input("v", f16, B, H, S, D)

s = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
w = where(j <= i, softplus(s), 0.0)
l = sum(j, w)
o = sum(j, cast(w, f16) * v[b, h, j, e]) / where(l == 0, 1.0, l)
spec.output("o", f16, o, b, h, i, e)
