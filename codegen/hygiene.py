"""Names a spec chooses against the names a generated module uses itself.

A spec's dims and inputs become names in the module it compiles to: an input is a parameter of `forward` (and
of a split plan's `forward_partials` and `combine`), with `<input>_ptr`, `<input>_s0`, ... and descriptors in
the kernels; a dim is a local of the launchers and a parameter of every kernel. A name the generator also uses
there (a launcher's `cfg` or `out`, a kernel's `BLOCK_J` or `offs_r`, the `torch` module) would shadow one
with the other: a module that does not load, or worse, a kernel that reads the wrong value. The check reads the
generated source itself (its syntax tree), so it follows whatever names the generator uses now.
"""
from __future__ import annotations

import ast

from neptune_eqsat.frontend.spec import SpecError

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp, ast.ClassDef)


def _own_nodes(fn: ast.AST):
    """The nodes of a function's own scope (not of the functions, lambdas and comprehensions inside it)."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _is_size_read(value: ast.AST, name: str) -> bool:
    """`sizes['R']`-like: a dim's own value read from the sizes a launcher derived from the inputs' shapes."""
    return isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and value.slice.value == name


def name_clashes(source: str, dims: list[str], inputs: list[str]) -> list[str]:
    """Each clash between a spec's dim or input name and a name the module's code uses for something else."""
    tree = ast.parse(source)
    globals_ = _module_names(tree)
    kind = {**{n: "dim" for n in dims}, **{n: "input" for n in inputs}}
    found = []

    def owner(name: str) -> str | None:   # the spec name a generated name comes from (x_ptr, x_s0, x_desc1)
        return next((u for u in sorted(kind, key=len, reverse=True)
                     if name == u or name.startswith(u + "_")), None)

    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        positional = [p.arg for p in a.posonlyargs + a.args]
        params = positional + [p.arg for p in a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]]
        kernel = any("jit" in ast.unparse(d) for d in fn.decorator_list)
        if not (kernel or positional == inputs):
            continue   # a helper of the runtime (not a launcher taking the inputs): its names are its own
        for p in sorted({p for p in params if params.count(p) > 1}):
            u = owner(p)
            found.append(f"{kind.get(u, 'name')} {u or p!r}: {fn.name} would take two parameters named {p}")
        stores: dict[str, list[ast.AST]] = {}
        for node in _own_nodes(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With, ast.NamedExpr)):
                targets = (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                           if not isinstance(node, ast.With) else [i.optional_vars for i in node.items])
                value = getattr(node, "value", None)
                for t in targets:
                    for n in (ast.walk(t) if t is not None else ()):
                        if isinstance(n, ast.Name) and n.id in kind:
                            stores.setdefault(n.id, []).append(value)
        # in a kernel a spec's name is a parameter (a dim) or nothing of the spec's (an input there is x_ptr, x_s0,
        # ...: a kernel's own x, as the rounding kernel's, is no clash); in a launcher a dim is read from sizes
        local = set(params) | (set() if kernel else set(stores))
        for u in kind:
            if u not in local:
                continue
            if u in globals_:
                found.append(f"{kind[u]} {u!r}: the module's {fn.name} also uses {u} for its own {u}")
                continue
            own = [v for v in stores.get(u, []) if not _is_size_read(v, u)]
            if own:
                found.append(f"{kind[u]} {u!r}: {fn.name} assigns a value of its own to {u}")
    return sorted(set(found))


def check_names(source: str, spec) -> None:
    """Raise a SpecError naming each dim or input of `spec` that clashes with a name of its generated module."""
    clashes = name_clashes(source, list(spec.dims_), list(spec.inputs))
    if clashes:
        raise SpecError(f"spec {spec.name}: {'; '.join(clashes)} (the generated module uses these names "
                        f"itself: rename them in the spec)")
