"""Split-K: decode specs optimize to split plans found by saturation, prefill specs keep rolling update; the
split kernels match float64 for any chunking; and the combine algebra is exact for any cut of the key axis."""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from neptune_eqsat import ir
from neptune_eqsat.plan.combine import combine_plan
from neptune_eqsat.plan.cost import Device, split_count
from neptune_eqsat.frontend.reference import Evaluator, _align, evaluate, random_inputs, tolerance

from conftest import FEW, SPECS, compiled, on_device

DECODE = ["causal_dc", "gqa_dc", "alibi_dc", "softcap_dc"]


@pytest.mark.parametrize("name", DECODE)
def test_decode_specs_choose_split_plans(name):
    result, _ = compiled(str(SPECS / f"{name}.py"))
    assert result.chosen.family.startswith("split")
    assert any(r.startswith("split-") for r in result.saturation.fired)
    families = [c.family for c in result.candidates]
    assert "rolled" in families    # both plans were priced
    text = result.explain()
    assert "chunks=" in text
    assert "split_sum(j / chunks" in text


def test_grouped_decode_packs_the_heads_of_a_group():
    result, _ = compiled(str(SPECS / "gqa_dc.py"))
    assert result.chosen.family == "split+packed"
    assert result.chosen.cost.bytes < 0.2 * next(c.cost.bytes for c in result.candidates if c.family == "split")


@pytest.mark.parametrize("name", ["causal_pf", "gqa_pf"])
def test_prefill_specs_keep_rolling_update(name):
    result, _ = compiled(str(SPECS / f"{name}.py"))
    assert result.chosen.family == "rolled"


def test_chunk_count_fills_the_device_only_when_it_must():
    sms = Device().sms
    assert split_count(32, 256, sms) > 1           # decode: 32 programs would leave most SMs idle
    assert split_count(1024, 32, sms) == 1          # prefill: already many waves of programs
    assert split_count(8, 1, sms) == 1              # one key block cannot be split


@pytest.mark.parametrize("name", DECODE)
@FEW
@given(batch=st.integers(1, 2), queries=st.integers(1, 4), kv=st.integers(1, 40), chunks=st.integers(0, 5))
def test_decode_kernels_match_float64(name, batch, queries, kv, chunks):
    """Odd KV lengths, several queries at the end of the sequence (bottom-right causal), chunk counts that do
    not divide the length (0 = the launcher's choice); several batches or several queries, up to four rows."""
    assume(batch * queries <= 4)
    result, mod = compiled(str(SPECS / f"{name}.py"))
    inputs = random_inputs(result.spec, {"B": batch, "Q": queries, "SKV": kv}, seed=kv)
    out = on_device(mod.forward, *inputs.values(), config={"CHUNKS": chunks})
    ref = evaluate(result.spec, inputs)
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype)


def test_kv_shorter_than_one_chunk_and_more_chunks_than_blocks():
    result, mod = compiled(str(SPECS / "causal_dc.py"))
    inputs = random_inputs(result.spec, {"B": 1, "Q": 1, "SKV": 3}, seed=1)
    ref = evaluate(result.spec, inputs)
    for chunks in (1, 8):
        out = on_device(mod.forward, *inputs.values(), config={"CHUNKS": chunks})
        assert (out.double() - ref).abs().max().item() <= tolerance("f16")



@pytest.mark.parametrize("in_kernel", [1, pytest.param(0, marks=pytest.mark.slow)])   # 0: also in the next test
def test_the_combine_runs_in_the_partial_kernel_or_in_a_second_one(in_kernel):
    """In one launch the last chunk program of each tile combines; its ticket is left zero for the next call
    (a ticket left over would make a later call combine too early)."""
    result, mod = compiled(str(SPECS / "gqa_dc.py"))
    combine = {**mod.INTERPRETER_CONFIG["COMBINE"], "in_kernel": in_kernel}
    for kv, seed in ((37, 1), (50, 3)):
        inputs = random_inputs(result.spec, {"B": 1, "Q": 3, "SKV": kv}, seed=seed)
        out = on_device(mod.forward, *inputs.values(), config={"CHUNKS": 3, "COMBINE": combine})
        assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance("f16")
        assert all(int(t.abs().sum()) == 0 for t in mod._TICKETS.values())


def test_a_config_sets_one_combine_entry_and_a_misspelt_tunable_is_refused():
    """COMBINE={"in_kernel": 0} changes that entry and keeps the others (before: the table was replaced whole and
    the call failed on a missing entry); a tunable the module lacks is refused, not ignored."""
    result, mod = compiled(str(SPECS / "causal_dc.py"))
    inputs = random_inputs(result.spec, {"B": 1, "Q": 1, "SKV": 29}, seed=4)
    out = on_device(mod.forward, *inputs.values(), config={"CHUNKS": 2, "COMBINE": {"in_kernel": 0}})
    assert (out.double() - evaluate(result.spec, inputs)).abs().max().item() <= tolerance("f16")
    with pytest.raises(KeyError, match=r"config: no tunable 'CHUNK' \(this module's: .*CHUNKS"):
        on_device(mod.forward, *inputs.values(), config={"CHUNK": 2})


@pytest.mark.parametrize("name", [n if n != "softcap_dc" else pytest.param(n, marks=pytest.mark.slow) for n in DECODE])
def test_the_combine_rolls_over_blocks_of_chunks_in_one_pass(name):   # softcap_dc's combine is gqa_dc's
    """The combine reads every partial once, in one pass: its reductions over chunks are rolled, the running
    sums repaired as the running maximum grows block by block. Peaked scores make the chunks' maxima differ a
    lot, and the 11 chunks asked of 45 keys (one per key block: 3) in blocks of 2 give two blocks (the last one
    partial), so a missing or wrong repair shows."""
    result, mod = compiled(str(SPECS / f"{name}.py"))
    comb = combine_plan(result.chosen.sched)
    assert comb.sched.passes == 1
    assert all(r.op == "roll" for r in comb.sched.reductions)
    inputs = random_inputs(result.spec, {"B": 1, "Q": 2, "SKV": 45}, seed=5)
    inputs["q"] = inputs["q"] * 6
    ref = evaluate(result.spec, inputs)
    combine = {**mod.INTERPRETER_CONFIG["COMBINE"], "BLOCK_J_CHUNK": 2}
    for in_kernel in (1, 0):
        out = on_device(mod.forward, *inputs.values(), config={"CHUNKS": 11, "COMBINE": {**combine, "in_kernel": in_kernel}})
        assert (out.double() - ref).abs().max().item() <= tolerance(result.spec.output_dtype)


def _chunk_local(term: ir.Term, loop: str, lo: int, hi: int, memo: dict) -> ir.Term:
    """The term with every split reduction over `loop` restricted to keys lo <= j < hi (its chunk-local value)."""
    if term in memo:
        return memo[term]
    if term.op == "split" and term.attrs[1] == loop:
        j = ir.axis(loop)
        inside = ir.bin("and", ir.bin("ge", j, ir.const(lo)), ir.bin("lt", j, ir.const(hi)))
        body = _chunk_local(term.args[0], loop, lo, hi, memo)
        out = ir.red(term.attrs[0], loop, ir.where(inside, body, ir.const(ir.REDUCERS[term.attrs[0]])))
    elif term.args:
        out = ir.Term(term.op, term.attrs, tuple(_chunk_local(a, loop, lo, hi, memo) for a in term.args))
    else:
        out = term
    memo[term] = out
    return out


@pytest.mark.parametrize("name", ["causal_dc", "alibi_dc", "max_normalized_sum"])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_split_and_combine_in_any_chunking_equals_the_unsplit_reduction(name, data):
    """In float64, on the IR: partial results of arbitrary (not block-aligned, possibly empty) chunks,
    combined by the combine term with the derived repair, equal the spec's unsplit result."""
    result, _ = compiled(str(SPECS / f"{name}.py"))
    plan = next(c for c in result.candidates if c.family == "split")
    sched, spec = plan.sched, result.spec
    n = data.draw(st.integers(1, 40), label="length")
    sizes = {"B": 1, "Q": 2, "SKV": n} if name != "max_normalized_sum" else {"R": 3, "N": n}
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=5), label="cuts"))
    bounds = list(zip([0] + cuts, cuts + [n]))
    inputs = {k: v.double() for k, v in random_inputs(spec, sizes, seed=n).items()}
    if name != "max_normalized_sum":
        inputs["q"] = inputs["q"] * 4   # peaked scores: the chunks' maxima differ a lot
    comb = combine_plan(sched)
    ev = Evaluator(spec, inputs)
    partials = {}
    for p in comb.partials:
        vals = [_align(ev(_chunk_local(p.reduction, sched.loop, lo, hi, {})), p.axes) for lo, hi in bounds]
        partials[p.name] = torch.stack([v.expand(*[ev.extent(a) for a in p.axes]) for v in vals])
    combined = evaluate(comb.spec, {**{k: v for k, v in inputs.items() if k in comb.spec.inputs}, **partials})
    assert torch.allclose(combined, evaluate(spec, inputs), rtol=1e-9, atol=1e-9)


def test_the_cost_model_picks_rolling_for_decode_shapes_that_fill_the_device():
    from neptune_eqsat.compiler import optimize
    assert optimize(str(SPECS / "causal_dc.py"), sizes={"B": 128, "SKV": 512}).chosen.family == "rolled"
    small = optimize(str(SPECS / "causal_dc.py"), sizes={"B": 1, "SKV": 32768}, device=Device(sms=8))
    assert small.chosen.family == "rolled"   # 32 programs already fill an 8-SM device


def test_split_kernels_mark_their_key_loads_read_once_and_prefill_kernels_do_not():
    """Each chunk program reads its K/V once: under STREAM those loads carry an evict-first hint (the query,
    read by every chunk, does not); a prefill kernel, whose row blocks all read the same K/V, has no switch.
    Both settings of the switch give the float64 result."""
    result, mod = compiled(str(SPECS / "gqa_dc.py"))
    hinted = [line for line in result.source.splitlines() if "evict_first" in line]
    assert hinted and all("tl.load(k_ptr" in line or "tl.load(v_ptr" in line for line in hinted)
    assert all('eviction_policy="evict_first" if STREAM else ""' in line for line in hinted)
    assert mod.CONFIG["STREAM"] == 1 and mod.CONFIG["num_stages"] == 1   # a pipelined load would drop the hint
    prefill, _ = compiled(str(SPECS / "causal_pf.py"))
    assert "evict" not in prefill.source and "STREAM" not in prefill.source
    inputs = random_inputs(result.spec, {"B": 1, "Q": 2, "SKV": 45}, seed=4)
    ref = evaluate(result.spec, inputs)
    for stream in (0, 1):
        out = on_device(mod.forward, *inputs.values(), config={"STREAM": stream, "CHUNKS": 3})
        assert (out.double() - ref).abs().max().item() <= tolerance("f16")


PTX_OF_PARTIAL_KERNEL = r'''
import importlib.util, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, folder = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("generated", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
kernel = getattr(mod, mod.NAME + "_kernel")
for stream in (1, 0):
    cfg = {**mod.CONFIG, "STREAM": stream, "USE_TMA": 0, "num_stages": 1}
    values = {"COMBINE_IN_KERNEL": 1, **{"COMBINE_" + k: v for k, v in cfg["COMBINE"].items()}, **cfg}
    signature, constants, attrs = {}, {}, {}
    for n, p in enumerate(kernel.params):
        if p.is_constexpr:
            signature[p.name], constants[p.name] = "constexpr", values[p.name]
        elif "_desc" in p.name:
            signature[p.name], constants[p.name] = "constexpr", None
        elif p.name.endswith("_ptr"):
            part = "*fp32" if p.name.startswith("part") else "*fp16"
            signature[p.name] = "*i32" if p.name == "tickets_ptr" else part
            attrs[(n,)] = [["tt.divisibility", 16]]
        else:
            signature[p.name] = "i32"
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": 1})
    open(f"{folder}/stream{stream}.ptx", "w").write(compiled.asm["ptx"])
'''


def test_the_read_once_hint_reaches_the_machine_code(tmp_path):
    """Compiled for a Hopper GPU (no GPU needed to compile), the K/V loads of the partial kernel carry the L2
    evict-first policy exactly when STREAM is on (both settings compiled in one process)."""
    result, _ = compiled(str(SPECS / "gqa_dc.py"))
    module, script = tmp_path / "gqa_dc.py", tmp_path / "ptx.py"
    module.write_text(result.source)
    script.write_text(PTX_OF_PARTIAL_KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(script), str(module), str(tmp_path)], env=env, check=True,
                   capture_output=True, text=True, timeout=600)
    for stream in (1, 0):
        ptx = (tmp_path / f"stream{stream}.ptx").read_text()
        assert "ld.global" in ptx
        assert ("createpolicy.fractional.L2::evict_first" in ptx) == bool(stream)
        assert ("L2::cache_hint" in ptx) == bool(stream)
