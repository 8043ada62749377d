"""neptune-eqsat: an equality-saturation superoptimizer for chains of reductions (attention, softmax, norms).

`flex_attention` is the FlexAttention-compatible front end; `neptune_eqsat.compiler.optimize` compiles a spec.
"""
from .flex import flex_attention

__all__ = ["flex_attention"]
