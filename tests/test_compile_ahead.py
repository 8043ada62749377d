"""Compiling ahead (runtime/ahead.py), exercised with stand-in kernels whose warmup records what it was asked
to compile: a first call's kernels are submitted together and waited for, the same call at lengths of
Triton's other specialization class is warmed in the background, a warm pass never launches, and while a
Gluon kernel compiles calls take the Triton kernel."""
import threading

import pytest
import torch

from conftest import DEVICE, SPECS, assert_close, compiled
from neptune_eqsat.runtime import ahead, launch

INPUTS = {"q": ("float16", ("B", 4, "S", 16)), "k": ("float16", ("B", 4, "S", 16))}


class StandIn:
    """A kernel whose warmup (compile) records its arguments, after `gate` opens."""

    def __init__(self, gate=None):
        self.compiled, self.gate = [], gate

    def warmup(self, *args, grid, **cfg):
        if self.gate is not None:
            self.gate.wait(5)
        self.compiled.append(args)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("_PENDING", "_BACKGROUND"):
        monkeypatch.setattr(ahead, name, {} if name == "_PENDING" else [])
    monkeypatch.delenv("NEPTUNE_EQSAT_COMPILE_AHEAD", raising=False)
    yield
    ahead.wait_for_compiles()


def module_forward(kernels, launched):
    """A forward shaped like a generated module's: two kernels, submitted in a warm pass, launched otherwise."""
    def forward(q, k, *, config=None):
        for n, kernel in enumerate(kernels):
            args = (q, k, q.shape[2])
            if ahead._warming():
                key = (kernel, *map(launch._specialization, args))
                ahead._AHEAD.futures.append(ahead._submit(key, q.device, kernel, (1,), args, {}))
            else:
                launched.append(n)
        return q
    return forward


def test_other_length_crosses_the_multiple_of_16_class():
    assert [ahead._other_length(n) for n in (4096, 4999, 17, 16, 2)] == [4097, 5008, 32, 17, 16]


def test_sibling_inputs_move_only_the_lengths_and_keep_the_layout():
    q = torch.randn(2, 64, 4, 16, dtype=torch.float16).transpose(1, 2)   # (B, H, S, D) over a (B, S, H, D) buffer
    k = torch.randn(2, 4, 64, 16, dtype=torch.float16)
    sq, sk = ahead._sibling_inputs(INPUTS, ("S",), [q, k])
    assert sq.shape == (2, 4, 65, 16) and sk.shape == (2, 4, 65, 16)
    assert sq.dtype == torch.float16 and not sq.any()
    assert sq.stride() == (65 * 4 * 16, 16, 4 * 16, 1)   # S outermost after B, as the caller's q
    assert sk.is_contiguous()
    assert ahead._sibling_inputs(INPUTS, (), [q, k]) is None   # nothing specialized to move


def test_a_first_call_compiles_its_kernels_together_and_warms_the_other_length():
    kernels, launched = [StandIn(), StandIn()], []
    forward = module_forward(kernels, launched)
    q = k = torch.randn(1, 4, 32, 16, dtype=torch.float16)
    ahead._compile_ahead(forward, (q, k), None, INPUTS, ("S",))
    assert all(len(kn.compiled) >= 1 for kn in kernels)   # both compiled before the call goes on
    assert launched == []                                  # the warm pass launched nothing
    ahead.wait_for_compiles()
    lengths = sorted(args[2] for args in kernels[0].compiled)
    assert lengths == [32, 33]   # the call's length, then the other class's in the background
    assert not ahead._warming()


@pytest.mark.parametrize("off, config", [("0", None), ("1", {"BLOCK_I": 64})])
def test_no_compiling_ahead_when_turned_off_or_for_a_call_with_its_own_config(monkeypatch, off, config):
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", off)
    kernels, launched = [StandIn()], []
    q = torch.randn(1, 4, 32, 16, dtype=torch.float16)
    ahead._compile_ahead(module_forward(kernels, launched), (q, q), config, INPUTS, ("S",))
    ahead.wait_for_compiles()
    assert kernels[0].compiled == []


def test_a_failing_warm_pass_is_left_to_the_call():
    def forward(*tensors, config=None):
        raise ValueError("the call reports this itself")
    q = torch.randn(1, 4, 32, 16, dtype=torch.float16)
    assert ahead._warm_pass(forward, (q, q), None) == ([], [])
    assert not ahead._warming()


def test_calls_take_the_triton_kernel_while_the_gluon_kernel_compiles(monkeypatch):
    gate = threading.Event()
    kernel = StandIn(gate)
    x = torch.randn(1, 4, 40, 16, dtype=torch.float16)
    args = (launch._descriptor(x, [1, 1, 8, 16]) or launch.TensorDescriptor(x, list(x.shape), list(x.stride()),
                                                                            [1, 1, 8, 16]), 40)
    monkeypatch.setattr(launch, "_REPLAYS", {"recorded with the Triton kernel": None})
    assert launch._gluon_ready(kernel, args, {}, (8,), None) is False
    assert launch._gluon_ready(kernel, args, {}, (8,), {"BACKEND": "gluon"}) is True   # a config of its own
    gate.set()
    ahead.wait_for_compiles()
    assert launch._REPLAYS == {}   # replays recorded with the Triton kernel are dropped once it is ready
    assert launch._gluon_ready(kernel, args, {}, (8,), None) is True
    assert len(kernel.compiled) == 1


def compiles(mod) -> int:
    """How many compiled kernels the module's Triton (and Gluon) functions hold."""
    from triton.runtime.jit import JITFunction
    return sum(len(caches[0]) for f in vars(mod).values() if isinstance(f, JITFunction)
               for caches in f.device_caches.values())


@pytest.mark.skipif(DEVICE != "cuda", reason="Triton compiles kernels on a GPU only")
@pytest.mark.parametrize("name, length, first, later", [("causal_pf", "S", {"B": 1, "S": 64}, [65, 100]),
                                                        ("causal_dc", "SKV", {"B": 1, "Q": 1, "SKV": 1000}, [1008, 1100])])
def test_after_a_first_call_new_lengths_compile_nothing(name, length, first, later):
    """Lengths of both classes after the first call. A split kernel also specializes on its chunk count, which
    the launcher derives from the length and the GPU: these decode lengths keep it in one class (8, 8 and 5
    chunks on an H100), as a decode step's next length mostly does; unspecialized, it cost grouped-query
    decode at KV 32k 6% on an H100 (bench/results/h100/2026-11-24-compile-ahead/compare_modules.log)."""
    path = str(SPECS / f"{name}.py")
    _, mod = compiled(path)
    assert_close(path, first)
    mod.wait_for_compiles()
    before = compiles(mod)
    for n in later:   # the other class of the first length, then another length of that class
        assert_close(path, dict(first, **{length: n}), seed=n)
    assert compiles(mod) == before


def test_a_gluon_kernel_met_in_a_warm_pass_compiles_after_the_calls_own_kernels():
    gluon, triton_kernel = StandIn(), StandIn()
    x = torch.randn(1, 4, 40, 16, dtype=torch.float16)
    desc = launch.TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 8, 16])
    order = []

    def forward(q, *, config=None):   # a prefill module's branch: the Gluon kernel where it is ready
        if not launch._gluon_ready(gluon, (desc, 40), {}, (8,), config) and ahead._warming():
            key = ("triton", 40)
            future = ahead._submit(key, q.device, triton_kernel, (1,), (q, 40), {})
            future.add_done_callback(lambda _: order.append("triton"))
            ahead._AHEAD.futures.append(future)
        return q

    futures, later = ahead._warm_pass(forward, (x,), None)
    assert len(futures) == 1 and len(later) == 1 and gluon.compiled == []   # put off, not submitted
    ahead._compile_ahead(forward, (x,), None, {"q": ("float16", ("B", 4, "S", 16))}, ())
    ahead.wait_for_compiles()
    assert len(gluon.compiled) == 1 and order[0] == "triton"


def test_a_failure_warming_the_other_class_does_not_fail_the_call(monkeypatch):
    kernels, launched = [StandIn()], []
    q = torch.randn(1, 4, 32, 16, dtype=torch.float16)

    def no_memory(*args):
        raise torch.cuda.OutOfMemoryError("no room for the other class's inputs")
    monkeypatch.setattr(ahead, "_sibling_inputs", no_memory)
    ahead._compile_ahead(module_forward(kernels, launched), (q, q), None, INPUTS, ("S",))
    ahead.wait_for_compiles()
    assert [args[2] for args in kernels[0].compiled] == [32]   # the call's own kernels, compiled
