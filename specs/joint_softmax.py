"""A softmax over two long axes jointly (each batch's whole i x j matrix). No one kernel runs it -- a kernel loops
over one long axis -- so it is planned as stages, each a spec fused on its own: the rows' maxima, their maximum,
the rows' sums, then the output."""
from neptune_eqsat.spec import *

spec = Spec("joint_softmax")
B, N, M = spec.dims(B=8, N=4096, M=4096)
b, i, j = spec.axes(b=B, i=N, j=M)
x = spec.input("x", f16, B, N, M)

m = max(i, max(j, x[b, i, j]))
p = exp(x[b, i, j] - m)
spec.output("y", f16, p / sum(i, sum(j, p)), b, i, j)
