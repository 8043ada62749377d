"""The FlexAttention-compatible API on CPU tensors (kernels under Triton's interpreter) against a float64
reference that applies the same score_mod / mask_mod to real index tensors, FlexAttention's semantics."""
import math
import os
import sys

import pytest
import torch

from neptune_eqsat import compiled, flex_attention
from neptune_eqsat.flex import TraceError

F16 = torch.float16


def reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """softmax(score_mod(q k^T * scale)) v over kept keys, in float64; rows that keep no key give 0."""
    B, H, L, D = q.shape
    S = k.shape[2]
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], 1)
        v = v.repeat_interleave(H // v.shape[1], 1)
    s = q.double() @ k.double().transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(D))
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    i = torch.arange(L)[None, None, :, None]
    j = torch.arange(S)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, i, j).double().expand(B, H, L, S)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, i, j).expand(B, H, L, S), -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v.double()


def inputs(B, H, HKV, L, S, D, seed=0, dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).to(F16)
    k = torch.randn(B, HKV, S, D, generator=g).to(F16)
    v = torch.randn(B, HKV, S, dv or D, generator=g).to(F16)
    return q, k, v


def check(q, k, v, score_mod=None, mask_mod=None, scale=None, gqa=False):
    out = flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, scale=scale, enable_gqa=gqa)
    ref = reference(q, k, v, score_mod, mask_mod, scale)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert not torch.isnan(out).any()
    err = (out.double() - ref).abs().max().item()
    assert err <= 2e-2, err
    return out


def causal(b, h, qi, ki):
    return qi >= ki


# ---- Neptune's ten operators through the API (head counts scaled down, ratios kept) --------------------------
SLOPES = torch.exp2(-torch.arange(1, 5, dtype=torch.float32))
OFFSET = torch.tensor(0)   # the decode query's position minus its index, set per call below


def alibi(s, b, h, qi, ki):
    return s + SLOPES[h] * (ki - qi)


def softcap(s, b, h, qi, ki):
    return 50.0 * torch.tanh(s / 50.0)


def window(b, h, qi, ki):
    return (qi >= ki) & (qi - ki < 8)


def alibi_decode(s, b, h, qi, ki):
    return s + SLOPES[h] * (ki - (qi + OFFSET))


PREFILL = {"global_pf": (4, 4, None, None), "causal_pf": (4, 4, None, causal), "gqa_pf": (8, 1, None, causal),
           "alibi_pf": (4, 4, alibi, causal), "softcap_pf": (4, 2, softcap, causal), "window_pf": (4, 1, softcap, window)}
DECODE = {"causal_dc": (4, 4, None), "gqa_dc": (8, 1, None), "alibi_dc": (4, 4, alibi_decode),
          "softcap_dc": (4, 2, softcap)}


@pytest.mark.parametrize("name", PREFILL)
def test_prefill_operators(name):
    hq, hkv, score_mod, mask_mod = PREFILL[name]
    q, k, v = inputs(2, hq, hkv, 37, 37, 32, seed=1)
    check(q, k, v, score_mod, mask_mod, gqa=hq != hkv)


@pytest.mark.parametrize("name", DECODE)
def test_decode_operators(name):
    hq, hkv, score_mod = DECODE[name]
    q, k, v = inputs(1, hq, hkv, 1, 53, 32, seed=2)
    OFFSET.fill_(52)    # the query is the newest token
    check(q, k, v, score_mod, None, gqa=hq != hkv)


# ---- other common variants -----------------------------------------------------------------------------------
DOC = torch.tensor([0] * 9 + [1] * 14 + [2] * 10)
TABLE = torch.randn(2 * 33 - 1)
HEAD_BIAS = torch.randn(4)
QUERY_BIAS = torch.randn(2, 33)
TEMPERATURE = torch.tensor(0.7)

VARIANTS = {
    "prefix_lm": (None, lambda b, h, qi, ki: (ki < 6) | (qi >= ki)),
    "document": (None, lambda b, h, qi, ki: (DOC[qi] == DOC[ki]) & (qi >= ki)),
    "relative_bias_table": (lambda s, b, h, qi, ki: s + TABLE[qi - ki + 32], causal),
    "sliding_window_with_sinks": (None, lambda b, h, qi, ki: ((qi - ki < 5) & (qi >= ki)) | (ki < 2)),
    "dilated_window": (None, lambda b, h, qi, ki: ((qi - ki) % 2 == 0) & (qi >= ki) & (qi - ki < 12)),
    "temperature": (lambda s, b, h, qi, ki: s / TEMPERATURE, causal),
    "head_bias": (lambda s, b, h, qi, ki: s + HEAD_BIAS[h], None),
    "query_bias": (lambda s, b, h, qi, ki: s + QUERY_BIAS[b, qi], causal),
    "clamped_scores": (lambda s, b, h, qi, ki: torch.clamp(s, -0.5, 0.5), None),
    "where_in_score_mod": (lambda s, b, h, qi, ki: torch.where(qi >= ki, s, s - 2.0), None),
    "empty_rows": (None, lambda b, h, qi, ki: (qi >= ki + 4)),
    "sigmoid_gate": (lambda s, b, h, qi, ki: s * torch.sigmoid(s), causal),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_common_variants(name):
    score_mod, mask_mod = VARIANTS[name]
    q, k, v = inputs(2, 4, 4, 33, 33, 16, seed=3)
    out = check(q, k, v, score_mod, mask_mod)
    if name == "empty_rows":
        assert torch.all(out[:, :, :4] == 0)


def test_new_captured_values_do_not_recompile():
    q, k, v = inputs(1, 4, 4, 20, 20, 16, seed=4)
    bias = torch.randn(4)
    sm = lambda s, b, h, qi, ki: s + bias[h]   # noqa: E731
    check(q, k, v, sm, causal)
    modules = len(compiled._MEMORY)
    bias.copy_(torch.randn(4) * 3)
    check(q, k, v, sm, causal)
    check(q, k, v, lambda s, b, h, qi, ki: s + 2 * torch.ones(4)[h] + bias[h] * 0, causal)   # new callable, new plan
    assert len(compiled._MEMORY) == modules + 1


def test_odd_lengths_scale_and_value_dim():
    q, k, v = inputs(1, 2, 2, 19, 45, 16, seed=5, dv=32)
    check(q, k, v, None, lambda b, h, qi, ki: ki <= qi + 26, scale=0.3)


def test_short_multi_query_decode():
    q, k, v = inputs(2, 8, 2, 4, 61, 32, seed=6)
    check(q, k, v, None, lambda b, h, qi, ki: ki <= qi + 57, gqa=True)


def test_inside_torch_compile_without_graph_breaks():
    """The callables are made outside the compiled region (as a model's __init__ would); fullgraph=True fails
    on any graph break."""
    q, k, v = inputs(1, 4, 4, 24, 24, 16, seed=7)
    bias = torch.randn(4)
    score_mod = lambda s, b, h, qi, ki: s + bias[h]   # noqa: E731

    def model(q, k, v):
        return flex_attention(q * 1.0, k, v, score_mod=score_mod, mask_mod=causal) + 1

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v), model(q, k, v))
    for L, S in ((17, 30), (1, 30)):   # new lengths: recompiled with dynamic lengths; decode picked at run time
        q2, k2, v2 = inputs(1, 4, 4, L, S, 16, seed=L)
        assert torch.equal(compiled(q2, k2, v2), model(q2, k2, v2))


def test_untraceable_callables_name_callable_line_and_construct():
    q, k, v = inputs(1, 2, 2, 8, 8, 16)

    def branchy(s, b, h, qi, ki):
        if qi > ki:
            return s
        return s * 2

    with pytest.raises(TraceError, match=r"branchy \(test_flex_api.py:\d+: if qi > ki:\).*Python control flow"):
        flex_attention(q, k, v, score_mod=branchy)

    def trig(b, h, qi, ki):
        return torch.atan(qi) > 0

    with pytest.raises(TraceError, match=r"trig \(test_flex_api.py:\d+: return torch.atan\(qi\) > 0\): aten.atan has no "
                                         r"translation"):
        flex_attention(q, k, v, mask_mod=trig)


def test_gqa_needs_enable_gqa():
    q, k, v = inputs(1, 4, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flex_attention(q, k, v)


def test_compiled_kernels_are_reused_from_the_disk_cache(monkeypatch):
    from neptune_eqsat import compiler
    from neptune_eqsat import flex
    q, k, v = inputs(1, 2, 2, 12, 12, 16, seed=8)
    mask = lambda b, h, qi, ki: qi + 3 >= ki   # noqa: E731
    first = check(q, k, v, None, mask)
    compiled._MEMORY.clear()
    flex._VARIANTS.clear()
    flex._BY_SHAPE.clear()

    def no_compile(*a, **kw):
        raise AssertionError("the e-graph ran again")
    monkeypatch.setattr(compiler, "optimize", no_compile)
    assert torch.equal(check(q, k, v, None, mask), first)


@pytest.mark.slow   # two fresh interpreters; the disk cache within one process: the test above
def test_processes_sharing_the_cache(tmp_path):
    """Two processes compile the same kernel into one fresh cache at once; both get the right result."""
    import subprocess
    import sys
    script = tmp_path / "run.py"
    script.write_text(
        "import os, sys, torch\n"
        "from neptune_eqsat import flex_attention\n"
        "g = torch.Generator().manual_seed(0)\n"
        "q, k, v = (torch.randn(1, 2, 9, 16, generator=g).half() for _ in range(3))\n"
        "out = flex_attention(q, k, v, mask_mod=lambda b, h, qi, ki: qi >= ki)\n"
        "torch.save(out, sys.argv[1])\n")
    env = {**os.environ, "NEPTUNE_EQSAT_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"out{n}.pt")], env=env) for n in range(2)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    outs = [torch.load(tmp_path / f"out{n}.pt") for n in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert len(list((tmp_path / "cache").glob("flex_*.py"))) == 1


def test_each_traced_problem_has_its_own_spec_name():
    """The tuning database keys measurements by spec name: two problems must not share one."""
    from neptune_eqsat.flex import Problem, trace
    problem = Problem("f16", 4, 4, 16, 16, 0.25)
    plain, _ = trace(None, None, problem)
    doubled, _ = trace(lambda s, b, h, i, j: s * 2, None, problem)
    again, _ = trace(None, None, problem)
    wider, _ = trace(None, None, Problem("f16", 4, 2, 16, 16, 0.25))
    assert plain.name == again.name
    assert len({plain.name, doubled.name, wider.name}) == 3 and plain.name.startswith("flex_")


# ---- what a callable reads at call time, and reads of captured tensors that must stay inside them --------------
SCALE_FACTOR = 2.0


def test_python_numbers_are_read_at_call_time():
    """A number in a closure or a global is re-read at every call, as FlexAttention does."""
    global SCALE_FACTOR
    q, k, v = inputs(1, 2, 2, 11, 11, 16, seed=21)
    factor = 2.0

    def in_closure(s, b, h, qi, ki):
        return s * factor

    def in_global(s, b, h, qi, ki):
        return s * SCALE_FACTOR

    for score_mod in (in_closure, in_global):
        factor = SCALE_FACTOR = 2.0
        first = check(q, k, v, score_mod)
        factor = SCALE_FACTOR = 0.25
        second = check(q, k, v, score_mod)   # compared with the reference at 0.25
        assert not torch.equal(first, second)


def test_a_rebound_captured_tensor_is_read():
    q, k, v = inputs(1, 2, 2, 10, 10, 16, seed=22)
    bias = torch.zeros(10)

    def biased(s, b, h, qi, ki):
        return s + bias[ki]

    check(q, k, v, biased)
    bias = torch.linspace(-2, 2, 10)
    check(q, k, v, biased)


@pytest.mark.parametrize("bad_index, message", [
    (lambda short, qi, ki: short[ki], r"shape \(10,\) that .*short_read.* index kv_idx .* values 0 to 39"),
    (lambda short, qi, ki: short[qi - ki + 5], r"index \(\(q_idx - kv_idx\) \+ 5\) .* values -34 to 44"),
])
def test_reads_past_a_captured_tensor_raise_index_error(bad_index, message):
    q, k, v = inputs(1, 2, 2, 40, 40, 16, seed=23)
    short = torch.randn(10)

    def short_read(s, b, h, qi, ki):
        return s + bad_index(short, qi, ki)

    with pytest.raises(IndexError, match=message):
        flex_attention(q, k, v, score_mod=short_read)


def test_indexes_read_from_captured_tensors_are_checked_at_every_call():
    """offsets[doc[q_idx]]: the inner read's values decide the outer index, so new values are checked again."""
    q, k, v = inputs(1, 2, 2, 20, 20, 16, seed=24)
    doc = torch.tensor([0] * 7 + [1] * 13)
    offsets = torch.tensor([0, 7])

    def same_document_from_its_start(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (ki >= offsets[doc[qi]]) & (qi >= ki)

    check(q, k, v, None, same_document_from_its_start)
    doc[15:] = 2   # a document id past the end of offsets
    with pytest.raises(IndexError, match=r"shape \(2,\) .* values 0 to 2 "):
        flex_attention(q, k, v, mask_mod=same_document_from_its_start)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bf16_and_fp32_through_the_api(dtype):
    """Rows that keep no key give 0 in every dtype; the output keeps the inputs' dtype."""
    q, k, v = (x.to(dtype) for x in inputs(1, 4, 2, 19, 23, 16, seed=25))

    def every_third_row_empty(b, h, qi, ki):
        return (qi % 3 != 0) & (ki <= qi)

    def reverse_causal(s, b, h, qi, ki):
        return torch.where(ki > qi, float("-inf"), s)

    for score_mod, mask_mod in ((None, every_third_row_empty), (reverse_causal, None)):
        out = flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=True)
        ref = reference(q, k, v, score_mod, mask_mod)
        assert out.dtype == dtype and not torch.isnan(out).any()
        assert (out.double() - ref).abs().max().item() <= (5e-2 if dtype == torch.bfloat16 else 2e-4)
        if mask_mod is not None:
            assert torch.all(out[:, :, ::3] == 0)


def test_the_cache_fills_without_importing_the_modules(tmp_path, monkeypatch):
    """A machine without a GPU fills the kernel cache for one with: sources are written, not imported."""
    from neptune_eqsat import flex
    monkeypatch.setenv("NEPTUNE_EQSAT_CACHE", str(tmp_path))
    problem = flex.Problem("f16", 4, 2, 16, 16, 0.25)
    spec, _ = flex.trace(None, causal, problem)
    key = flex.plan_key(spec, problem)
    before = set(sys.modules)
    path = compiled.cached_source(key, spec)
    assert path.parent == tmp_path and "def forward(" in path.read_text()
    assert not any(m.startswith("neptune_flex_") for m in set(sys.modules) - before)


def test_a_filled_kernel_cache_runs_without_the_compiler(tmp_path):
    """A machine whose module cache another filled (the GPU side) runs flex_attention with torch and triton alone:
    with egglog made unimportable, a call whose modules are cached still runs, forward and backward (deriving
    the backward reads the rule modules, not the e-graph), and gives the same output and gradients."""
    import os
    import subprocess
    import sys
    code = r'''
import sys, torch
block = "egglog" in sys.argv
if block:
    sys.modules["egglog"] = None   # import egglog fails
from neptune_eqsat import flex_attention
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 5, 16, generator=g).half().requires_grad_() for _ in range(3))
out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 0.5, mask_mod=lambda b, h, qi, ki: ki <= qi)
out.backward(torch.randn(out.shape, generator=g).half())
torch.save((out.detach(), q.grad, k.grad, v.grad), sys.argv[1])
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "NEPTUNE_EQSAT_CACHE": str(tmp_path / "cache")}
    for args in ([str(tmp_path / "filled.pt")], [str(tmp_path / "cached.pt"), "egglog"]):
        done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    for filled, cached in zip(torch.load(tmp_path / "filled.pt"), torch.load(tmp_path / "cached.pt")):
        assert torch.equal(filled, cached)


def test_a_mask_reading_a_captured_tensor_at_a_constant_index_on_the_test_device():
    """`kv_idx <= q_idx + offset[0]`: its block lists gather the captured tensor at a constant index (on a GPU
    inside a CUDA graph capture, where the same build failed in a process running NCCL before its gathers used
    torch.take); the output matches float64."""
    from conftest import DEVICE
    offset = torch.tensor([3, 9])
    q, k, v = inputs(1, 2, 2, 37, 45, 16, seed=4)

    def shifted(b, h, qi, ki):
        return ki <= qi + offset[0]
    out = flex_attention(*(x.to(DEVICE) for x in (q, k, v)), mask_mod=shifted)
    ref = reference(q, k, v, mask_mod=shifted)
    assert (out.cpu().double() - ref).abs().max().item() <= 2e-2


def test_return_aux_autocast_and_devices_as_torch():
    """torch 2.13's return_aux=AuxRequest(lse=True) gives (out, AuxOutput) with the logsumexp; under autocast
    the inputs take its dtype (torch's flex_attention does); a device neither CPU nor CUDA is refused by name."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention as torch_flex
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g) for _ in range(3))
    out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))
    want_out, want = torch_flex(q.double(), k.double(), v.double(), return_aux=AuxRequest(lse=True))
    assert (aux.lse.double() - want.lse).abs().max().item() < 1e-5
    assert (out.double() - want_out).abs().max().item() < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flex_attention(q, k, v).dtype == torch.bfloat16
        assert flex_attention(q.bfloat16(), k, v).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="CPU and CUDA"):
        flex_attention(q.to("meta"), k.to("meta"), v.to("meta"))


def test_the_output_follows_a_query_held_as_batch_sequence_heads():
    """q, k, v from a projection viewed [B, S, H, D] and transposed: the output comes back in that layout, as
    torch's does, so out.transpose(1, 2).view(B, S, H * D) works."""
    B, S, H, D = 1, 24, 2, 16
    q, k, v = (torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(s)).transpose(1, 2) for s in (1, 2, 3))
    out = flex_attention(q, k, v)
    assert out.stride() == (S * H * D, D, H * D, 1)
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
    want = torch_flex(q.double(), k.double(), v.double())
    got = out.transpose(1, 2).view(B, S, H * D).double()
    assert (got - want.transpose(1, 2).reshape(B, S, H * D)).abs().max() < 1e-5


def test_calls_from_several_threads_on_the_cpu():
    """Triton's interpreter keeps the running kernel in globals: interpreted launches take one lock per process
    (before, two threads crashed the process or raised from inside the interpreter)."""
    import threading
    inputs = [[torch.randn(1, 2, L, 16, generator=torch.Generator().manual_seed(L)) for _ in range(3)]
              for L in (24, 40)]
    want = [flex_attention(*x) for x in inputs]
    errors = []

    def work(t):
        for _ in range(3):
            try:
                assert torch.equal(flex_attention(*inputs[t]), want[t])
            except Exception as e:   # noqa: BLE001 (collected for the assertion below)
                errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for x in threads:
        x.start()
    for x in threads:
        x.join()
    assert not errors


def test_one_key_value_batch_for_every_query_batch():
    """q of batch 2 with k and v of batch 1 (a shared prefix cache): broadcast over the batch as torch does,
    gradients summed over it."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention as torch_flex
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 2, 20, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 20, 16, generator=g, dtype=torch.float64) for _ in range(2))
    ours = [x.float().requires_grad_() for x in (q, k, v)]
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    causal = lambda b, h, qi, ki: qi >= ki   # noqa: E731
    out = flex_attention(*ours, mask_mod=causal)
    with torch.no_grad():
        torch_out = torch_flex(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                               block_mask=create_block_mask(causal, 2, 2, 20, 20, device="cpu"))
    keep = torch.ones(20, 20, dtype=torch.bool).tril()
    s = (ref[0] @ ref[1].transpose(-1, -2) / 4.0).masked_fill(~keep, float("-inf"))
    want = torch.softmax(s, -1) @ ref[2]   # (batch 1 of k, v broadcast by the product)
    assert (out.double() - torch_out).abs().max().item() < 1e-5
    assert (out.double() - want).abs().max().item() < 1e-5
    (out.double() * want.detach()).sum().backward()
    (want * want.detach()).sum().backward()
    for a, b in zip(ours, ref):
        assert (a.grad.double() - b.grad).abs().max().item() < 1e-4
