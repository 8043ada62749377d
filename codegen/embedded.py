"""Kernel modules carried inside another module as their sources, imported from that source when first used.

A module made of several generated modules (a staged forward, a backward with its stages and gradient kernels)
keeps each one whole, as text, and registers it with linecache when it is imported, since Triton reads a
kernel's text through linecache. The carrying module imports only torch and triton.
"""
from __future__ import annotations

import textwrap

from neptune_eqsat import ir
from neptune_eqsat.frontend.spec import Spec

TORCH_DTYPE = {d: f"torch.{name}" for d, name in ir.TORCH_NAMES.items()}

LOADER = textwrap.dedent('''
    def _module(name):
        """A kernel module imported from its source (Triton reads kernel text through linecache)."""
        if name not in _MODULES:
            src, file = _SOURCES[name], f"<neptune-eqsat {__name__}.{name}>"
            linecache.cache[file] = (len(src), None, src.splitlines(True), file)
            mod = types.ModuleType(f"{__name__}_{name}")
            mod.__file__ = file
            exec(compile(src, file, "exec"), mod.__dict__)
            _MODULES[name] = mod
        return _MODULES[name]


    def wait_for_compiles():
        """Block until the background compiles of every kernel module loaded so far have finished."""
        for mod in list(_MODULES.values()):
            mod.wait_for_compiles()


    def _run(name, t, reads):
        """Module `name`'s forward on the tensors of `t` it reads, each in the dtype its spec declares."""
        return _module(name).forward(*(t[n].to(dtype).contiguous() for n, dtype in reads))
    ''').strip()


def sources_table(sources: dict[str, str]) -> list[str]:
    """The lines that hold the modules' sources, the imports the loader needs, and the loader."""
    return (["import linecache", "import types", "", "import torch", "", "_SOURCES = {"]
            + [f"    {name!r}: {src!r}," for name, src in sources.items()]
            + ["}", "_MODULES = {}", "", "", LOADER])


def reads(spec: Spec) -> str:
    """The (name, dtype) pairs of a spec's inputs, as the text of a tuple for `_run`."""
    return "(" + "".join(f"({n!r}, {TORCH_DTYPE[t.dtype]}), " for n, t in spec.inputs.items()) + ")"
