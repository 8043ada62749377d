"""Fused linear cross-entropy: the loss of logits h W^T over a vocabulary, without the logits ever stored.

The log-sum-exp over the vocabulary rolls (or splits) over vocabulary blocks, and each block's logits are a
matrix product over the hidden dim, reduced in blocks of its own inside the loop; the label's logit is the same
product at one row of W. Memory: the inputs and one value per token, where the unfused form stores T x V logits."""
from neptune_eqsat.spec import *

spec = Spec("linear_cross_entropy")
T, V = spec.dims(T=4096, V=131072)
HIDDEN = 4096
t, v, d = spec.axes(t=T, v=V, d=HIDDEN)
h = spec.input("h", f16, T, HIDDEN)            # the last hidden states
w = spec.input("w", f16, V, HIDDEN)            # the output embedding
target = spec.input("target", f32, T)          # the label's index, held as a float

logit = sum(d, h[t, d] * w[v, d])
m = max(v, logit)
lse = m + log(sum(v, exp(logit - m)))
spec.output("loss", f32, lse - sum(d, h[t, d] * w[target[t], d]), t)
