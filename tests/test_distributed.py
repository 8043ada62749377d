"""A split reduction across processes (neptune_eqsat/distributed.py): several ranks on the CPU (gloo, Triton's
interpreter), each with a shard of the split axis, exchange their partial results and combine them; the output
matches the float64 evaluation of the unsharded spec on every rank, with uneven shards and a shard that holds
no key at all."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.spec import load_spec

from conftest import DEVICE, SPECS

# several processes exchange partials with gloo on CPU tensors, their kernels under Triton's interpreter: the
# runs on a GPU check the halves of a split plan in one process instead (the last test)
across_processes = pytest.mark.skipif(DEVICE != "cpu", reason="ranks on the CPU (gloo, the interpreter)")

# decode over a KV cache whose keys carry their positions (a cache sharded by position, or paged): a query sees
# the keys at positions up to its own, so the mask reads global positions, whichever rank holds the key
DECODE = '''"""Grouped-query decode over a KV cache with key positions."""
from neptune_eqsat.spec import *

spec = Spec("positions_dc")
B, Q, SKV = spec.dims(B=1, Q=2, SKV=4096)
H, HKV, D = 4, 2, 16
b, h, i, j, d, e = spec.axes(b=B, h=H, i=Q, j=SKV, d=D, e=D)
q = spec.input("q", f16, B, H, Q, D)
k = spec.input("k", f16, B, HKV, SKV, D)
v = spec.input("v", f16, B, HKV, SKV, D)
kpos = spec.input("kpos", f32, SKV)
qpos = spec.input("qpos", f32, Q)
hk = h // (H // HKV)

s = sum(d, q[b, h, i, d] * k[b, hk, j, d]) / sqrt(D)
s = where(kpos[j] <= qpos[i], s, -inf)
m = max(j, s)
p = exp(s - where(m == -inf, 0, m))
l = sum(j, p)
o = sum(j, cast(p, f16) * v[b, hk, j, e]) / where(l == 0, 1, l)
spec.output("o", f16, o, b, h, i, e)
'''

WORKER = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, torch.distributed as dist
from neptune_eqsat.distributed import sharded_forward
from neptune_eqsat.runtime.loader import load_module

rank, world, store, module_file, data_file, out_file = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
mod = load_module(open(module_file).read(), f"sharded_{rank}")
data = torch.load(data_file)
inputs, axis_of, bounds, sizes = data["inputs"], data["axis_of"], data["bounds"], data["sizes"]
lo, hi = bounds[rank]
local = [x.narrow(axis_of[n], lo, hi - lo).contiguous() if n in axis_of else x for n, x in inputs.items()]
out = sharded_forward(mod, *local, sizes=sizes)
torch.save(out, f"{out_file}.{rank}")
dist.destroy_process_group()
'''


def spawn(worker: str, world: int, tmp: Path, files: list[str], env: dict | None = None) -> list:
    """Run `worker` as `world` ranks (argv: rank, world, the rendezvous file, `files`..., the output prefix) and
    return each rank's saved output."""
    env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(r), str(world), str(tmp / "store"), *files,
                               str(tmp / "out")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [torch.load(tmp / f"out.{r}") for r in range(world)]


def run_sharded(source: str, inputs: dict, axis_of: dict, bounds: list, sizes: dict, tmp: Path) -> list:
    (tmp / "module.py").write_text(source)
    torch.save({"inputs": inputs, "axis_of": axis_of, "bounds": bounds, "sizes": sizes}, tmp / "data.pt")
    return spawn(WORKER, len(bounds), tmp, [str(tmp / "module.py"), str(tmp / "data.pt")])


def check(spec, result, inputs, shard_axis_of, bounds, sizes, tmp):
    want = evaluate(spec, inputs)
    outs = run_sharded(result.source, inputs, shard_axis_of, bounds, sizes, tmp)
    for out in outs:
        assert (out.double() - want).abs().max().item() <= tolerance(spec.output_dtype)
        assert not out.isnan().any()


@across_processes
@pytest.mark.parametrize("bounds", [[(0, 20), (20, 37)], [(0, 9), (9, 37), (37, 37)]],
                         ids=["two-uneven", "three-one-empty"])
def test_decode_over_a_kv_cache_sharded_by_position(tmp_path, bounds):
    path = tmp_path / "positions_dc.py"
    path.write_text(DECODE)
    spec = load_spec(path)
    result = optimize(spec, plan="split")
    inputs = random_inputs(spec, {"B": 1, "Q": 2, "SKV": 37}, seed=3)
    inputs["kpos"] = torch.randperm(37, generator=torch.Generator().manual_seed(1)).float()   # any order
    inputs["qpos"] = torch.tensor([5, 30], dtype=torch.float32)   # the first query sees few keys, some ranks none
    axes = {"k": 2, "v": 2, "kpos": 0}
    check(spec, result, inputs, axes, bounds, {"SKV": 37}, tmp_path)


@across_processes
def test_a_row_statistic_sharded_along_its_row(tmp_path):
    """Not attention: sum_j x / max_j x over rows split across ranks, combined with its derived repair t r / r'."""
    spec = load_spec(SPECS / "max_normalized_sum.py")
    result = optimize(spec, plan="split")
    inputs = random_inputs(spec, {"R": 3, "N": 45}, seed=4)
    check(spec, result, inputs, {"x": 1}, [(0, 30), (30, 45)], {"N": 45}, tmp_path)


def test_a_module_that_is_not_split_is_refused():
    from neptune_eqsat.distributed import sharded_forward
    from neptune_eqsat.runtime.loader import load_module
    mod = load_module(optimize(str(SPECS / "softmax.py")).source, "not_split")
    with pytest.raises(TypeError, match="not a split plan"):
        sharded_forward(mod, torch.ones(2, 3))


FLEX_WORKER = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, torch.distributed as dist
from neptune_eqsat.distributed import context_parallel_attention

rank, world, store, data_file, out_file = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
data = torch.load(data_file)
q, k, v, bias, bounds, total = data["q"], data["k"], data["v"], data["bias"], data["bounds"], data["total"]
L = q.shape[2]

def score_mod(s, b, h, qi, ki):          # a learned bias per key position, read at the global position
    return s + bias[ki] + 0.05 * (ki - qi)

def mask_mod(b, h, qi, ki):              # the queries are the newest positions: bottom-right causal
    return ki <= qi + (total - L)

lo, hi = bounds[rank]
with torch.no_grad():                    # a second call reuses the traced and compiled module
    outs = [context_parallel_attention(q, k[:, :, lo:hi].contiguous(), v[:, :, lo:hi].contiguous(),
                                       score_mod, mask_mod, enable_gqa=True) for _ in range(2)]
torch.save(torch.stack(outs), f"{out_file}.{rank}")
dist.destroy_process_group()
'''


@across_processes
def test_flex_attention_over_keys_sharded_across_ranks(tmp_path):
    """FlexAttention callables over a KV cache split across three ranks (one shard empty): score_mod and
    mask_mod read global key positions; every rank gets the whole output, against float64."""
    g = torch.Generator().manual_seed(7)
    total, L = 41, 3
    q = torch.randn(1, 4, L, 16, generator=g).half()
    k = torch.randn(1, 2, total, 16, generator=g).half()
    v = torch.randn(1, 2, total, 16, generator=g).half()
    bias = torch.randn(total, generator=g)
    bounds = [(0, 17), (17, 17), (17, 41)]
    torch.save({"q": q, "k": k, "v": v, "bias": bias, "bounds": bounds, "total": total}, tmp_path / "data.pt")
    outs = spawn(FLEX_WORKER, 3, tmp_path, [str(tmp_path / "data.pt")])
    qi, ki = torch.arange(L).view(L, 1), torch.arange(total).view(1, total)
    kk, vv = k.double().repeat_interleave(2, dim=1), v.double().repeat_interleave(2, dim=1)
    s = q.double() @ kk.transpose(-1, -2) / 4.0 + bias.double()[ki] + 0.05 * (ki - qi)
    s = s.masked_fill(~(ki <= qi + (total - L)), float("-inf"))
    want = torch.softmax(s, dim=-1) @ vv
    for r, calls in enumerate(outs):
        for out in calls:
            assert (out.double() - want).abs().max().item() <= 2e-2, r


USER_WORKER = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, torch.distributed as dist
from neptune_eqsat.distributed import context_parallel_attention, ring_attention

rank, world, store, out_file = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
g = torch.Generator().manual_seed(3)
q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (2, 30, 30))
lo, hi = (0, 12) if rank == 0 else (12, 30)
OFFSET = 0

def mask_mod(b, h, qi, ki):              # a decode step's newest position, a global the loop changes
    return ki <= qi + OFFSET

def ref(offset):
    s = (q.double() @ k.double().transpose(-1, -2)) / 4.0
    keep = torch.arange(30).view(1, 30) <= torch.arange(2).view(2, 1) + offset
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.double()

errors = {}
for offset in (5, 20):                   # the same callable, a changed global: traced again
    OFFSET = offset
    with torch.no_grad():
        out = context_parallel_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], mask_mod=mask_mod)
    errors[f"offset {offset}"] = (out.double() - ref(offset)).abs().max().item()
with torch.inference_mode():             # offsets made here are filled again outside it
    context_parallel_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], mask_mod=lambda b, h, qi, ki: ki <= qi + 7)
with torch.no_grad():
    out = context_parallel_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], mask_mod=lambda b, h, qi, ki: ki <= qi + 7)
errors["after inference_mode"] = (out.double() - ref(7)).abs().max().item()
refused = []
try:                                     # one rank in bf16: named on every rank, not read as fp32 bytes
    x = (q, k[:, :, lo:hi], v[:, :, lo:hi])
    ring_attention(*(t.bfloat16() if rank == 1 else t for t in x))
except ValueError as e:
    refused.append("dtypes" in str(e))
bias = torch.nn.Parameter(torch.zeros(30))
try:                                     # a learnable table: no backward across ranks yet
    context_parallel_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], score_mod=lambda s, b, h, qi, ki: s + bias[ki])
except NotImplementedError:
    refused.append(True)
torch.save({"errors": errors, "refused": refused}, f"{out_file}.{rank}")
dist.destroy_process_group()
'''


@across_processes
def test_what_users_do_across_ranks(tmp_path):
    """A global the mask reads changed between calls (traced again, as on one GPU), a call under inference_mode
    then one outside it, a rank passing another dtype (a ValueError on every rank, where the exchange read its
    bytes as the wrong dtype) and a captured parameter that requires grad (refused: no backward yet)."""
    for out in spawn(USER_WORKER, 2, tmp_path, []):
        assert all(e < 1e-5 for e in out["errors"].values()), out["errors"]
        assert out["refused"] == [True, True]


@pytest.mark.parametrize("spec_name, sizes, axis_of, cuts", [
    ("gqa_dc", {"B": 1, "Q": 1, "SKV": 70}, {"k": 2, "v": 2}, [0, 33, 33, 70]),
    ("max_normalized_sum", {"R": 5, "N": 90}, {"x": 1}, [0, 40, 90]),
], ids=["decode", "row-statistic"])
def test_partials_of_shards_combine_to_the_whole(spec_name, sizes, axis_of, cuts):
    """In one process, on the test device: forward_partials on consecutive shards of the split axis (one empty),
    joined along the chunk axis, then combine, gives forward's result on the whole."""
    from conftest import on_device
    from neptune_eqsat.runtime.loader import load_module
    spec = load_spec(SPECS / f"{spec_name}.py")
    mod = load_module(optimize(spec, plan="split").source, f"halves_{spec_name}")
    inputs = random_inputs(spec, sizes, seed=5)
    whole = on_device(mod.forward, *inputs.values())
    parts = []
    for lo, hi in zip(cuts, cuts[1:]):
        local = [x.narrow(axis_of[n], lo, hi - lo).contiguous() if n in axis_of else x for n, x in inputs.items()]
        parts.append(mod.forward_partials(*(t.to(DEVICE) for t in local)))
    joined = [torch.cat(p) for p in zip(*parts)]
    out = mod.combine(*(t.to(DEVICE) for t in inputs.values()), partials=joined).cpu()
    assert (out.double() - whole.double()).abs().max().item() <= tolerance(spec.output_dtype)
    assert (out.double() - evaluate(spec, inputs)).abs().max().item() <= tolerance(spec.output_dtype)


RING_WORKER = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, torch.distributed as dist
import neptune_eqsat.distributed as nd
from neptune_eqsat.distributed import ring_attention
nd.ROWS_OF_ONE_CHUNK = int(os.environ.get("ROWS_OF_ONE_CHUNK", nd.ROWS_OF_ONE_CHUNK))

rank, world, store, data_file, out_file = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
data = torch.load(data_file)
q, k, v, bias, bounds = data["q"], data["k"], data["v"], data["bias"], data["bounds"]

def score_mod(s, b, h, qi, ki):          # a bias per (query, key) distance, read at global positions
    return s + bias[(qi - ki).clamp(0, 63)]

def causal(b, h, qi, ki):
    return ki <= qi

rows = torch.tensor(bounds[rank]) if data["zigzag"] else torch.arange(*bounds[rank])
shard = lambda x: x[:, :, rows].contiguous()
with torch.no_grad():
    out = ring_attention(shard(q), shard(k), shard(v), score_mod, causal, enable_gqa=True,
                         positions=rows if data["zigzag"] else None)
torch.save(out, f"{out_file}.{rank}")
dist.destroy_process_group()
'''


@across_processes
@pytest.mark.parametrize("layout", ["uneven", "uneven-one-chunk-a-step", "zigzag"])
def test_ring_prefill_over_a_sequence_sharded_across_ranks(tmp_path, layout):
    """Queries, keys and values of one sequence split across three ranks (uneven contiguous shards, or zig-zag
    shards of one length given by their positions); keys and values go round the ring, a causal mask and a
    distance bias at global positions; each rank's rows against float64."""
    g = torch.Generator().manual_seed(11)
    total = 42
    q = torch.randn(1, 4, total, 16, generator=g).half()
    k = torch.randn(1, 2, total, 16, generator=g).half()
    v = torch.randn(1, 2, total, 16, generator=g).half()
    bias = torch.randn(64, generator=g)
    zigzag = layout == "zigzag"
    # zig-zag: 42 positions in 6 chunks of 7, rank r holding chunks r and 5 - r (one length: 14 rows each)
    bounds = [list(range(7 * r, 7 * r + 7)) + list(range(7 * (5 - r), 7 * (6 - r))) for r in range(3)] if zigzag \
        else [(0, 13), (13, 30), (30, 41)]
    torch.save({"q": q, "k": k, "v": v, "bias": bias, "bounds": bounds, "zigzag": zigzag}, tmp_path / "data.pt")
    env = {"ROWS_OF_ONE_CHUNK": "0"} if layout == "uneven-one-chunk-a-step" else {}
    outs = spawn(RING_WORKER, 3, tmp_path, [str(tmp_path / "data.pt")], env)
    qi, ki = torch.arange(total).view(total, 1), torch.arange(total).view(1, total)
    kk, vv = k.double().repeat_interleave(2, dim=1), v.double().repeat_interleave(2, dim=1)
    s = q.double() @ kk.transpose(-1, -2) / 4.0 + bias.double()[(qi - ki).clamp(0, 63)]
    want = torch.softmax(s.masked_fill(ki > qi, float("-inf")), dim=-1) @ vv
    for out, rows in zip(outs, bounds):
        rows = rows if zigzag else list(range(*rows))
        assert out.shape == (1, 4, len(rows), 16)
        assert (out.double() - want[:, :, rows]).abs().max().item() <= 2e-2, rows[0]


@pytest.mark.slow
@across_processes
def test_the_distributed_benchmark_smoke_run_passes():
    """bench.suite.distributed under torchrun on the CPU (two ranks, gloo, tiny shapes): its checks pass."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           "29531", "-m", "bench.suite.distributed", "--smoke"], cwd=root, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0 and "smoke passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
