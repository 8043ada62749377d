"""The quick tier a first call runs on a GPU (runtime/ahead.py): the same plan with one masked loop per pass
(ONE_LOOP), a split plan's combine in its own kernel and no Gluon kernel. Each shipped spec's quick config,
under the interpreter, against float64 and against the tuned config's output."""
import threading

import pytest
import torch

from conftest import DEVICE, SPECS, compiled, on_device, spec_variant
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance

SIZES = {"B": 1, "S": 21, "Q": 3, "SKV": 37, "R": 3, "N": 40, "V": 40, "T": 3, "M": 20}
SHIPPED = sorted(p.stem for p in SPECS.glob("*.py"))


def quick_config(mod):
    """The module's quick config; under the interpreter with its own small blocks and warps (QUICK's are the
    GPU's), so that the tiles still span several blocks at these sizes."""
    quick = mod.QUICK if DEVICE == "cuda" else {k: v for k, v in mod.QUICK.items()
                                                 if not k.startswith("BLOCK_") and k != "num_warps"}
    return mod._QuickConfig(quick)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_quick_config_matches_float64(name):
    result, mod = compiled(str(SPECS / f"{name}.py"))
    if not hasattr(mod, "QUICK"):
        pytest.skip("a staged module: each stage's module has its own quick tier")
    if "ONE_LOOP" in mod.CONFIG:
        assert mod.QUICK["ONE_LOOP"] == 1 and "if ONE_LOOP:" in result.source
    if "COMBINE" in mod.CONFIG:
        assert mod.QUICK["COMBINE"]["in_kernel"] == 0
    if "BACKEND" in mod.CONFIG:
        assert mod.QUICK["BACKEND"] == "triton"
    assert all(v != 0 for k, v in {**mod.CONFIG, **mod.QUICK}.items() if k.startswith("BLOCK_"))   # no row-sized block
    inputs = random_inputs(result.spec, {d: SIZES[d] for d in SIZES if d in result.spec.dims_}, seed=5)
    quick = on_device(mod.forward, *inputs.values(), config=quick_config(mod))
    tuned = on_device(mod.forward, *inputs.values())
    ref = evaluate(result.spec, inputs)
    assert not torch.isnan(quick).any()
    # relative to the output's size where it is large (a loss over a long hidden dim, summed on the GPU in
    # another order than float64's)
    tol = tolerance(result.spec.output_dtype) * max(1.0, ref.abs().max().item())
    assert (quick.double() - ref).abs().max().item() <= tol
    assert (quick.double() - tuned.double()).abs().max().item() <= tol


@pytest.mark.parametrize("name, mask, sizes", [
    ("causal_pf", "(i // 8 >= j // 8) & (j % 3 != 1)", {"B": 1, "S": 45}),     # listed blocks, prefill
    ("causal_dc", "(j <= i + SKV - Q) & (j % 5 != 2)", {"B": 1, "Q": 2, "SKV": 70}),   # listed blocks, split
])
def test_the_quick_config_of_a_listed_mask_matches_float64(tmp_path, name, mask, sizes):
    """A mask that is not a linear bound: the kernel loops over lists of partial and full key blocks, which the
    quick kernel walks as one list with the mask applied throughout."""
    old = "where(i >= j, s, -inf)" if name == "causal_pf" else "where(j <= i + SKV - Q, s, -inf)"
    path = spec_variant(tmp_path, name, {old: f"where({mask}, s, -inf)"})
    result, mod = compiled(path)
    assert "_block_table(" in result.source and mod.QUICK["ONE_LOOP"] == 1
    inputs = random_inputs(result.spec, sizes, seed=2)
    quick = on_device(mod.forward, *inputs.values(), config=quick_config(mod))
    ref = evaluate(result.spec, inputs)
    assert not torch.isnan(quick).any()
    assert (quick.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype)


def quick_compiles(mod) -> int:
    """How many compiled kernels the module's quick-tier twins hold."""
    return sum(len(caches[0]) for twin, _ in mod._ANY_LENGTH.values() if hasattr(twin, "device_caches")
               for caches in twin.device_caches.values())


@pytest.mark.skipif(DEVICE != "cuda", reason="Triton compiles kernels on a GPU only")
@pytest.mark.parametrize("name, length, first, later", [("causal_pf", "S", {"B": 1, "S": 64}, [65, 100, 1000]),
                                                        ("gqa_dc", "SKV", {"B": 1, "Q": 1, "SKV": 1000},
                                                         [1009, 4096, 77]),
                                                        ("softmax", "N", {"R": 4, "N": 1000}, [1500, 3000, 77])])
def test_right_after_a_first_call_new_lengths_run_the_quick_kernels_compiled_once(name, length, first, later,
                                                                                 monkeypatch):
    """Before the tuned kernels are ready (compiling ahead on, nothing waited for), calls at lengths of both
    classes and other chunk counts take the quick kernels the first call compiled: nothing compiles again."""
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", "1")
    path = str(SPECS / f"{name}.py")
    result, mod = compiled(path)
    mod.wait_for_compiles()
    mod._PENDING.clear(), mod._COMPILED.clear(), mod._REPLAYS.clear()   # as a fresh process would hold them
    gate, submit = threading.Event(), mod._in_background

    def held_back(device, job, background=False):   # the tuned kernels stay compiling until the calls are done
        return submit(device, (lambda: (gate.wait(120), job())[1]) if background else job, background)
    monkeypatch.setattr(mod, "_in_background", held_back)
    before = None
    for n in [first[length]] + later:
        sizes = dict(first, **{length: n})
        inputs = random_inputs(result.spec, sizes, seed=n)
        out = on_device(mod.forward, *inputs.values())
        assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance(result.spec.output_dtype)
        before = quick_compiles(mod) if before is None else before
    assert quick_compiles(mod) == before
    gate.set()
    mod.wait_for_compiles()


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_a_cuda_graph_captured_while_the_tuned_kernels_compile(monkeypatch):
    """A caller capturing CUDA graphs (globally, as torch does by default) right after a first call: the
    background compiles make no CUDA call that would break the capture (they do not load their kernels)."""
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", "1")
    path = str(SPECS / "causal_dc.py")
    result, mod = compiled(path)
    mod.wait_for_compiles()
    mod._PENDING.clear(), mod._COMPILED.clear(), mod._REPLAYS.clear()
    inputs = random_inputs(result.spec, {"B": 1, "Q": 1, "SKV": 3000}, seed=1)
    on_device(mod.forward, *inputs.values())
    x = torch.ones(1024, device="cuda")
    captured = 0
    while any(not f.done() for f in mod._BACKGROUND) or captured < 3:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
        graph.replay()
        captured += 1
    torch.cuda.synchronize()
    assert y.sum().item() == 2048 and captured >= 3


def test_wait_for_compiles_waits_for_every_loaded_module():
    """neptune_eqsat.wait_for_compiles(): the background compiles of each generated module loaded (here a job
    on one module's background thread), including the modules a staged module carries."""
    import time

    import neptune_eqsat
    _, mod = compiled(str(SPECS / "causal_pf.py"))
    _, staged = compiled(str(SPECS / "joint_softmax.py"))
    assert callable(staged.wait_for_compiles)
    done = []
    mod._in_background(torch.device("cpu"), lambda: (time.sleep(0.2), done.append(1)), True)
    neptune_eqsat.wait_for_compiles()
    assert done == [1]
