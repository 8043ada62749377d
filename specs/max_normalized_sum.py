"""A chain nobody wrote a kernel for: y[r] = sum_j x[r, j] / max_j x[r, j], over positive x.

The sum depends on the finished max; rolling update repairs the running sum with h(t, r, r') = t * r / r'.
"""
from neptune_eqsat.spec import *

spec = Spec("max_normalized_sum")
R, N = spec.dims(R=4096, N=4096)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N, positive=True)

spec.output("y", f32, sum(j, x[r, j] / max(j, x[r, j])), r)
