"""The warp-specialized Gluon gradient pass (codegen/gluon_gradients.py): which backward kernels get one (the pass
that adds dQ beside dK and dV: `--atomic`, or a non-deterministic training backward), that it compiles for Hopper
as three partitions that add through the copy engine's bulk reduce, and that its gradients match float64 on a
Hopper GPU (NEPTUNE_TEST_DEVICE=cuda). Under the interpreter the module's Triton kernel runs
(test_autodiff.test_attention_gradients_added_atomically)."""
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from neptune_eqsat.codegen.gluon_gradients import match_gradients
from neptune_eqsat.codegen.triton_kernel import outputs
from neptune_eqsat.compiler import optimize
from neptune_eqsat.frontend.spec import load_spec
from neptune_eqsat.plan.autodiff import differentiate
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, cast, exp, sum, where
from neptune_eqsat.spec import max as smax
from neptune_eqsat.tune.database import candidates

from conftest import DEVICE, SPECS
from hopper_checks import attention_spec, check_on_hopper, listed_mask_spec

ATOMIC = ["global_pf", "causal_pf", "gqa_pf", "alibi_pf", "softcap_pf", "window_pf"]


def gradient_kernel(spec, accumulate=True):
    """The compile result of the backward's first gradient kernel."""
    return optimize(differentiate(spec, accumulate=accumulate).kernels[0].spec)


@pytest.mark.parametrize("name", ATOMIC)
def test_the_pass_adding_dq_beside_dk_and_dv_gets_a_gluon_kernel(name):
    result = gradient_kernel(load_spec(str(SPECS / f"{name}.py")))
    assert not isinstance(match_gradients(result.chosen.sched, "probe"), str)
    assert f"def {result.spec.name}_gluon_kernel(" in result.source and "tma_reduce_add(" in result.source
    assert "'BACKEND': 'gluon'" in result.source
    mod = load_module(result.source, result.spec.name)
    tries = candidates(mod.CONFIG)   # tuning starts from the default and varies the Gluon kernel's tunables
    assert tries[0] == {k: mod.CONFIG[k] for k in tries[0]}
    assert {c["WS_ORDER"] for c in tries if c["BACKEND"] == "gluon"} == {1, 2}
    assert "kernels: Triton, and a warp-specialized Gluon kernel for Hopper GPUs" in result.explain()


def near_diagonal_doubled(dim=128):
    """Causal attention whose scores within 8 of the diagonal count double: its gradient reads the test
    i - j < 8 at the scores and again at dS, where the causal mask's second read is absorbed by exp."""
    spec = Spec("doubled")
    B, S = spec.dims(B=1, S=256)
    b, h, i, j, d, e = spec.axes(b=B, h=2, i=S, j=S, d=dim, e=dim)
    q, k, v = (spec.input(n, "f16", B, 2, S, dim) for n in "qkv")
    s = sum(d, q[b, h, i, d] * k[b, h, j, d]) / math.sqrt(dim)
    s = where(i >= j, where(i - j < 8, s * 2, s), -math.inf)
    m = smax(j, s)
    p = exp(s - where(m == -math.inf, 0, m))
    o = sum(j, cast(p, "f16") * v[b, h, j, e]) / where(sum(j, p) == 0, 1, sum(j, p))
    spec.output("o", "f16", o, b, h, i, e)
    return spec


def test_a_test_of_positions_used_again_is_computed_again():
    """A test of positions read at the scores and again at dS: the second read computes the test again, as a
    difference the compiler does not merge with the first, so no tile of truth values is held between them.
    The causal mask is read once: its second read, at dS, is absorbed by the exp (rule mask-absorbed-by-exp)."""
    source = gradient_kernel(near_diagonal_doubled()).source
    consumer = source[source.index("_consumer("):source.index("_gluon_kernel(")]
    # (each test a predicate of a select: codegen/predicated.py)
    assert re.search(r"setp\.ge\.s32 q0, \$1, \$2;[^\n]*\[offs_i\[None, :\], offs_j\[:, None\]", consumer)
    assert re.search(r"setp\.lt\.s32 q0, \$1, \$2;[^\n]*\[t\d+, 8, ", consumer)
    causal = gradient_kernel(load_spec(str(SPECS / "causal_pf.py"))).source
    consumer = causal[causal.index("_consumer("):causal.index("_gluon_kernel(")]
    assert len(re.findall(r"offs_i\[None, :\], offs_j\[:, None\]|offs_i\[None, :\] - offs_j", consumer)) == 1
    assert "lo = (gl.maximum(0, -(-1 * i_lo + 0)) // BLOCK_I) * BLOCK_I" in consumer   # from the diagonal


def test_a_sum_over_the_keys_added_beside_dq_rides_in_the_gluon_kernel():
    """ALiBi's slope gradient sums dS (j - i) over the keys, a value per query row added across programs beside
    dQ: each consumer sums its rows of the tile (those past the end as 0) and adds the sums atomically."""
    result = gradient_kernel(attention_spec(dim=128, slope=True))
    assert f"def {result.spec.name}_gluon_kernel(" in result.source
    consumer = result.source[result.source.index("_consumer("):result.source.index("_gluon_kernel(")]
    added = re.findall(r"(t\d+) = gl\.sum\(gl\.where\(valid_j\[:, None\], t\d+, 0\.0\), axis=0\)", consumer)
    assert len(added) == 1
    assert re.search(rf"gl\.atomic_add\(out\d+_ptr \+ [^,]*offs_i \* out\d+_s\d[^,]*, {added[0]}, mask=valid_i, "
                     r"sem='relaxed'\)", consumer)


def test_an_added_output_declared_in_16_bits_is_rounded_once_after_the_gluon_kernel():
    """The derived backward declares dQ in fp32 (the host casts it); declared in bf16, the Gluon kernel still adds
    into an fp32 workspace and the module's rounding kernel writes the output once the adds are done."""
    from dataclasses import replace
    spec = gradient_kernel(load_spec(str(SPECS / "global_pf.py")).retyped("bf16")).spec
    assert [o.dtype for o in spec.also] == ["bf16", "f32"]
    assert "_round_kernel" not in optimize(spec).source
    in_bf16 = replace(spec, name=spec.name + "_bf16", also=(spec.also[0], replace(spec.also[1], dtype="bf16")))
    src = optimize(in_bf16).source
    assert "_gluon_kernel(" in src and "acc_desc = _gluon_descriptor(out2, " in src
    assert "out2 = _zeros(rec, (B, 32, S, 128), torch.float32, device)" in src
    assert "_round_kernel, (-(-(B * 32 * S * 128) // 4096),), (out2, out2_rounded, B * 32 * S * 128)" in src
    assert "return (out, out1, out2_rounded)" in src


@pytest.mark.parametrize("spec, accumulate, reason", [
    # the two passes: dK and dV add nothing into another kernel's rows
    (attention_spec(dim=128), False, "not one pass adding one product into another kernel's rows"),
    # a head dimension the warpgroup products do not take
    (attention_spec(dim=16), True, "not a float [..., i, d] tile of 64 or 128 columns"),
])
def test_other_gradient_kernels_say_why_they_have_none(spec, accumulate, reason):
    result = gradient_kernel(spec, accumulate)
    assert reason in match_gradients(result.chosen.sched, "probe")
    assert "_gluon_kernel" not in result.source


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_tile_read_again_in_fp32_is_rounded_two_elements_at_a_time(dtype):
    """Soft-cap's gradient rounds P, D + dP and the tanh factor to 16 bits and multiplies them in fp32: each is
    rounded by the packed conversion (values.PACKED); dS, only a matrix operand, keeps Triton's conversion, as
    does the forward's P."""
    spec = load_spec(str(SPECS / "softcap_pf.py")).retyped(dtype)
    name = {"f16": "float16", "bf16": "bfloat16"}[dtype]
    source = gradient_kernel(spec).source
    for lang in ("tl", "gl"):
        packed = re.findall(rf"(t\d+) = _packed_{dtype}_{lang}\(t\d+\)", source)
        plain = re.findall(rf"(t\d+) = t\d+\.to\({lang}\.{name}\)", source)
        assert len(set(packed)) >= 3 and plain
        assert all(f"{v}.to({lang}.float32)" in source for v in packed)
        assert not any(f"{v}.to({lang}.float32)" in source for v in plain)
    assert "_packed_" not in optimize(spec).source


@pytest.mark.parametrize("arch, packed", [(90, True), (80, True), (75, False)])
def test_triton_kernels_pack_their_conversions_when_compiled_for_sm_80_on(arch, packed, tmp_path):
    """The packed conversions are PTX of sm_80: a kernel compiled for an older GPU converts as Triton does. The
    choice is made when the kernel compiles, for the GPU Triton compiles for, so that importing a module asks
    torch nothing about the GPUs (which would initialize CUDA in the importing process)."""
    source = gradient_kernel(load_spec(str(SPECS / "softcap_pf.py")).retyped("bf16")).source
    script = tmp_path / "packed.py"
    script.write_text(PACKED_PTX)
    module = tmp_path / "kernel.py"
    module.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script), str(module), str(arch)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [packed, False]


PACKED_PTX = r'''
import importlib.util, json, sys
import torch
# importing the module must not ask torch about the GPUs: on a machine with one, that initializes CUDA
asked = []
torch.cuda.is_available, torch.cuda.device_count = (lambda: True), (lambda: 1)
torch.cuda.get_device_capability = lambda *a: asked.append(a) or (9, 0)
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, arch = sys.argv[1], int(sys.argv[2])
spec = importlib.util.spec_from_file_location("generated", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
target = GPUTarget("cuda", arch, 32)
current_target = lambda: target   # the GPU this kernel is compiled for, as Triton finds it on that machine
current_target.__triton_builtin__ = True
tl.target_info.current_target = current_target


@triton.jit
def round_pairs(x_ptr, y_ptr):
    offs = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(y_ptr + offs, mod._packed_bf16_tl(tl.load(x_ptr + offs)))


round_pairs.fn.__globals__["mod"] = mod
compiled = triton.compile(ASTSource(round_pairs, {"x_ptr": "*fp32", "y_ptr": "*bf16"}), target=target)
print(json.dumps(["cvt.rn.bf16x2.f32" in compiled.asm["ptx"], bool(asked)]))
'''


def program_order(source, row_blocks, grid, group):
    """(row block, grid index) of each program, in program order, as the generated kernel's head computes them."""
    head = source[source.index("    first = gl.program_id(0)"):]
    head = textwrap.dedent(head[:head.index("    h = ")])
    gl = types.SimpleNamespace(minimum=min, cdiv=lambda a, b: -(-a // b))
    order = []
    for pid in range(row_blocks * grid):
        env = {"gl": types.SimpleNamespace(**vars(gl), program_id=lambda axis, pid=pid: pid), "S": row_blocks * 128,
               "B": grid // 32, "BLOCK_J": 128, "GROUP": group}
        exec(head, env)
        order.append((env["pid_row"], env["pid_grid"]))
    return order


@pytest.mark.parametrize("group", [1, 3, 4, 32])
def test_programs_take_the_row_blocks_of_a_group_of_grid_indices_longest_first(group):
    """Every (row block, grid index) once; within a group of GROUP grid indices (the last one smaller where GROUP
    does not divide the grid) row block after row block, so a causal gradient's longest programs start first;
    GROUP 1 is one grid index after another."""
    source = gradient_kernel(load_spec(str(SPECS / "causal_pf.py"))).source
    order = program_order(source, 32, 64, group)
    assert sorted(order) == [(r, g) for r in range(32) for g in range(64)]
    for first in range(0, 64, group):
        members = min(group, 64 - first)
        chunk = order[first * 32:(first + members) * 32]
        assert chunk == [(r, g) for r in range(32) for g in range(first, first + members)]


def test_the_group_spans_about_one_wave_of_programs():
    """GROUP: as many grid indices as one program a multiprocessor covers with their row blocks (132 / 32 row
    blocks: 4), one where a grid index alone fills a wave, the whole grid for ORDER 2."""
    from neptune_eqsat.runtime import launch
    gpu = types.SimpleNamespace(type="cuda")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(launch, "_sm_count", lambda device: 132)
        assert [launch._group_size(1, rows, 32, gpu) for rows in (32, 64, 128, 512)] == [4, 2, 1, 1]
        assert launch._group_size(1, 8, 4, gpu) == 4 and launch._group_size(2, 32, 32, gpu) == 32


HOPPER_PTX = r'''
import importlib.util, json, re, sys
sys.path.insert(0, TESTS_DIR)
from hopper_compile import compile_for_hopper
path, blocks = sys.argv[1], json.loads(sys.argv[2])
spec = importlib.util.spec_from_file_location("generated", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
values = {"BLOCK_J": 128, "BLOCK_I": 64, "STAGES": 2, "EVEN": 1}
INT_POINTERS = ("split_ptr", "tickets_ptr", "blocks0_ptr", "capture0_ptr")   # the split's table, a mask's lists
compiled, ptx, regs = compile_for_hopper(getattr(mod, mod.NAME + "_gluon_kernel"), values, blocks.get,
                                         lambda name: "*i32" if name in INT_POINTERS else "*fp32")
print(json.dumps([compiled.metadata.num_warps, ptx.count("wgmma.mma_async") > 0,
                  ptx.count("cp.reduce.async.bulk.tensor"), regs,
                  len(re.findall(r"cvt\.rn\.b?f16\.f32", ptx))]))
'''.replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent)))


@pytest.mark.parametrize("name, dtype", [("global_pf", "f16"), ("causal_pf", "bf16"), ("softcap_pf", "bf16"),
                                         ("alibi_pf", "f16")])
def test_the_gluon_gradient_kernel_compiles_for_hopper(name, dtype, tmp_path):
    """For an H100 (to PTX and through ptxas): 12 warps (the producer's one warp padded to a warpgroup), the
    consumers at 240 registers and the producer's warpgroup lowered to 24, warpgroup products, the accumulated
    output added by the bulk tensor reduce, and every tile rounded to 16 bits two elements at a time: soft-cap's
    P, D + dP and tanh factor, each read again in fp32, were rounded one element at a time (192 lone
    conversions; in bf16 quarter-rate F2F instructions)."""
    result = gradient_kernel(load_spec(str(SPECS / f"{name}.py")).retyped(dtype))
    path = tmp_path / "kernel.py"
    path.write_text(result.source)
    torch_names = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
    dtypes = {n: torch_names[t.dtype] for n, t in result.spec.inputs.items()}
    dtypes.update({stem: torch_names[dt] for stem, _, dt, _ in outputs(result.spec)})
    blocks = {param: (dtypes[tensor], [int(b) for b in block.split(", ")])
              for param, tensor, block in re.findall(r"(\w+) = _gluon_descriptor\((\w+), \[([\d, ]+)\]\)",
                                                     result.source)}
    script = tmp_path / "ptx.py"
    script.write_text(HOPPER_PTX)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # (a reduction's combine: compiled)
    run = subprocess.run([sys.executable, str(script), str(path), json.dumps(blocks)], capture_output=True,
                         text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    warps, has_wgmma, reduces, regs, lone_conversions = json.loads(run.stdout.strip().splitlines()[-1])
    assert warps == 12 and has_wgmma and reduces >= 1 and lone_conversions == 0
    assert ["dec", "24"] in regs and ["inc", "240"] in regs and ["dec", "240"] in regs
    assert "], [4, 1], [240, 24])" in result.source   # the producer in one warp


@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon kernel runs on Hopper GPUs")
@pytest.mark.parametrize("causal, S", [(True, 777), (False, 256), (True, 1024)])
def test_the_gluon_gradients_match_float64_on_hopper(causal, S, monkeypatch):
    """Lengths off the blocks (the bound tests) and on them (EVEN: no tests), with and without a causal mask."""
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", "0")   # the first call runs the Gluon kernel, not Triton's
    spec = attention_spec(dim=128, heads=4, kv_heads=2, causal=causal)
    check_on_hopper(spec, {**spec.typical, "S": S}, seed=3, tol=2e-2)


@pytest.mark.parametrize("mask", ["prefix", "documents"])
def test_a_listed_mask_gets_the_gluon_gradient_kernel_walking_its_lists(mask, tmp_path):
    """Masks classified per block at run time (prefix-LM, documents: their blocks are listed, not bounded) get
    the one-pass Gluon kernel too (before: the two passes, 0.68-1.0x FlexAttention's backward at S = 4096 and
    16384 on an H100). Its producer and consumers walk the row block's lists, built by the launcher for the
    Gluon kernel's blocks (128 rows, 64 loop rows); it compiles for Hopper with either program order."""
    result = gradient_kernel(listed_mask_spec(mask))
    src = result.source
    assert f"def {result.spec.name}_gluon_kernel(" in src and "'BACKEND': 'gluon'" in src
    assert src.count("for it in range((blocks0_partial) - (0) + (blocks0_full) - (0)):") == 2
    assert "_block_table(rec, " in src and "(gluon_cfg['BLOCK_J'], gluon_cfg['BLOCK_I'], device" in src
    assert "gluon_cfg['ORDER'] = 2 if blocks0_skewed else 0" in src
    path = tmp_path / "kernel.py"
    path.write_text(src)
    blocks = {param: ("fp32" if tensor == "out2" else "bf16", [int(b) for b in block.split(", ")])
              for param, tensor, block in re.findall(r"(\w+) = _gluon_descriptor\((\w+), \[([\d, ]+)\]\)", src)}
    script = tmp_path / "ptx.py"
    script.write_text(HOPPER_PTX.replace('"EVEN": 1}', '"EVEN": 1, "ORDER": int(sys.argv[3])}'))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for order in (0, 2):
        run = subprocess.run([sys.executable, str(script), str(path), json.dumps(blocks), str(order)],
                             capture_output=True, text=True, timeout=600, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        warps, has_wgmma, reduces, _, _ = json.loads(run.stdout.strip().splitlines()[-1])
        assert warps == 12 and has_wgmma and reduces >= 1


def test_a_skewed_listed_mask_starts_every_grid_indexs_heaviest_row_block_first():
    """ORDER 2 (the launcher's choice where a few row blocks hold most of the work, global tokens): program p
    takes grid index p % grid and the (p // grid)-th row block of the table's order, so every head's row that
    sees every key starts in the first wave (in GROUP order the last heads' started in the last one)."""
    source = gradient_kernel(listed_mask_spec("prefix")).source
    head = source[source.index("    if ORDER == 2:"):]
    head = textwrap.dedent(head[:head.index("    h = ")])
    rows, grid, n_kb = 2, 4, 4   # S = 256: 2 row blocks of 128 keys, 4 loop blocks of 64 queries, 4 heads
    table = [0] * (rows * (2 * n_kb + 2)) + [1, 0]   # the lists (unread here), then the order: row block 1 first
    order = []
    for pid in range(rows * grid):
        gl = types.SimpleNamespace(program_id=lambda axis, pid=pid: pid, load=lambda at: table[at],
                                   minimum=min, cdiv=lambda a, b: -(-a // b))
        env = {"gl": gl, "S": 256, "L": 256, "B": 1, "BLOCK_J": 128, "BLOCK_I": 64, "GROUP": 1, "ORDER": 2,
               "blocks0_ptr": 0}
        exec(head, env)
        order.append((env["pid_row"], env["pid_grid"]))
    assert order == [(1, g) for g in range(grid)] + [(0, g) for g in range(grid)]


@pytest.mark.skipif(DEVICE != "cuda" or not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon kernel runs on Hopper GPUs")
@pytest.mark.parametrize("mask, S", [("prefix", 777), ("documents", 777), ("documents", 256)])
def test_the_gluon_gradients_of_a_listed_mask_match_float64_on_hopper(mask, S, monkeypatch):
    """A listed mask's one pass at lengths off the blocks (the bound tests beside the lists) and on them."""
    monkeypatch.setenv("NEPTUNE_EQSAT_COMPILE_AHEAD", "0")   # the first call runs the Gluon kernel, not Triton's
    check_on_hopper(listed_mask_spec(mask, S), {"B": 1, "L": S, "S": S}, seed=5, tol=5e-2)
