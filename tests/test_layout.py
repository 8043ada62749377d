"""The package's folders are the pipeline's stages, and imports run one way between them.

    ir -> proof -> rules;  ir -> frontend -> plan (-> rules, tune, runtime) -> codegen;  runtime, tune: leaves
    compiler, cli, flex, training, compiled, spec: on top

Code generation takes a plan and emits it: from the planner it imports only the plan's data types, never a
planning function, and nothing of tuning. No module imports the package inside a function to dodge a cycle
(the CLI imports its commands' stages lazily, for start-up time, and the run-time cache of compiled modules
imports the compiler on a miss only; they are exempt), and no module is long."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"neptune_eqsat": ROOT / "neptune_eqsat", "neptune_eqsat.rules": ROOT / "rules",
           "neptune_eqsat.codegen": ROOT / "codegen"}
ALLOWED = {
    "ir": {"ir"},
    "proof": {"ir", "proof"},
    "rules": {"ir", "proof", "rules"},
    "runtime": {"runtime"},
    "tune": {"tune", "runtime"},
    "frontend": {"ir", "frontend"},
    "plan": {"ir", "proof", "rules", "frontend", "plan", "tune", "runtime"},
    "codegen": {"ir", "frontend", "codegen", "runtime", "plan"},
}
PLAN_TYPES = {"Plan", "Schedule", "Combine", "Partial", "Backward", "GradPart", "Stage"}   # what codegen may take from plan/
# start-up time, and kernels from a filled cache without the compiler installed (flex_attention imports it for a
# gradient only; the rules build their e-graph patterns and rulesets, which need egglog, when first asked for, so
# a backward is derived without it): see their docstrings
LAZY_IMPORTS_ALLOWED = {"neptune_eqsat.cli", "neptune_eqsat", "neptune_eqsat.compiled", "neptune_eqsat.flex",
                        "neptune_eqsat.rules", "neptune_eqsat.proof.rulebook"}
MAX_LINES = 420


def modules():
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([package] + parts), path


def stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "top"


def imports(module: str, path: Path):
    """(imported module, names, inside a function) of each import of the package."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= {id(n) for n in ast.walk(node)} - {id(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("neptune_eqsat"):
                names = {a.name for a in node.names}
                for name in names:   # `from neptune_eqsat.plan import autodiff` imports a module
                    target = f"{base}.{name}" if f"{base}.{name}" in ALL_MODULES else base
                    yield target, names, id(node) in in_function
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("neptune_eqsat"):
                    yield a.name, set(), id(node) in in_function


ALL_MODULES = dict(modules())


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_imports_run_one_way(module):
    here = stage(module)
    if here == "top":
        return
    for target, names, _ in imports(module, ALL_MODULES[module]):
        there = stage(target)
        assert there in ALLOWED[here], f"{module} ({here}) imports {target} ({there})"
        if here == "codegen" and there == "plan":
            assert names <= PLAN_TYPES, f"{module} imports {sorted(names - PLAN_TYPES)} from the planner ({target})"


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_no_import_of_the_package_inside_a_function(module):
    if module in LAZY_IMPORTS_ALLOWED:
        return
    late = [target for target, _, inside in imports(module, ALL_MODULES[module]) if inside]
    assert not late, f"{module} imports {late} inside a function"


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_modules_stay_small(module):
    lines = len(ALL_MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def test_the_checks_see_a_wrong_import():
    """The direction check reads relative and absolute imports (a wrong one planted in a copy is found)."""
    source = "from neptune_eqsat.plan.extract import candidates\nfrom ..plan.schedule import schedule\n"
    path = ROOT / "codegen" / "kernel.py"
    planted = path.with_name("_planted_for_test.py")
    planted.write_text(source)
    try:
        found = list(imports("neptune_eqsat.codegen._planted_for_test", planted))
    finally:
        planted.unlink()
    assert [(t, n) for t, n, _ in found] == [("neptune_eqsat.plan.extract", {"candidates"}),
                                             ("neptune_eqsat.plan.schedule", {"schedule"})]
