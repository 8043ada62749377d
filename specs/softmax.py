"""Row softmax: y[r, j] = exp(x[r, j] - max_j x) / sum_j exp(x[r, j] - max_j x). No attention anywhere."""
from neptune_eqsat.spec import *

spec = Spec("softmax")
R, N = spec.dims(R=4096, N=4096)
r, j = spec.axes(r=R, j=N)
x = spec.input("x", f32, R, N)

m = max(j, x[r, j])
p = exp(x[r, j] - m)
spec.output("y", f32, p / sum(j, p), r, j)
