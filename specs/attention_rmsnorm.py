"""Attention followed by an RMSNorm of its output over the value axis (QK-norm style post-normalization)."""
from neptune_eqsat.spec import *

spec = Spec("attention_rmsnorm")
B, S = spec.dims(B=1, S=4096)
H, D = 32, 128
b, h, i, j, d, e = spec.axes(b=B, h=H, i=S, j=S, d=D, e=D)
q = spec.input("q", f16, B, H, S, D)
k = spec.input("k", f16, B, H, S, D)
v = spec.input("v", f16, B, H, S, D)
g = spec.input("g", f32, D)                    # the norm's gain per value channel

s = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
m = max(j, s)
p = exp(s - m)
o = sum(j, cast(p, f16) * v[b, h, j, e]) / sum(j, p)
# the mean square reduces over e while the output runs over e: the kernel holds the two as separate tiles
out = o * g[e] / sqrt(sum(e, o * o) / D + 1e-6)
spec.output("o", f16, out, b, h, i, e)
