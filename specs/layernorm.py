"""LayerNorm as people write it: the row mean, then the mean squared deviation from that mean, over a long row.

The variance waits for the mean; the rolling update of its sum repairs with the prefix's lower moments (a count
and a first moment), and with the mean read as sum / count the loop is Welford's: one pass, no cancellation."""
from neptune_eqsat.spec import *

spec = Spec("layernorm")
R, N = spec.dims(R=4096, N=8192)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f16, R, N)
w = spec.input("w", f16, N)
bias = spec.input("b", f16, N)

mean = sum(j, x[r, j]) / N
var = sum(j, (x[r, j] - mean) * (x[r, j] - mean)) / N
spec.output("y", f16, (x[r, j] - mean) / sqrt(var + 1e-5) * w[j] + bias[j], r, j)
