"""FlexAttention code a user writes that the corpus did not cover, against torch's own flex_attention run eagerly
in float64: masks reading a tensor by batch and head (block classes decoded per (b, h)), Python numbers held by
modules, callable objects and numpy, a table of one head, constant indices from the end, and callables whose
result ignores the keys or is a constant."""
import math
import types
import warnings

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from neptune_eqsat import flex_attention

from conftest import DEVICE

D = 16


def inputs(B, H, L, S, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g).to(dtype) for n in (L, S, S))


def error(q, k, v, score_mod=None, mask_mod=None, lse=False):
    """Max error of ours against torch's flex_attention in float64 (output, and the logsumexp with lse)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(), score_mod=score_mod,
                          block_mask=None if mask_mod is None else _block_mask(mask_mod, q, k), return_lse=lse)
    got = flex_attention(*(x.to(DEVICE) for x in (q, k, v)), score_mod=score_mod, mask_mod=mask_mod, return_lse=lse)
    if not lse:
        return (got.cpu().double() - want).abs().max().item()
    (out, got_lse), (want_out, want_lse) = got, want
    finite = want_lse.isfinite()
    assert torch.equal(got_lse.cpu().isinf(), want_lse.isinf())
    return max((out.cpu().double() - want_out).abs().max().item(),
               (got_lse.cpu().double() - want_lse)[finite].abs().max().item())


def _block_mask(mask_mod, q, k):
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device="cpu")


LENS = torch.tensor([[9, 30], [17, 4]])   # keys kept per (batch, head)


@pytest.mark.parametrize("L", [30, 3])
@pytest.mark.parametrize("case", ["lens[b, h]", "lens[b] and h", "score -inf past lens[b, 0] + h"])
def test_a_mask_reading_a_tensor_by_batch_and_head(case, L):
    """Each (b, h) classifies its own blocks (before, the classifying kernel decoded every grid entry as
    batch 0: wrong outputs for b >= 1)."""
    score_mod, mask_mod = {
        "lens[b, h]": (None, lambda b, h, q, kv: kv < LENS[b, h]),
        "lens[b] and h": (None, lambda b, h, q, kv: (kv < LENS[b, 1]) & (h >= 0)),
        "score -inf past lens[b, 0] + h": (
            lambda s, b, h, q, kv: torch.where(kv >= LENS[b, 0] + h * 5, -math.inf, s), None),
    }[case]
    q, k, v = inputs(2, 2, L, 30)
    assert error(q, k, v, score_mod, mask_mod, lse=True) < 5e-3


def test_python_numbers_held_by_a_module_an_object_or_numpy_are_read_at_every_call():
    """A changed number traces again (before, these three kept the first call's kernel: a stale result)."""
    q, k, v = inputs(1, 2, 21, 21)
    cfg = types.ModuleType("cfg")
    cfg.WINDOW = 1

    def window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= cfg.WINDOW

    class Distance:
        def __init__(self, w):
            self.w = w

        def __call__(self, s, b, h, q_idx, kv_idx):
            return s - self.w * (q_idx - kv_idx).abs()

    band = {"width": np.int64(2)}

    def banded(b, h, q_idx, kv_idx, width=band):
        return (q_idx - kv_idx).abs() <= width["width"]

    distance = Distance(0.1)
    for _ in range(2):
        assert error(q, k, v, mask_mod=window) < 5e-3
        assert error(q, k, v, score_mod=distance) < 5e-3
        assert error(q, k, v, mask_mod=banded) < 5e-3
        cfg.WINDOW, distance.w, band["width"] = 7, 1.5, np.int64(9)


def test_a_per_head_table_of_one_head_and_one_out_of_range():
    """bias[h] with one head reads its one entry (before: refused, the callables were first traced with two
    heads); with more heads than the table has, IndexError names the tensor before any kernel runs."""
    bias = torch.tensor([0.5])
    q, k, v = inputs(1, 1, 12, 12)
    assert error(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s + bias[h] * (kv_idx - q_idx)) < 5e-3
    small = torch.randn(5)
    q8 = inputs(1, 8, 12, 12)[0]
    with pytest.raises(IndexError, match=r"the tensor of shape \(5,\) that .*<lambda> captures is read out of range: "
                                         r"dimension 0: index \(h \+ 0\) reaches 7, beyond extent 5"):
        flex_attention(q8, q8, q8, score_mod=lambda s, b, h, q_idx, kv_idx: s + small[h])


def test_a_constant_index_below_zero_counts_from_the_end():
    t = torch.tensor([0.3, -0.2, 0.1, 0.25])
    q, k, v = inputs(1, 2, 13, 13)
    assert error(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s + t[-1] * (q_idx - kv_idx) + t[-3]) < 5e-3


@pytest.mark.parametrize("score_mod, mask_mod", [
    (lambda s, b, h, q_idx, kv_idx: (q_idx * 0).float(), None),
    (lambda s, b, h, q_idx, kv_idx: torch.tensor([0.5, -1.0])[h] + q_idx * 0.1, None),
    (None, lambda b, h, q_idx, kv_idx: torch.ones((), dtype=torch.bool)),
], ids=["zero score", "score of head and query only", "mask of constant true"])
def test_callables_that_ignore_the_keys_or_return_a_constant(score_mod, mask_mod):
    """Uniform attention over the keys (before: refused as a reduction over a value that does not depend on
    the keys, or as a boolean constant)."""
    q, k, v = inputs(1, 2, 11, 19)
    assert error(q, k, v, score_mod, mask_mod) < 5e-3


FLAGS = torch.tensor([1.0, 0.0])   # a per-head flag kept as floats


@pytest.mark.parametrize("score_mod, mask_mod", [
    (None, lambda b, h, q_idx, kv_idx: (FLAGS[h] > 0.5) | (q_idx >= kv_idx)),
    (lambda s, b, h, q_idx, kv_idx: torch.where((FLAGS[h] > 0.5) & (kv_idx < 3), s - 1.0, s), None),
    (None, lambda b, h, q_idx, kv_idx: torch.tensor(True) & (q_idx >= kv_idx)),
    (None, lambda b, h, q_idx, kv_idx: torch.tensor(False) | (q_idx >= kv_idx)),
    (None, lambda b, h, q_idx, kv_idx: torch.full_like(q_idx, True, dtype=torch.bool) & (q_idx >= kv_idx)),
], ids=["flag or causal", "flag and first keys", "tensor(True) and", "tensor(False) or", "full_like(True) and"])
def test_truth_values_of_flags_and_constants(score_mod, mask_mod):
    """A flag read per head combined with a tile of tests (the interpreter could not | a scalar truth value with
    a tile), and constant truth values made inside the callable (refused as booleans, or run as ATen on a
    Python bool)."""
    q, k, v = inputs(1, 2, 13, 13)
    assert error(q, k, v, score_mod, mask_mod) < 5e-3


def test_a_block_mask_from_block_tables_alone_says_its_blocks_are_not_read():
    from torch.nn.attention.flex_attention import BlockMask
    from neptune_eqsat import flex
    kv_num = torch.tensor([[[1, 1]]], dtype=torch.int32)
    kv_idx = torch.tensor([[[[0, 1], [1, 0]]]], dtype=torch.int32)
    block_mask = BlockMask.from_kv_blocks(kv_num, kv_idx, BLOCK_SIZE=16, seq_lengths=(32, 32))
    q, k, v = inputs(1, 1, 32, 32)
    flex._WARNED.discard("block_tables")
    with pytest.warns(UserWarning, match="no mask_mod"):
        flex_attention(*(x.to(DEVICE) for x in (q, k, v)), block_mask=block_mask)
