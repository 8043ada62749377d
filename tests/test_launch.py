"""The generated launcher's record-and-replay (used on the GPU), exercised with a stand-in for the compiled
kernel: replayed launches get the new call's tensors in their places, fresh outputs, workspaces kept per stream,
the same tickets."""
import pytest
import torch

from conftest import DEVICE, SPECS, compiled, on_device
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.runtime import descriptors, replay as launch


def test_replay_puts_each_calls_tensors_where_the_recorded_launch_had_them(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append((compiled, grid, args)))
    monkeypatch.setattr(launch, "_TICKETS", {})
    device = torch.device("cpu")
    q, k = torch.randn(3), torch.randn(4)
    rec = launch._Recording((q, k))
    work = rec.empty((5,), torch.float32, device)
    out = rec.empty((2,), torch.float16, device)
    tickets = launch._tickets(rec, device, 7)
    # tensors and integers interleaved, as a kernel with a pointer after its sizes takes them
    rec.launched("kernel", (2, 1, 3), (q, work, 11, out, 12, tickets), (16,))
    replay = rec.replay(device, out)

    q2, k2 = torch.randn(3), torch.randn(4)
    got = replay(q2, k2)
    (compiled, grid, args), = calls
    assert compiled == "kernel" and grid == (2, 1, 3)
    assert args[0] is q2 and args[2] == 11 and args[4] == 12 and args[6] == 16
    assert args[1].shape == (5,) and args[1] is not work          # the replay's own workspace
    assert args[3] is got and got.shape == (2,) and got.dtype == torch.float16
    assert args[5] is tickets and tickets.numel() >= 7 and not tickets.any()   # one zeroed ticket buffer


def test_replay_builds_each_calls_tensor_descriptors_around_its_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append(args))
    device = torch.device("cpu")
    q, k = torch.randn(2, 40, 16), torch.randn(2, 40, 16)
    rec = launch._Recording((q, k))
    out = rec.empty((2, 40, 16), torch.float32, device)
    rec.launched("kernel", (1, 1, 1), (q, descriptors._descriptor(k, [1, 32, 16]), out, 40), (1,))
    replay = rec.replay(device, out)

    q2, k2 = torch.randn(2, 40, 16), torch.randn(2, 40, 16)
    replay(q2, k2)
    (args,) = calls
    assert args[0] is q2 and args[1].base is k2 and list(args[1].block_shape) == [1, 32, 16]
    assert args[3] == 40 and args[4] == 1


def test_a_replays_descriptors_equal_those_built_with_their_checks():
    """A replay builds its inputs' descriptors without the constructor's checks (the call's signature already
    guarantees what they test): the result must be the descriptor the constructor makes, field for field, for
    Triton's descriptors and Gluon's (which also carry a shared-memory layout)."""
    x = torch.randn(2, 3, 40, 16).transpose(1, 2).contiguous()
    assert descriptors._UNCHECKED   # this Triton's descriptors are plain dataclasses: the fast build is taken
    plain = descriptors._redescribe(x, [1, 1, 32, 16], None)
    assert type(plain) is descriptors.TensorDescriptor
    assert plain == descriptors.TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 32, 16])
    if descriptors.GluonDescriptor is not None:
        layout = descriptors.gl.NVMMASharedLayout.get_default_for([1, 1, 32, 16], descriptors.gl.float32)
        gluon = descriptors._redescribe(x, [1, 1, 32, 16], layout)
        assert type(gluon) is descriptors.GluonDescriptor
        assert gluon == descriptors.GluonDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 32, 16], layout)


def test_replay_of_a_kernel_with_several_outputs_returns_each_calls_outputs(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append(args))
    device = torch.device("cpu")
    q = torch.randn(6)
    rec = launch._Recording((q,))
    table = rec.derived(lambda x: x * 2, (q,), q * 2)   # a tensor each replay builds from the call's input
    out, rows = rec.empty((6,), torch.float16, device), rec.empty((3,), torch.float32, device)
    rec.launched("kernel", (1, 1, 1), (q, table, out, rows), ())
    replay = rec.replay(device, (out, rows))

    q2 = torch.randn(6)
    got = replay(q2)
    (args,) = calls
    assert isinstance(got, tuple) and len(got) == 2
    assert got[0] is args[2] and got[1] is args[3] and got[1].shape == (3,) and got[0] is not out
    assert torch.equal(args[1], q2 * 2)


def test_replay_keeps_small_workspaces_per_stream_and_allocates_outputs_every_call(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append(args))
    monkeypatch.setattr(launch, "_KEEP_BYTES", 64)
    device = torch.device("cpu")
    q = torch.randn(3)
    rec = launch._Recording((q,))
    small, large = rec.empty((16,), torch.float32, device), rec.empty((17,), torch.float32, device)
    out = rec.empty((3,), torch.float32, device)
    rec.launched("kernel", (1, 1, 1), (q, small, large, out), ())
    replay = rec.replay(device, out)
    first, second = replay(torch.randn(3)), replay(torch.randn(3))
    a, b = calls
    assert a[1] is b[1] and a[1].shape == (16,)         # 64 bytes: kept between calls on one stream
    assert a[2] is not b[2] and b[2].shape == (17,)     # 68 bytes: allocated every call
    assert first is a[3] and second is b[3] and first is not second


def test_replays_share_a_streams_arena_for_workspaces_of_the_same_ordinal(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append(args))
    monkeypatch.setattr(launch, "_ARENAS", {})
    device = torch.device("cpu")
    replays = []
    for n in (4, 6):   # two signatures: workspaces of 4 and 6 floats, then 2 halves
        q = torch.randn(n)
        rec = launch._Recording((q,))
        work, other = rec.empty((n,), torch.float32, device), rec.empty((2,), torch.float16, device)
        out = rec.empty((n,), torch.float32, device)
        rec.launched("kernel", (1, 1, 1), (q, work, other, out), ())
        replays.append(rec.replay(device, out))
    replays[1](torch.randn(6))
    replays[0](torch.randn(4))
    (_, big, half, _), (_, small, half_again, _) = calls
    assert big.data_ptr() == small.data_ptr() and big.shape == (6,) and small.shape == (4,)
    assert half.data_ptr() == half_again.data_ptr() != big.data_ptr() and half.dtype == torch.float16


def test_a_signature_is_recorded_the_second_time_it_is_called(monkeypatch):
    monkeypatch.setattr(launch, "_SEEN_ONCE", {})
    rec = launch._Recording(())
    assert launch._recorded_when_seen_before(rec, "sig") is None
    assert launch._recorded_when_seen_before(rec, "sig") is rec
    assert launch._recorded_when_seen_before(rec, "other") is None and "sig" not in launch._SEEN_ONCE


def test_replays_beyond_the_limit_drop_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(launch, "_REPLAYS", {})
    monkeypatch.setattr(launch, "_MAX_REPLAYS", 3)
    for key in "abc":
        launch._keep_replay(key, key.upper(), ())
    assert launch._replay("a") == "A"                   # used: now the most recent
    launch._keep_replay("d", "D", ())
    assert list(launch._REPLAYS) == ["c", "a", "d"] and launch._replay("b") is None


def test_an_empty_chain_of_launch_hooks_is_passed_as_none():
    class Chain:
        def __init__(self, calls):
            self.calls = calls
    hook = Chain([print])
    assert launch._hook(Chain([])) is None and launch._hook(hook) is hook and launch._hook(None) is None


@pytest.mark.skipif(DEVICE != "cuda", reason="replays run on a GPU")
def test_replayed_calls_on_a_growing_cache_and_in_a_cuda_graph_match_float64():
    """Calls of a split decode module whose signatures repeat (replayed, with workspaces from the stream's
    arenas), whose cache grows every call (never recorded), and a replay captured in a CUDA graph (workspaces of
    its own) then run beside eager calls: every output against float64."""
    result, mod = compiled(str(SPECS / "causal_dc.py"))
    lengths = [300, 300, 300, 301, 302, 303, 300, 1000, 1000, 1000]
    for n, seed in zip(lengths, range(len(lengths))):
        inputs = random_inputs(result.spec, {"B": 1, "Q": 2, "SKV": n}, seed=seed)
        out = on_device(mod.forward, *inputs.values())
        assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance(result.spec.output_dtype)
    inputs = random_inputs(result.spec, {"B": 1, "Q": 2, "SKV": 700}, seed=99)
    tensors = [t.cuda() for t in inputs.values()]
    for _ in range(3):   # recorded on the second call, replayed on the third
        mod.forward(*tensors)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mod.forward(*tensors)
    other = random_inputs(result.spec, {"B": 1, "Q": 2, "SKV": 700}, seed=100)
    for t, new in zip(tensors, other.values()):
        t.copy_(new)
    graph.replay()
    eager = mod.forward(*(t.clone() for t in tensors))
    torch.cuda.synchronize()
    want = evaluate(result.spec, other)
    for out in (captured, eager):
        assert (out.cpu().double() - want).abs().max().item() <= tolerance(result.spec.output_dtype)
