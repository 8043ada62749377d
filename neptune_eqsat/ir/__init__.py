"""The IR: terms (`term.py`), the op registry every evaluator and emitter reads (`ops.py`), and the same terms
as egglog classes for the e-graph (`eterm.py`).

`from neptune_eqsat import ir` gives the term constructors (`ir.bin`, `ir.red`, `ir.walk`, ...)."""
from neptune_eqsat.ir.term import *  # noqa: F401,F403
