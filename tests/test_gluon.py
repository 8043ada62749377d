"""The warp-specialized Gluon kernel (codegen/gluon.py): which plans get one, that it compiles for Hopper as
three partitions of warps, and that the module's Triton kernel still runs beside it.

Gluon kernels run on Hopper GPUs only (no interpreter): here they are compiled for an H100 without one; their
outputs are checked against float64 on the GPU by bench/suite/attention.py (bench/results/h100/2026-11-22-gluon-kernels).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neptune_eqsat.codegen import gluon
from neptune_eqsat.codegen.gluon import eligible
from neptune_eqsat.codegen.tile_order import slot_loop, tile_lines
from neptune_eqsat.frontend.reference import evaluate, random_inputs, tolerance
from neptune_eqsat.runtime import launch
from neptune_eqsat.tune.database import candidates, tune

from conftest import DEVICE, SPECS, compiled, on_device

PREFILL = ["global_pf", "causal_pf", "gqa_pf", "alibi_pf", "softcap_pf", "window_pf"]


@pytest.mark.parametrize("name", PREFILL)
def test_rolled_prefill_plans_get_a_warp_specialized_kernel(name):
    result, mod = compiled(str(SPECS / f"{name}.py"))
    assert eligible(result.candidates[0].sched) is None
    assert f"def {name}_gluon_kernel(" in result.source and "gl.warp_specialize(" in result.source
    # consumer 0 in the kernel's own warps, consumer 1 in a warpgroup, the producer in one warp
    call = result.source.split("gl.warp_specialize([")[1].split("], [")[0]
    assert [line.split(",")[0].strip(" (") for line in call.strip().splitlines()] == [
        f"{name}_consumer", f"{name}_consumer", f"{name}_producer"]
    assert "], [4, 1], [240, 24])" in result.source
    assert mod.CONFIG["BACKEND"] == "gluon" and mod.INTERPRETER_CONFIG["BACKEND"] == "triton"
    assert "kernels: Triton, and a warp-specialized Gluon kernel for Hopper GPUs" in result.explain()


@pytest.mark.parametrize("name, reason", [
    ("softmax", "not a rolled pass over a loop axis writing row x column tiles"),
    ("causal_dc", "not a rolled pass over a loop axis writing row x column tiles"),
])
def test_other_plans_say_why_they_have_none(name, reason):
    result, mod = compiled(str(SPECS / f"{name}.py"))
    assert eligible(result.candidates[0].sched) == reason
    assert "_gluon_kernel" not in result.source and "BACKEND" not in mod.CONFIG


def test_the_triton_kernel_runs_beside_it_and_ignores_its_tunables():
    """Under the interpreter (and on the GPU when tuning picks it) the Triton kernel runs; the Gluon kernel's
    tunables in a config must not reach it."""
    result, mod = compiled(str(SPECS / "softcap_pf.py"))
    inputs = random_inputs(result.spec, {"B": 1, "S": 45}, seed=3)
    out = on_device(mod.forward, *inputs.values(), config={"BACKEND": "triton", "WS_STAGES": 2, "WS_BLOCK_J": 64})
    assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance("f16")


GLUON_PTX = r'''
import importlib.util, sys
sys.path.insert(0, TESTS_DIR)
from hopper_compile import compile_for_hopper
out_buf = int(sys.argv[1])
for path in sys.argv[2:]:
    spec = importlib.util.spec_from_file_location("generated", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.CONFIG
    values = {"BLOCK_I": 128, "BLOCK_J": cfg["WS_BLOCK_J"], "STAGES": 2 if out_buf else cfg["WS_STAGES"],
              "ORDER": 4 if out_buf else 2, "O_BUF": out_buf, "EVEN": out_buf}   # (the planned grouped order compiles too)

    def descriptor(name):
        if "_desc" not in name:
            return None
        tensor = name.split("_desc")[0]
        dims = mod.INPUTS[tensor][1] if tensor in mod.INPUTS else mod.INPUTS["q"][1]
        rows = 64 if tensor == "out" else values["BLOCK_I"] if tensor == "q" else values["BLOCK_J"]
        return "fp16", [1] * (len(dims) - 2) + [rows, dims[-1]]

    def pointer(name):   # an input's dtype, or a block table's int32 lists
        return {"float32": "*fp32", "float16": "*fp16", None: "*i32"}[mod.INPUTS.get(name[:-4], (None,))[0]]
    compiled, ptx, regs = compile_for_hopper(getattr(mod, mod.NAME + "_gluon_kernel"), values, descriptor, pointer)
    print(mod.NAME, compiled.metadata.num_warps, compiled.metadata.shared, ptx.count("wgmma.mma_async"), regs)
'''.replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent)))


@pytest.mark.parametrize("out_buf", [0, 1])
def test_the_gluon_kernels_compile_for_hopper_as_three_partitions(tmp_path, out_buf):
    """Every prefill module's Gluon kernel compiles for an H100 (to PTX and through ptxas): 12 warps (the
    producer's one warp padded to a warpgroup), both consumer warpgroups at 240 registers and the producer's
    lowered to 24, warpgroup matrix products, and in shared memory its ring of 3 key/value stages, or of 2
    beside an output buffer of its own (O_BUF)."""
    paths = []
    for name in PREFILL:
        result, _ = compiled(str(SPECS / f"{name}.py"))
        paths.append(tmp_path / f"{name}.py")
        paths[-1].write_text(result.source)
    script = tmp_path / "ptx.py"
    script.write_text(GLUON_PTX)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    lines = subprocess.run([sys.executable, str(script), str(out_buf), *map(str, paths)], env=env, check=True,
                           capture_output=True, text=True, timeout=900).stdout.splitlines()
    assert [line.split()[0] for line in lines] == PREFILL
    for line in lines:
        name, warps, shared, products, regs = line.split(maxsplit=4)
        assert int(warps) == 12
        # Q, and three stages of K and V, or two and the output (128 rows of fp16): within 227 KiB
        assert (2 if out_buf else 3) * 2 * 128 * 128 * 2 + out_buf * 128 * 128 * 2 < int(shared) <= 232448
        assert int(products) > 0
        assert "('inc', '240')" in regs and "('dec', '240')" in regs and "('dec', '24')" in regs


def _listed_mask_sources() -> dict[str, object]:
    """Modules of masks whose key blocks are listed at run time (blocks.py), each with its spec: two of
    positions (prefix-LM; a sliding window with sink keys under grouped-query heads and a soft-cap) and one
    reading a document id per position."""
    import torch
    from neptune_eqsat import compiled as compiled_modules, flex
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([3, 20, 9, 32]))

    def prefix_lm(b, h, i, j):
        return (j < 24) | (i >= j)

    def window_sinks(b, h, i, j):
        return (i >= j) & ((i - j < 16) | (j < 4))

    def document_causal(b, h, i, j):
        return (doc[i] == doc[j]) & (i >= j)

    def softcap(score, b, h, i, j):
        return 30.0 * torch.tanh(score / 30.0)
    sources = {}
    for name, score_mod, mask_mod, kv_heads in (("prefix_lm", None, prefix_lm, 8),
                                                ("window_sinks_gqa_softcap", softcap, window_sinks, 2),
                                                ("documents", None, document_causal, 8)):
        q = torch.empty(1, 8, 64, 128, dtype=torch.float16)
        k = torch.empty(1, kv_heads, 64, 128, dtype=torch.float16)
        problem = flex._problem(q, k, k, None, kv_heads != 8)
        spec = flex.trace(score_mod, mask_mod, problem)[0]
        sources[name] = compiled_modules.cached_source(flex.plan_key(spec, problem), spec).read_text()
    return sources


def test_listed_masks_of_positions_get_a_gluon_kernel_that_walks_their_lists(tmp_path):
    """A mask of positions classified per block (blocks.py): the Gluon kernel takes its row blocks in the table's
    order, copies the partial then the full key blocks, tests bounds and the mask in the partial ones only, and
    compiles for an H100 as three partitions; the launcher takes it only where the table is not skewed and at
    most half its blocks are partial. A table rebuilt from tensors every call keeps the Triton kernel."""
    sources = _listed_mask_sources()
    assert "_gluon_kernel(" not in sources.pop("documents")
    paths = []
    for name, source in sources.items():
        assert "blocks0_ptr" in source.split("_producer(")[1].split(")")[0], name
        consumer = source.split("_consumer(")[1].split("@gluon.jit")[0]
        partial, full = consumer.split("for blk in range(0, blocks0_partial):")[1].split(
            "for blk in range(0, blocks0_full):")
        full = full.split("# the last block")[0]
        assert "valid_j = offs_j <" in partial and "valid_j" not in full   # full blocks: no bound test
        masked = re.compile(r"selp\.f32 \$0, \$\d, 0fFF800000")   # a masked score (a predicated select)
        assert masked.search(partial) and not masked.search(full)
        assert f"blocks0_partial_share <= {gluon.GLUON_PARTIAL_SHARE}" in source
        paths.append(tmp_path / f"{name}.py")
        paths[-1].write_text(source)
    script = tmp_path / "ptx.py"
    script.write_text(GLUON_PTX)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    lines = subprocess.run([sys.executable, str(script), "1", *map(str, paths)], env=env, check=True,
                           capture_output=True, text=True, timeout=900).stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        _, warps, _, products, regs = line.split(maxsplit=4)
        assert int(warps) == 12 and int(products) > 0 and "('inc', '240')" in regs


def _tiles_run(programs, row_blocks, heads, order, group=1):
    """(pid_row, pid_grid) of each tile each program runs, by executing the kernel's slot loop and slot -> tile
    lines (under ORDER 3 with the launcher's plan)."""
    tiles, ordered, plan = str(row_blocks * heads), order is not None, [0]
    if ordered:   # the launcher's choice: ORDER 3 with fewer programs than tiles runs as ORDER 4, with its plan
        _, order, plan = launch._tile_plan(None, order, row_blocks, heads, group, programs, "cpu")
        plan = plan.tolist()
    body = tile_lines(str(row_blocks), str(heads), tiles, ordered) + ["runs[-1].append((pid_row, pid_grid))"]
    code = "\n".join(slot_loop(tiles, ordered) + ["    " + x for x in body])
    runs = []
    for p in range(programs):
        class gl:   # the calls the lines make
            program_id = staticmethod(lambda axis: p)
            num_programs = staticmethod(lambda axis: programs)
            minimum = staticmethod(min)
            load = staticmethod(lambda at: plan[at])
        runs.append([])
        exec(code, {"gl": gl, "ORDER": order, "GROUP": group, "tile_plan_ptr": 0, "runs": runs})
    return runs


@pytest.mark.parametrize("order, group", [(None, 1), (1, 1), (2, 1), (3, 1), (3, 16), (3, 5), (3, 64)])
@pytest.mark.parametrize("programs", [132, 512, 7])
def test_every_tile_runs_once_in_every_order(order, group, programs):
    runs = _tiles_run(programs, 8, 64, order, group)
    assert sorted(t for run in runs for t in run) == [(r, h) for r in range(8) for h in range(64)]


def test_grouped_order_keeps_a_wave_on_few_grid_indices_longest_first(monkeypatch):
    """ORDER 3 with the launcher's GROUP (one wave of 132 programs over 32 row blocks: 4 heads) starts a program
    per tile in group order: each wave of 132 tiles touches at most 2 groups' heads (8), where ORDER 2's first
    wave touches all 32, and within a group the longest row blocks start first."""
    monkeypatch.setattr(launch, "_program_slots", lambda device: 132)
    group = launch._group_size(3, 32, 32, None)
    assert group == 4 and launch._group_size(3, 128, 32, None) == 1
    order = [run[0] for run in _tiles_run(32 * 32, 32, 32, 3, group)]   # a program per tile: the start order
    for wave in range(0, len(order), 132):
        assert len({h for _, h in order[wave:wave + 132]}) <= 8
    assert len({h for _, h in (run[0] for run in _tiles_run(32 * 32, 32, 32, 2)[:132])}) == 32
    for g in range(8):
        rows = [r for r, h in order if h // 4 == g]
        assert rows == sorted(rows, reverse=True)


def test_a_grouped_order_is_one_move_of_the_tuner_with_or_without_persistent_programs():
    """The tuner tries ORDER 3 as a single change (persistent programs kept) and with a program per tile; the
    launcher builds ORDER 3's plan for the programs it starts, and runs it as ORDER 4 where they are fewer than
    the tiles."""
    base = {"num_warps": 8, "BLOCK_I": 128, "BLOCK_J": 128, "BACKEND": "gluon", "WS_BLOCK_J": 128, "WS_STAGES": 3,
            "WS_PERSISTENT": 1, "WS_ORDER": 2}
    grid = candidates(base)
    assert {c["WS_PERSISTENT"] for c in grid if c["WS_ORDER"] == 3} == {0, 1}
    singles = [c for c in grid if sum(c[k] != base[k] for k in base) == 1]
    assert {**base, "WS_ORDER": 3} in singles
    result, _ = compiled(str(SPECS / "causal_pf.py"))
    assert "programs = min(tiles, _sm_count(device)) if cfg['WS_PERSISTENT'] else tiles" in result.source
    assert "programs, gluon_cfg['ORDER'], tile_plan = _tile_plan(rec, cfg['WS_ORDER']" in result.source
    assert "GROUP = _group_size(cfg['WS_ORDER']" in result.source


def test_persistent_programs_in_the_grouped_order_get_even_work_and_start_like_a_program_per_tile():
    """ORDER 3's plan hands the grouped order's tiles out as a GPU starting a program per tile would: 132
    persistent programs over causal 4k (32 heads x 32 row blocks, 4 heads a group) end within 1.02x of the mean
    work (r + 2 a tile of row block r), their first tiles are the first wave of a program per tile, and each
    program's later tiles come later in the grouped order; with a program per tile the plan is the order."""
    persistent, one_each = _tiles_run(132, 32, 32, 3, 4), _tiles_run(32 * 32, 32, 32, 3, 4)
    loads = [sum(r + 2 for r, _ in run) for run in persistent]
    assert max(loads) <= 1.02 * sum(loads) / len(loads)
    position = {run[0]: n for n, run in enumerate(one_each)}
    assert [run[0] for run in persistent] == [run[0] for run in one_each[:132]]
    assert all(position[a] < position[b] for run in persistent for a, b in zip(run, run[1:]))
    assert launch._plan_slots(3, 5, 2, 15) == list(range(16)) + list(range(15))


def test_the_launcher_plans_the_grouped_order_for_persistent_programs_up_to_a_bound():
    """ORDER 3 with fewer programs than tiles runs as ORDER 4 with a plan; beyond PLANNED_TILES tiles a program
    (the plan's host time grows with the tiles) and with a program per tile it runs ORDER 3 unplanned; other
    orders read one unread entry."""
    programs, order, plan = launch._tile_plan(None, 3, 32, 32, 4, 132, "cpu")
    assert (programs, order, plan.tolist()) == (132, 4, launch._plan_slots(32, 32, 4, 132))
    many = launch.PLANNED_TILES * 7 + 1
    assert launch._tile_plan(None, 3, many, 1, 1, 7, "cpu")[:2] == (many, 3)
    assert launch._tile_plan(None, 3, 32, 32, 4, 1024, "cpu")[:2] == (1024, 3)
    programs, order, plan = launch._tile_plan(None, 2, 32, 32, 32, 132, "cpu")
    assert (programs, order, plan.numel()) == (132, 2, 1)


def test_with_a_causal_mask_persistent_programs_get_even_work():
    """Row block r of a causal tile runs r + 1 key blocks. ORDER 2 starts the longest everywhere and runs odd
    rounds backwards: 64 heads x 8 row blocks on 132 programs end within 1.1x of the mean work, where taking
    tiles in order (ORDER 1) leaves one program 1.4x the mean."""
    mean = 64 * 36 / 132
    work = {o: max(sum(r + 1 for r, _ in run) for run in _tiles_run(132, 8, 64, o)) for o in (1, 2)}
    assert work[2] <= 1.1 * mean and work[1] >= 1.35 * mean
    one_each = _tiles_run(512, 8, 64, 2)   # a program per tile: the hardware starts them in this order
    assert [run[0][0] for run in one_each] == sorted((run[0][0] for run in one_each), reverse=True)


def test_tuning_varies_only_the_tunables_of_the_kernel_that_runs():
    config = {"num_warps": 8, "num_stages": 3, "BLOCK_I": 128, "BLOCK_J": 128, "BACKEND": "gluon",
              "WS_BLOCK_J": 128, "WS_STAGES": 3}
    grid = candidates(config)
    assert grid[0] == config
    gluon = [c for c in grid if c["BACKEND"] == "gluon"]
    assert len(gluon) == 4 and all(c["num_warps"] == 8 and c["BLOCK_I"] == 128 for c in gluon)
    assert all(c["WS_BLOCK_J"] == 128 and c["WS_STAGES"] == 3 for c in grid if c["BACKEND"] == "triton")
    assert len({tuple(c.values()) for c in grid}) == len(grid)


def test_a_config_measured_best_before_is_tried_right_after_the_default():
    config = {"num_warps": 8, "BLOCK_I": 128, "BACKEND": "gluon", "WS_BLOCK_J": 128, "WS_STAGES": 3}
    earlier = {"num_warps": 4, "BLOCK_I": 64, "BACKEND": "triton"}
    seen = []

    def forward(*inputs, config):
        seen.append(config)

    def measure(fn):   # the earlier config is the fastest
        fn()
        return 1.0 if seen[-1]["num_warps"] == 4 else 2.0

    result = tune(forward, [], config, budget=60.0, measure=measure, progress=None, seeds=[earlier])
    assert seen[0] == config and seen[1] == {**config, **earlier}
    assert result.best == {**config, **earlier}


def test_a_training_forward_writes_its_row_values_from_the_gluon_kernel(tmp_path):
    """The forward a training step runs (the output, then the saved row max and row sum as further outputs)
    keeps its warp-specialized kernel: each consumer stores its rows of the row values, and it compiles for an
    H100 as the one-output kernel does."""
    from neptune_eqsat.compiler import optimize
    from neptune_eqsat.plan.autodiff import differentiate
    from neptune_eqsat.spec import load_spec
    spec = differentiate(load_spec(SPECS / "causal_pf.py")).forward_spec()
    assert len(spec.also) == 2
    result = optimize(spec)
    assert "no warp-specialized" not in result.explain()
    assert "gl.store(out1_ptr" in result.source and "gl.store(out2_ptr" in result.source
    path = tmp_path / "causal_pf_training.py"
    path.write_text(result.source)
    script = tmp_path / "ptx.py"
    script.write_text(GLUON_PTX)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    (line,) = subprocess.run([sys.executable, str(script), "1", str(path)], env=env, check=True, capture_output=True,
                             text=True, timeout=900).stdout.splitlines()
    assert int(line.split()[1]) == 12


@pytest.mark.skipif(DEVICE == "cpu", reason="Gluon kernels have no interpreter: run with NEPTUNE_TEST_DEVICE=cuda")
def test_the_training_forwards_row_values_match_float64_on_the_gpu():
    from neptune_eqsat.compiler import optimize
    from neptune_eqsat.frontend.reference import evaluate_all
    from neptune_eqsat.plan.autodiff import differentiate
    from neptune_eqsat.runtime.loader import load_module
    from neptune_eqsat.spec import load_spec
    spec = differentiate(load_spec(SPECS / "causal_pf.py")).forward_spec()
    module = load_module(optimize(spec).source, "causal_pf_training")
    inputs = random_inputs(spec, {"B": 1, "S": 333}, seed=5)
    outs = module.forward(*(t.to(DEVICE) for t in inputs.values()))
    refs = evaluate_all(spec, {n: t.double() for n, t in inputs.items()})
    for got, want, tol in zip(outs, refs, (tolerance("f16"), 1e-4, 1e-4)):
        err = (got.cpu().double() - want).abs().max().item() / max(1.0, want.abs().max().item())
        assert err < tol, err


def test_an_output_buffer_takes_the_stages_that_fit_beside_it():
    """WS_OUT_BUF asks for an output buffer of the warp-specialized kernel's own: it keeps the stages of the ring
    that fit beside it in 227 KiB (2 of 128 keys, 3 of 64 at D 128 in fp16), and where fewer than 2 fit, or none
    was asked for, the output leaves through A with the stages asked for."""
    import types
    from neptune_eqsat.runtime.descriptors import _output_buffer

    def block(rows, cols=128, size=2):
        base = types.SimpleNamespace(element_size=lambda: size)
        return types.SimpleNamespace(base=base, block_shape=[1, 1, rows, cols])
    q, out = block(128), block(64)
    assert _output_buffer(q, block(128), block(128), out, 1, 3, 2) == (1, 2)
    assert _output_buffer(q, block(64), block(64), out, 1, 3, 2) == (1, 3)
    assert _output_buffer(q, block(64), block(64), out, 1, 2, 2) == (1, 2)
    assert _output_buffer(q, block(128), block(128), out, 0, 3, 2) == (0, 3)
    assert _output_buffer(q, block(128, 256), block(128, 256), block(64, 256), 1, 3, 2) == (0, 3)   # D 256
