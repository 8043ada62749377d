"""Spec files: a Python file of the spec language (`from neptune_eqsat.spec import *`) run to the Spec it
defines, with an error in it reported at its line."""
from __future__ import annotations

import runpy
from pathlib import Path

from neptune_eqsat.frontend.spec import Spec, SpecError


def load_spec(path: str | Path) -> Spec:
    """Run a spec file and return its Spec (the variable `spec`, or the only Spec it defines)."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: no such spec file")
    try:
        scope = runpy.run_path(str(path), run_name="__neptune_spec__")
    except SpecError:
        raise
    except SyntaxError as e:
        raise SpecError(f"{path.name}:{e.lineno}: syntax error: {e.msg}") from e
    except Exception as e:  # report the spec line that raised
        tb = e.__traceback__
        line = None
        while tb is not None:
            if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
                line = tb.tb_lineno
            tb = tb.tb_next
        raise SpecError(f"{path.name}:{line}: {type(e).__name__}: {e}") from e
    specs = [v for v in scope.values() if isinstance(v, Spec)]
    spec = scope.get("spec") if isinstance(scope.get("spec"), Spec) else (specs[0] if len(specs) == 1 else None)
    if spec is None:
        raise SpecError(f"{path.name}: defines no Spec (expected a variable `spec = Spec(...)`)")
    if not spec.doc:
        spec.doc = (scope.get("__doc__") or "").strip()
    spec.validate()
    return spec
