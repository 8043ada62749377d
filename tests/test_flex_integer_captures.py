"""Captured integer and bool tensors are read as stored: ids of any integer dtype compare exactly (ids past 2^24,
which float32 would merge, and past 2^53, which float64 would), in the kernels and in the block classification
that skips blocks, for prefill and decode; checked against torch's flex_attention in float64."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from neptune_eqsat import flex_attention
from neptune_eqsat.frontend.spec import Spec, SpecError

from conftest import DEVICE

H = 2


def reference(q, k, v, mask_mod, score_mod=None):
    L, S = q.shape[2], k.shape[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mask = create_block_mask(mask_mod, 1, H, L, S, device="cpu") if mask_mod is not None else None
        return torch_flex(q.double(), k.double(), v.double(), score_mod=score_mod, block_mask=mask)


def check(mask_mod, L, S, score_mod=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, L, 16, generator=g)
    k, v = (torch.randn(1, H, S, 16, generator=g) for _ in range(2))
    want = reference(q, k, v, mask_mod, score_mod)
    got = flex_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), score_mod=score_mod, mask_mod=mask_mod).cpu()
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_document_ids_of_every_integer_dtype(dtype):
    doc = torch.tensor([0] * 40 + [1] * 37 + [2] * 23, dtype=dtype)

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
    check(mask_mod, 100, 100)


@pytest.mark.parametrize("base", [2 ** 30, 2 ** 60], ids=["past_float32", "past_float64"])
@pytest.mark.parametrize("L", [1, 90])
def test_large_ids_stay_distinct(base, L):
    """Consecutive document counters of a long run: float32 (and past 2^53 float64) would make neighbouring
    documents one, attending across them; every block holding two such documents must stay partial."""
    S = 90
    doc = base + torch.arange(S, dtype=torch.int64) // 7

    def mask_mod(b, h, q_idx, kv_idx):
        at = q_idx + S - L
        return (doc[at] == doc[kv_idx]) & (at >= kv_idx)
    check(mask_mod, L, S)


def test_bool_flags_and_integer_offsets_indexed_by_ids():
    """A bool capture combined with | and an int32 table indexed by an int64 capture's value."""
    is_global = torch.zeros(70, dtype=torch.bool)
    is_global[[0, 13, 50]] = True
    doc = torch.tensor([0] * 20 + [1] * 30 + [2] * 20, dtype=torch.int64)
    starts = torch.tensor([0, 20, 50], dtype=torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        return is_global[kv_idx] | ((kv_idx >= starts[doc[q_idx]]) & (kv_idx <= q_idx))
    check(mask_mod, 70, 70)


def test_an_integer_table_in_a_score_mod():
    bucket = (torch.arange(-64, 65) // 8).to(torch.int16)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bucket[(q_idx - kv_idx).clamp(-64, 64) + 64] * 0.125
    check(None, 50, 50, score_mod=score_mod)


def test_outputs_and_casts_are_floating_point():
    from neptune_eqsat import spec as S
    spec = Spec("ints")
    i = spec.axes(i=8)
    x = spec.input("x", "i32", 8)
    with pytest.raises(SpecError, match="floating-point"):
        spec.output("out", "i32", x[i] * 2, i)
    with pytest.raises(SpecError, match="floating-point"):
        S.cast(x[i], "i64")
