"""Loading generated modules from source (they are plain Python files importing torch and triton)."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def load_module(source: str, name: str) -> ModuleType:
    """Import generated source; Triton needs the kernel in a real file to read its text."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "neptune_eqsat_kernels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{digest}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    mod_name = f"neptune_generated_{name}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    return import_file(path, mod_name)


_LOADED: list[ModuleType] = []   # every generated module imported here, in order


def import_file(path: Path, name: str) -> ModuleType:
    """Import the module at `path` as `name`; it is registered once it has run (a module that fails is not)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    _LOADED.append(module)
    return module


def wait_for_compiles() -> None:
    """Block until every background compile of the generated modules loaded so far has finished: the tuned
    kernels that replace a first call's quick ones (runtime/ahead.py). Time calls after this."""
    for module in list(_LOADED):
        wait = getattr(module, "wait_for_compiles", None)
        if wait is not None:
            wait()
