"""sympy, imported on first use.

Importing sympy takes about 0.3 s, and a compile whose rule proofs and repair derivations are all in the verdict
cache (verdicts.py) never calls it. Modules that prove things write `from neptune_eqsat.proof.lazy import sympy
as sp` and build their sympy expressions inside the functions that prove (never at import).
"""
from __future__ import annotations

import importlib


class LazyModule:
    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


sympy = LazyModule("sympy")
