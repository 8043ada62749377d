"""Softmax cross-entropy with a label per row: logsumexp_j(x[r, j]) - x[r, target[r]] (target: the label's
index, held as a float)."""
from neptune_eqsat.spec import *

spec = Spec("cross_entropy")
R, V = spec.dims(R=4096, V=32768)
r, j = spec.axes(r=R, j=V)
x = spec.input("x", f32, R, V)
target = spec.input("target", f32, R)
m = max(j, x[r, j])
logsumexp = m + log(sum(j, exp(x[r, j] - m)))
spec.output("loss", f32, logsumexp - x[r, target[r]], r)
