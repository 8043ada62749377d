"""The front ends: the spec language (`spec.py`), the FlexAttention tracer (`flex_trace.py`, `aten_trace.py`),
the float64 reference of a spec (`reference.py`) and the index checks of captured tensors (`bounds.py`)."""
