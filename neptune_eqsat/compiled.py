"""Generated modules compiled once and cached, in memory and on disk, for the front ends that compile at run time
(the FlexAttention API, the backward pass of `training.py`), and the switch that runs their kernels under
Triton's interpreter for CPU tensors.

A module is cached under a key of the compiler's own source and the traced problem, so a cached kernel of
another version of the compiler is never reused; the disk cache is shared by processes (atomic writes). The
compiler is imported on a miss only: a machine whose cache another filled runs the kernels with torch and
triton alone, and a call that hits the cache does not wait for egglog and sympy to import."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

import torch

from neptune_eqsat.frontend.spec import Spec
from neptune_eqsat.runtime.loader import import_file

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # no GPU: Triton can only interpret here, and it fixes that choice when it is first imported
    os.environ["TRITON_INTERPRET"] = "1"

_MEMORY: dict[tuple, ModuleType] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("NEPTUNE_EQSAT_CACHE", Path(tempfile.gettempdir()) / "neptune_eqsat_cache"))


def _store(source: str, key: str) -> Path:
    """The module's source in the disk cache, written atomically: processes sharing the cache see the old file
    or the new one."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"flex_{key}.py"
    if not path.exists() or path.read_text() != source:
        tmp = folder / f".flex_{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(source)
        tmp.replace(path)
    return path


def cached_source(key: str, spec: Spec, spec_file: str = "flex_attention", plan: str | None = None) -> Path:
    """The generated module of a traced spec in the disk cache, optimized now if it is not there yet; not
    imported (a machine without a GPU can fill the cache for one with). `spec_file` names where the spec came
    from in the module's header; `plan` forces a plan family (the key must name it)."""
    path = cache_dir() / f"flex_{key}.py"
    if not path.exists():
        from neptune_eqsat import compiler   # only on a miss: a filled cache runs without egglog or sympy
        _store(compiler.optimize(spec, spec_file=spec_file, out_file=path.name, plan=plan).source, key)
    return path


def _load(source: str, key: str, interpret: bool) -> ModuleType:
    """Import a generated module; kernels are interpreted (CPU tensors) when `interpret` is set."""
    path = _store(source, key)
    name = f"neptune_flex_{key}_{'interpreted' if interpret else 'compiled'}"
    with triton_interpret(interpret):   # Triton decides interpreted or compiled when a kernel is defined
        return import_file(path, name)


@functools.lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of the compiler's own source: a cached kernel from another version of it is not reused."""
    here = Path(__file__).resolve().parent   # the package
    folders = [here]
    for sub in ("codegen", "rules"):   # installed as subpackages, or beside the package in a source tree
        found = importlib.util.find_spec(f"neptune_eqsat.{sub}")
        folders.append(Path(list(found.submodule_search_locations)[0]) if found else here.parent / sub)
    h = hashlib.sha256()
    for folder in folders:
        for f in sorted(folder.rglob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def compiled_module(key: str, spec: Spec, interpret: bool, spec_file: str = "flex_attention",
                    plan: str | None = None) -> ModuleType:
    """The generated module for a traced spec: from memory, else from the disk cache, else optimized now (with
    the plan family `plan` where given)."""
    if plan is not None:
        key = f"{key}_{plan}"
    mod = _MEMORY.get((key, interpret))
    if mod is not None:
        return mod
    with _LOCK:
        mod = _MEMORY.get((key, interpret))
        if mod is None:
            source = cached_source(key, spec, spec_file, plan).read_text()
            mod = _MEMORY[(key, interpret)] = _load(source, key, interpret)
    return mod


# ---- the torch operator ---------------------------------------------------------------------------------------
# A plan names traced callables and a problem; the operator runs its kernels. Under torch.compile the plan is
# made while the model is traced (its name is a constant of the graph) and the operator is one opaque node.


def run_kernels(device: torch.device, call):
    """call(), which runs generated kernels: as it is on a GPU, under Triton's interpreter on the CPU (which
    reads the setting while it runs, too)."""
    if device.type != "cpu":
        return call()
    _check_interpreter()
    from neptune_eqsat.runtime.launch import _interpreter_lock
    with _interpreter_lock(), triton_interpret(True):   # (one thread at a time: the setting is process-wide)
        return call()


def _check_interpreter() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.standard.max, InterpretedFunction):
        raise RuntimeError("CPU tensors run the kernels under Triton's interpreter, which Triton enables only when "
                           "TRITON_INTERPRET=1 is set before it is first imported; set it before importing torch "
                           "or triton")


@contextlib.contextmanager
def triton_interpret(on: bool):
    """TRITON_INTERPRET set to `on` for the duration, then restored."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def refuse_second_order(what: str) -> None:
    """In a backward of generated gradient kernels: a RuntimeError where autograd records it for a second order
    (create_graph=True), whose gradients would come back detached, a gradient penalty silently a constant."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{what}: its backward is not differentiable again (a second-order gradient, "
                           "create_graph=True): its gradients are computed by kernels autograd does not trace")
