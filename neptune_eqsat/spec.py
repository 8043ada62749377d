"""The spec language under its public name: spec files start with `from neptune_eqsat.spec import *`.

The language lives in the front end (`frontend/spec.py`); this module only names it."""
from neptune_eqsat.frontend.spec import *  # noqa: F401,F403
from neptune_eqsat.frontend.spec import Axis, Expr, Tensor, __all__  # noqa: F401
