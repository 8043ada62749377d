"""neptune-eqsat: an equality-saturation superoptimizer for chains of reductions (attention, softmax, norms).

`flex_attention` is the FlexAttention-compatible front end; `neptune_eqsat.compiler.optimize` compiles a spec.
The front end imports torch, so it is loaded on first use: the spec language and the compiler do not need it.
"""

__all__ = ["flex_attention"]


def __getattr__(name: str):
    if name == "flex_attention":
        from neptune_eqsat.flex import flex_attention
        return flex_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
