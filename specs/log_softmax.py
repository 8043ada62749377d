"""Row log-softmax: y[r, j] = x[r, j] - max_j x - log(sum_j exp(x[r, j] - max_j x))."""
from neptune_eqsat.spec import *

spec = Spec("log_softmax")
R, N = spec.dims(R=4096, N=4096)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N)

m = max(j, x[r, j])
spec.output("y", f32, x[r, j] - m - log(sum(j, exp(x[r, j] - m))), r, j)
