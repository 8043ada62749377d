"""A spec's dim and input names against the names its generated module uses itself: a clash is a clear
SpecError at compile time (it was a module that did not load, or a kernel reading the wrong value), and unusual
names that do not clash compile and run."""
import pytest

from conftest import SPECS, assert_close
from neptune_eqsat.compiler import optimize
from neptune_eqsat.spec import SpecError

SOFTMAX = '''from neptune_eqsat.spec import *
spec = Spec("named_softmax")
{R}, {N} = spec.dims({R}=64, {N}=64)
r, j = spec.axes(r={R}, j={N})
{x} = spec.input("{x}", f32, {R}, {N})
mx = max(j, {x}[r, j])
ex = exp({x}[r, j] - mx)
spec.output("y", f32, ex / sum(j, ex), r, j)
'''


def softmax_named(tmp_path, R="R", N="N", x="x"):
    path = tmp_path / f"softmax_{R}_{N}_{x}.py"
    path.write_text(SOFTMAX.format(R=R, N=N, x=x))
    return str(path)


@pytest.mark.parametrize("role, name, why", [
    ("R", "BLOCK_R", "two parameters named BLOCK_R"),     # a kernel's block size
    ("N", "offs_r", "assigns a value of its own to offs_r"),   # the row offsets of axis r (was a silent wrong answer)
    ("R", "cfg", "forward assigns a value of its own to cfg"),  # the launcher's config
    ("N", "torch", "uses torch for its own torch"),           # a module the launcher reads
    ("x", "out", "two parameters named out_ptr"),            # the output's pointer
    ("x", "device", "assigns a value of its own to device"),
    ("x", "config", "two parameters named config"),           # forward's keyword
])
def test_a_name_the_module_uses_is_refused_with_the_name(tmp_path, role, name, why):
    kind = "input" if role == "x" else "dim"
    with pytest.raises(SpecError, match=f"{kind} '{name}'.*{why}"):
        optimize(softmax_named(tmp_path, **{role: name}))


def test_a_dim_named_like_a_gluon_kernel_argument_is_refused(tmp_path):
    """GROUP is a runtime argument of the warp-specialized kernel under a causal mask (its grouped tile order),
    so an attention spec may not name a dim GROUP; a softmax, whose kernels take no GROUP, may."""
    text = (SPECS / "causal_pf.py").read_text().replace("B, S = spec.dims(B=1, S=4096)",
                                                          "B, GROUP = spec.dims(B=1, GROUP=4096)")
    text = text.replace(", S, D)", ", GROUP, D)").replace("i=S, j=S", "i=GROUP, j=GROUP")
    path = tmp_path / "causal_group.py"
    path.write_text(text)
    with pytest.raises(SpecError, match="dim 'GROUP'.*two parameters named GROUP"):
        optimize(str(path))
    assert_close(softmax_named(tmp_path, N="GROUP"), {"R": 3, "GROUP": 37}, seed=1)


@pytest.mark.parametrize("R, N, x", [("tile", "grid", "mask"), ("ROWS", "slot", "scale"), ("B", "S", "bias")])
def test_unusual_names_that_do_not_clash_compile_and_run(tmp_path, R, N, x):
    assert_close(softmax_named(tmp_path, R=R, N=N, x=x), {R: 3, N: 37}, seed=2)
