"""neptune-eqsat: an equality-saturation superoptimizer for chains of reductions (attention, softmax, norms).

`flex_attention` is the FlexAttention-compatible front end; `neptune_eqsat.compiler.optimize` compiles a spec.
`wait_for_compiles()` waits for the tuned kernels that replace a first call's quick ones (time calls after it).
The front end imports torch, so it is loaded on first use: the spec language and the compiler do not need it.
"""

__all__ = ["flex_attention", "wait_for_compiles"]


def __getattr__(name: str):
    if name == "flex_attention":
        from neptune_eqsat.flex import flex_attention
        return flex_attention
    if name == "wait_for_compiles":   # the tuned kernels that replace a first call's quick ones, compiled
        from neptune_eqsat.runtime.loader import wait_for_compiles
        return wait_for_compiles
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
