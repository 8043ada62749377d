"""Block lists rebuilt at a call (a mask reading tensors whose values changed) and the kernel reading them launch
as programmatic dependents on Hopper GPUs: the reading kernel starts while the classifying kernel runs and
waits for its lists before its first read. Checked: which kernels take part (the generated code), and on a GPU
that calls whose ids change before every call, their replays and a CUDA graph holding both launches match
torch's flex_attention in float64."""
import warnings
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import neptune_eqsat
from neptune_eqsat import flex
from neptune_eqsat.runtime.tables import _dependent_launch

from conftest import DEVICE

H = 2


def document_causal(doc, offset=0):
    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx + offset] == doc[kv_idx]) & (q_idx + offset >= kv_idx)
    return mask_mod


def source(mask_mod, L, S):
    q = torch.randn(1, H, L, 16)
    k = v = torch.randn(1, H, S, 16)
    compiled = flex._module_for(flex._plan(None, mask_mod, None, False), q, k, v)
    return Path(compiled.module.__file__).read_text()


@pytest.mark.parametrize("L", [1, 64], ids=["decode", "prefill"])
def test_kernels_reading_lists_rebuilt_at_a_call_wait_for_them(L):
    doc = torch.arange(64) // 10
    text = source(document_causal(doc, 64 - L), L, 64)
    # the classifying kernels (one program per grid value, or one per row block) and the attention kernel
    # (prefill) or split kernel (decode)
    assert text.count("DEPENDENT: tl.constexpr") == 3
    assert text.count("gdc_wait()") == 3 and text.count("gdc_launch_dependents()") == 2
    assert "['launch_pdl'] = _dependent_launch(device)" in text


def test_lists_of_positions_built_once_take_no_dependent_launch():
    text = source(lambda b, h, i, j: (j < 16) | (i >= j), 64, 64)
    assert "_blocks0" in text and "DEPENDENT: tl.constexpr" not in text and "gdc_wait()" not in text


def test_no_dependent_launch_off_the_gpu():
    assert _dependent_launch(torch.device("cpu")) is False


def reference(q, k, v, mask_mod):
    L, S = q.shape[2], k.shape[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mask = create_block_mask(mask_mod, 1, H, L, S, device="cpu")
        return torch_flex(q.double(), k.double(), v.double(), block_mask=mask)


def documents(S, seed):
    g = torch.Generator().manual_seed(seed)
    cuts = torch.zeros(S, dtype=torch.int64)
    cuts[torch.randperm(S - 1, generator=g)[:5] + 1] = 1
    return torch.cumsum(cuts, 0).to(torch.int32)


@pytest.mark.skipif(DEVICE != "cuda", reason="dependent launches run on a GPU")
@pytest.mark.parametrize("L", [1, 4, 700], ids=["decode1", "decode4", "prefill"])
def test_ids_written_before_every_call_and_in_a_cuda_graph_match_float64(L):
    S = 700
    doc = documents(S, 0).cuda()
    mask_mod = document_causal(doc, S - L)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, L, 64, generator=g)
    k, v = (torch.randn(1, H, S, 64, generator=g) for _ in range(2))
    qc, kc, vc = (x.cuda().half() for x in (q, k, v))
    q, k, v = (x.half().float() for x in (q, k, v))

    def want(ids):
        return reference(q, k, v, document_causal(ids, S - L))

    for seed in range(1, 6):   # new ids written in place before every call: rebuilt lists, replayed launches
        doc.copy_(documents(S, seed))
        got = flex.flex_attention(qc, kc, vc, mask_mod=mask_mod).cpu().double()
        assert (got - want(doc.cpu())).abs().max().item() < 5e-3, seed
    neptune_eqsat.wait_for_compiles()
    doc.copy_(documents(S, 10))
    flex.flex_attention(qc, kc, vc, mask_mod=mask_mod)
    doc.copy_(documents(S, 11))   # written since the last call: the capture holds the classifying kernel too
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flex.flex_attention(qc, kc, vc, mask_mod=mask_mod)
    doc.copy_(documents(S, 12))
    graph.replay()
    torch.cuda.synchronize()
    assert (captured.cpu().double() - want(doc.cpu())).abs().max().item() < 5e-3
