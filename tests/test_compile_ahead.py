"""Compiling ahead (runtime/ahead.py), exercised with stand-in kernels whose warmup records what it was asked
to compile: a first call's kernels are submitted together and waited for, the same call at lengths of
Triton's other specialization class is warmed in the background, a warm pass never launches, and while a
Gluon kernel compiles calls take the Triton kernel."""
import threading

import pytest
import torch

from conftest import DEVICE, SPECS, assert_close, compiled
from neptune_eqsat.runtime import ahead, descriptors, launch, replay

INPUTS = {"q": ("float16", ("B", 4, "S", 16)), "k": ("float16", ("B", 4, "S", 16))}


class StandIn:
    """A kernel whose warmup (compile) records its arguments, after `gate` opens."""

    def __init__(self, gate=None):
        self.compiled, self.threads, self.gate = [], [], gate

    def warmup(self, *args, grid, **cfg):
        if self.gate is not None:
            self.gate.wait(5)
        self.compiled.append(args)
        self.threads.append(threading.current_thread().name)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("_PENDING", "_BACKGROUND"):
        monkeypatch.setattr(ahead, name, {} if name == "_PENDING" else [])
    monkeypatch.delenv("NEPTUNE_EQSAT_COMPILE_AHEAD", raising=False)
    yield
    ahead.wait_for_compiles()


def request(kernel, args, tier=""):
    """What a generated module's launch does in a warm pass: request the kernel's compile."""
    key = (kernel, tier, *map(launch._specialization, args))
    if not ahead._compiled(key):
        ahead._AHEAD.needed.append((key, lambda background=False: ahead._submit(key, args[0].device, kernel, (1,), args,
                                                                                {}, background)))


def module_forward(kernels, launched, quick_kernels=()):
    """A forward shaped like a generated module's: its kernels (the quick tier's under a quick config)
    requested in a warm pass, launched otherwise."""
    def forward(q, k, *, config=None):
        quick = isinstance(config, ahead._QuickConfig)
        for n, kernel in enumerate(quick_kernels if quick else kernels):
            args = (q, k, q.shape[2])
            if ahead._warming():
                request(kernel, args, "quick" if quick else "tuned")
            else:
                launched.append(("quick" if quick else "tuned", n))
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
    assert ahead._warm_pass(forward, (q, q), None) == ([], [], [])
    assert not ahead._warming()


def test_calls_take_the_triton_kernel_while_the_gluon_kernel_compiles(monkeypatch):
    gate = threading.Event()
    kernel = StandIn(gate)
    x = torch.randn(1, 4, 40, 16, dtype=torch.float16)
    args = (descriptors._descriptor(x, [1, 1, 8, 16])
            or descriptors.TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 8, 16]), 40)
    monkeypatch.setattr(replay, "_REPLAYS", {})

    def forward(q, *, config=None):
        launch._gluon_ready(kernel, args, {}, (8,), config)
        return q
    config, stale_when = ahead._compile_ahead(forward, (x,), None, {"q": ("float16", ("B", 4, "S", 16))}, ())
    assert config is None and len(stale_when) == 1   # the call takes the Triton kernel, Gluon's compiles
    replay._REPLAYS["recorded with the Triton kernel"] = ("replay", stale_when)
    assert launch._gluon_ready(kernel, args, {}, (8,), None) is False
    assert launch._gluon_ready(kernel, args, {}, (8,), {"BACKEND": "gluon"}) is True   # a config of its own
    assert replay._replay("recorded with the Triton kernel") == "replay"
    gate.set()
    ahead.wait_for_compiles()
    assert replay._replay("recorded with the Triton kernel") is None   # stale once the Gluon kernel is ready
    assert replay._REPLAYS == {}
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
    desc = descriptors.TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 8, 16])
    order = []

    def forward(q, *, config=None):   # a prefill module's branch: the Gluon kernel where it is ready
        if not launch._gluon_ready(gluon, (desc, 40), {}, (8,), config) and ahead._warming():
            key = ("triton", 40)

            def submit(background=False):
                future = ahead._submit(key, q.device, triton_kernel, (1,), (q, 40), {}, background)
                future.add_done_callback(lambda _: order.append("triton"))
                return future
            ahead._AHEAD.needed.append((key, submit))
        return q

    needed, later, pending = ahead._warm_pass(forward, (x,), None)
    assert len(needed) == 1 and len(later) == 1 and gluon.compiled == []   # put off, not submitted
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


def test_a_first_call_runs_the_quick_tier_while_the_tuned_kernels_compile():
    """The quick kernels are compiled and waited for; the tuned ones compile in the background, and calls take
    the quick tier until they are ready. The replays of those calls are stale from then on."""
    gate = threading.Event()
    tuned, quick, launched = [StandIn(gate)], [StandIn()], []
    forward = module_forward(tuned, launched, quick)
    q = torch.randn(1, 4, 32, 16, dtype=torch.float16)
    config, stale_when = ahead._compile_ahead(forward, (q, q), None, INPUTS, ("S",), {"ONE_LOOP": 1})
    assert isinstance(config, ahead._QuickConfig) and config == {"ONE_LOOP": 1}
    assert len(quick[0].compiled) == 1 and tuned[0].compiled == []   # the tuned compile waits on the gate
    assert len(stale_when) == 1 and not stale_when[0].done()
    again, _ = ahead._compile_ahead(forward, (q, q), None, INPUTS, ("S",), {"ONE_LOOP": 1})
    assert isinstance(again, ahead._QuickConfig) and len(quick[0].compiled) == 1   # nothing compiled again
    assert launched == []   # warm passes launch nothing
    gate.set()
    ahead.wait_for_compiles()
    assert all(f.done() for f in stale_when)
    assert sorted(args[2] for args in tuned[0].compiled) == [32, 33]   # the call's length and the other class's
    # compiles nothing waits for run one at a time on a thread of their own, beside the caller's work
    assert all(t.startswith("neptune-compile-background") for t in tuned[0].threads)
    assert all(t.startswith("neptune-compile-waited") for t in quick[0].threads)
    assert ahead._compile_ahead(forward, (q, q), None, INPUTS, ("S",), {"ONE_LOOP": 1}) == (None, [])


def test_the_quick_tier_is_marked_for_the_launches_of_its_call():
    q = torch.randn(1, 4, 32, 16, dtype=torch.float16, device=DEVICE)
    launch._setup(INPUTS, {"BLOCK": 16}, {"BLOCK": 16}, {}, "", (q, q), ahead._QuickConfig({"ONE_LOOP": 1}))
    assert ahead._quick_call()
    config = {"BLOCK": 16, "COMBINE": {"in_kernel": 1, "ONE_LOOP": 0}}
    _, _, cfg, _ = launch._setup(INPUTS, config, config, {}, "", (q, q), ahead._QuickConfig({"COMBINE": {"in_kernel": 0}}))
    assert cfg["COMBINE"] == {"in_kernel": 0, "ONE_LOOP": 0}   # merged entry by entry, no measured config
    launch._setup(INPUTS, {"BLOCK": 16}, {"BLOCK": 16}, {}, "", (q, q), None)
    assert not ahead._quick_call()


def test_a_length_parameter_of_the_quick_twin_is_keyed_by_its_width_only():
    kernel, q = object(), torch.randn(4, dtype=torch.float16)
    keys = [launch._compile_key(kernel, (q, n), {}, (), frozenset({1})) for n in (16, 17, 1)]
    assert keys[0] == keys[1] == keys[2]
    assert launch._compile_key(kernel, (q, 16), {}, ()) != launch._compile_key(kernel, (q, 17), {}, ())
