"""Kernels are data before they are text: a Triton kernel is a `Kernel` (parameters, head, prologue, passes,
epilogue) that `render` draws, and the warp-specialized Gluon kernel is chosen by matching its roles."""
from conftest import SPECS, compiled

from neptune_eqsat.codegen.gluon import WarpSpecialized, match_warp_specialized
from neptune_eqsat.codegen.triton_kernel import render, triton_kernel


def test_a_rolled_softmax_is_one_pass_and_the_unfused_one_two():
    result, _ = compiled(str(SPECS / "softmax.py"))
    by_family = {c.family: c for c in result.candidates}
    rolled, _ = triton_kernel(by_family["rolled"].sched, "softmax")
    unfused, _ = triton_kernel(by_family["unfused"].sched, "softmax")
    assert len(rolled.passes) == 1 and len(unfused.passes) == 2
    # one masked loop for a first call's quick kernel (ONE_LOOP), else masked, full and masked blocks
    for p in rolled.passes + unfused.passes:
        assert p.loops[0] == "if ONE_LOOP:" and p.loops[1].strip().startswith("for start in range(lo, hi,")
        assert sum(x.startswith("    for start in range(") for x in p.loops) == 4
    assert "ONE_LOOP" in rolled.constexprs
    assert "x_ptr" in rolled.params and "BLOCK_J" in rolled.constexprs


def test_the_module_holds_the_rendered_kernel():
    result, _ = compiled(str(SPECS / "causal_pf.py"))
    kernel, _ = triton_kernel(result.chosen.sched, "causal_pf")
    assert render(kernel) in result.source
    assert kernel.epilogue[0] == "# epilogue" and kernel.unspecialized == ["B"]


def test_the_warp_specialized_match_names_its_roles_or_why_not():
    prefill, _ = compiled(str(SPECS / "global_pf.py"))
    matched = match_warp_specialized(prefill.chosen.sched, "global_pf")
    assert isinstance(matched, WarpSpecialized)
    assert set(matched.writer.operands) == {"a", "b", "v"} and matched.writer.product is not None
    decode, _ = compiled(str(SPECS / "causal_dc.py"))
    assert "not a rolled pass" in match_warp_specialized(decode.chosen.sched, "causal_dc")
