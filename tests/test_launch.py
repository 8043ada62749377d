"""The generated launcher's record-and-replay (used on the GPU), exercised with a stand-in for the compiled
kernel: replayed launches get the new call's tensors in their places, fresh workspaces, the same tickets."""
import torch

from neptune_eqsat.runtime import launch


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
    assert args[1].shape == (5,) and args[1] is not work          # a fresh workspace per call
    assert args[3] is got and got.shape == (2,) and got.dtype == torch.float16
    assert args[5] is tickets and tickets.numel() >= 7 and not tickets.any()   # one zeroed ticket buffer


def test_replay_builds_each_calls_tensor_descriptors_around_its_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, stream, args: calls.append(args))
    device = torch.device("cpu")
    q, k = torch.randn(2, 40, 16), torch.randn(2, 40, 16)
    rec = launch._Recording((q, k))
    out = rec.empty((2, 40, 16), torch.float32, device)
    rec.launched("kernel", (1, 1, 1), (q, launch._descriptor(k, [1, 32, 16]), out, 40), (1,))
    replay = rec.replay(device, out)

    q2, k2 = torch.randn(2, 40, 16), torch.randn(2, 40, 16)
    replay(q2, k2)
    (args,) = calls
    assert args[0] is q2 and args[1].base is k2 and list(args[1].block_shape) == [1, 32, 16]
    assert args[3] == 40 and args[4] == 1


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
