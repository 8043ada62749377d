"""FlexAttention code as it is written in the wild, with only the import swapped, against torch's own
flex_attention run eagerly in float64 on CPU: combinators, method forms, helpers defined outside the callable,
bit tricks, captured tensors indexed by captured tensors, block masks, the row logsumexp, cross-attention."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import and_masks, create_block_mask, or_masks
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from neptune_eqsat import flex_attention
from neptune_eqsat.compiled import triton_interpret
from neptune_eqsat.flex import TraceError

from conftest import DEVICE

H, HKV = 4, 2
DOC = torch.tensor([0] * 9 + [1] * 14 + [2] * 20)
OFFSETS = torch.tensor([0, 9, 23], dtype=torch.int32)
BIAS = torch.randn(H, 2 * 8 + 1, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
WIDTH = 6   # a 2-d image of WIDTH columns, rows of positions


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs().le(5)


def sinks(b, h, q_idx, kv_idx):
    return kv_idx < 2


def neighborhood(b, h, q_idx, kv_idx):
    """NATTEN style: the 3x3 window around the query, shifted inward at the image's edges."""
    qx, qy, kx, ky = q_idx // WIDTH, q_idx % WIDTH, kv_idx // WIDTH, kv_idx % WIDTH
    cx, cy = qx.clamp(1, WIDTH - 2), qy.clamp(1, WIDTH - 2)
    return ((cx - kx).abs() <= 1) & ((cy - ky).abs() <= 1)


def z_order(b, h, q_idx, kv_idx):
    return ((q_idx >> 2) & 3) == ((kv_idx >> 2) & 3)


def document_from_offsets(b, h, q_idx, kv_idx):
    return (kv_idx >= OFFSETS[DOC[q_idx]]) & (kv_idx <= q_idx)


def alibi_from_head(score, b, h, q_idx, kv_idx):
    slope = torch.exp2(-(h + 1) * 8.0 / H)
    return score + slope * (kv_idx - q_idx)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + BIAS[h, (q_idx - kv_idx).clamp(-8, 8) + 8]


def relative_buckets(score, b, h, q_idx, kv_idx):
    """Distances in buckets of 4, clamped (T5 style): the same table entry over most blocks (codegen/uniform.py)."""
    return score + BIAS[h, torch.div(kv_idx - q_idx, 4, rounding_mode="floor").clamp(-3, 2) * 2 + 8] * (h + 1)


def window_bound_by_default(b, h, q_idx, kv_idx, width=5, sinks=OFFSETS):
    """Values bound as default arguments (the idiom that freezes a loop variable): not inputs of the mask."""
    return ((q_idx - kv_idx).abs() <= width) | (kv_idx == sinks[1])


def soft_cap_methods(score, b, h, q_idx, kv_idx):
    return score.div(20.0).tanh().mul(20.0)


CASES = {
    "and_masks": (None, and_masks(causal, sliding)),
    "or_masks": (None, or_masks(and_masks(causal, sliding), sinks)),
    "neighborhood": (None, neighborhood),
    "z_order": (None, z_order),
    "offsets[doc]": (None, document_from_offsets),
    "alibi_exp2": (alibi_from_head, causal),
    "relative_bias": (relative_bias, None),
    "relative_buckets_causal": (relative_buckets, causal),
    "methods": (soft_cap_methods, None),
    "defaults_and_varargs": (lambda score, *index: score + (index[2] - index[3]) * 0.125, window_bound_by_default),
    "where_first": (lambda s, b, h, q, kv: torch.where(kv > q, float("-inf"), s), None),
    "erf_and_rounding": (lambda s, b, h, q, kv: torch.special.erf(s) + torch.floor(s * 2) / 4 + torch.round(s * 1.5)
                         - s.ceil() / 3 + torch.trunc(s * 2.5) / 5, None),
    # negative operands: torch floors // and % (-7 // 3 = -3, -7 % 3 = 2) where C truncates (-2, -1)
    "negative_remainders": (lambda s, b, h, q, kv: s + ((q - kv) % 5) * 0.25 + ((kv - q) // 3) * 0.125
                            + ((q - kv) * 1.5) % 2.0 - ((kv - q) * 0.75) // 1.0,
                            lambda b, h, q, kv: ((q - kv) % 3) != 1),
    # tensor methods and torch.nn.functional forms that are compositions of the registry's ops
    "masked_fill": (lambda s, b, h, q, kv: s.masked_fill((q - kv).abs() > 4, -2.0).masked_fill(kv > q, -math.inf),
                    None),
    "activations": (lambda s, b, h, q, kv: F.softplus(s, beta=2.0, threshold=1.0) + F.silu(s) + F.gelu(s)
                    + F.gelu(s, approximate="tanh") - torch.log1p((q - kv).abs().float()) + torch.expm1(s * 0.1),
                    None),
    "bit_ops": (lambda s, b, h, q, kv: s + ((q >> (kv % 3)) ^ (kv << 1)) % 5, lambda b, h, q, kv: ((q ^ kv) & 4) == 0
                | (~kv & 1).bool()),
    # powers of negative bases (float and large integer exponents, reciprocals), a number to a traced power
    # (ALiBi slopes), a traced base to a traced integral power (a negative base signed by the parity)
    "powers": (lambda s, b, h, q, kv: s - 0.01 * (q - kv).float() ** 2.0 + (s * 0.5) ** 9 * 0.01
               + 0.1 / (s ** -1 + 10.0) + 2 ** (-8.0 * (h + 1) / 2) * (kv - q)
               + torch.pow((q - kv) * 0.25, (h + 1).float()) * 0.01, None),
    # float to integer conversions truncate toward zero (T5's relative-position buckets), C's remainder, relu
    "truncations": (lambda s, b, h, q, kv: s + (torch.log((q - kv).abs().float() + 1.0) * 2.3).long() * 0.25
                    - torch.div(q - kv, 3, rounding_mode="trunc") * 0.125 + torch.fmod((q - kv) * 1.5, 2.0)
                    + torch.relu(s - 0.5), None),
    # activations torch composes from others, and operators of two or three values
    "more_activations": (lambda s, b, h, q, kv: F.hardtanh(s, -0.5, 0.5) + F.relu6(s * 4.0) * 0.1 + F.elu(s)
                         + F.leaky_relu(s, 0.2) + F.hardsigmoid(s) + F.hardswish(s) * 0.5 + F.mish(s) * 0.5
                         + F.logsigmoid(s) + torch.special.erfc(s) * 0.3 + torch.sinh(s * 0.3) - torch.cosh(s * 0.2)
                         + torch.addcmul(s, s, (q - kv).float(), value=0.01) + torch.lerp(s, torch.tanh(s), 0.7)
                         + torch.logaddexp(s, (q - kv).abs() * -0.1) * 0.5
                         + torch.xlogy(s, (q - kv).abs().float() + 1.0) * 0.1, None),
    # periodic functions of positions and heads (a phase-shaped bias), in the mask too
    "phases": (lambda s, b, h, q, kv: s + 0.5 * torch.sin((q - kv) * 0.3) * torch.cos(h * 0.7) - torch.cos(s),
               lambda b, h, q, kv: torch.sin(q * 0.5) + torch.cos(kv * 0.25) > -1.2),
    # tests of NaN, the infinities and the sign bit, and what replaces them
    "float_classes": (lambda s, b, h, q, kv: torch.nan_to_num(torch.where(s > 1.0, math.inf, torch.where(
                      s < -1.5, -math.inf, s)), posinf=2.0, neginf=-2.0) + torch.where(torch.isnan(torch.log(s)), 0.5, 0.0)
                      + torch.where(torch.isinf(torch.where(kv > q, math.inf, s)), -1.0, 0.0)
                      + torch.copysign(torch.ones_like(s) * 0.25, s) + torch.heaviside(s, torch.tensor(0.5)) * 0.2
                      + torch.where(torch.signbit(s), 0.1, 0.0), lambda b, h, q, kv: ~torch.isnan(q.float()) & (q >= kv)),
}


def run_both(case, L, S, dtype=torch.float16, block_mask=False, lse=False):
    g = torch.Generator().manual_seed(L * 100 + S)
    q = torch.randn(1, H, L, 16, generator=g).to(dtype)
    k = torch.randn(1, HKV, S, 16, generator=g).to(dtype)
    v = torch.randn(1, HKV, S, 16, generator=g).to(dtype)
    score_mod, mask_mod = CASES[case]
    mask = create_block_mask(mask_mod, 1, H, L, S, device="cpu") if mask_mod is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(), score_mod=score_mod, block_mask=mask, enable_gqa=True,
                          return_lse=lse)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    if block_mask:
        got = flex_attention(q, k, v, score_mod, mask, enable_gqa=True, return_lse=lse)
    else:
        got = flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=True, return_lse=lse)
    return (tuple(x.cpu() for x in got) if lse else got.cpu()), want


@pytest.mark.parametrize("case", sorted(CASES))
def test_corpus_matches_torch_flex_attention(case):
    got, want = run_both(case, 43, 43)
    assert got.dtype == torch.float16 and not torch.isnan(got).any()
    assert (got.double() - want).abs().max().item() <= 2e-2


@pytest.mark.parametrize("L, S", [(3, 43), (43, 29)])
def test_block_mask_cross_lengths_and_logsumexp(L, S):
    """A BlockMask from create_block_mask, query and key lengths that differ, and the row logsumexp."""
    (out, lse), (want, want_lse) = run_both("offsets[doc]" if L < S else "or_masks", L, S, torch.float32,
                                            block_mask=True, lse=True)
    assert (out.double() - want).abs().max().item() <= 2e-4
    assert lse.dtype == torch.float32 and lse.shape == want_lse.shape
    assert torch.equal(lse.isinf(), want_lse.isinf())
    finite = want_lse.isfinite()
    assert (lse.double() - want_lse)[finite].abs().max().item() <= 2e-4


def test_block_mask_for_other_lengths_is_refused():
    q = k = v = torch.randn(1, 2, 20, 16)
    mask = create_block_mask(causal, 1, 2, 16, 16, device="cpu")
    with pytest.raises(ValueError, match=r"created for query and key lengths \(16, 16\)"):
        flex_attention(q, k, v, block_mask=mask)


def test_kernel_options_are_accepted_with_one_warning():
    q = k = v = torch.randn(1, 2, 20, 16).half().to(DEVICE)
    with pytest.warns(UserWarning, match="kernel_options"):
        flex_attention(q, k, v, kernel_options={"BLOCK_M": 64})


def test_what_cannot_be_traced_names_the_line():
    q = k = v = torch.randn(1, 2, 8, 16).half()

    def uses_math(score, b, h, q_idx, kv_idx):
        return math.exp(score)

    def uses_atan(score, b, h, q_idx, kv_idx):
        return score + torch.atan(score)

    with pytest.raises(TraceError, match=r"uses_math \(test_flex_corpus.py:\d+: return math.exp\(score\)\)"):
        flex_attention(q, k, v, score_mod=uses_math)
    with pytest.raises(TraceError, match=r"uses_atan \(test_flex_corpus.py:\d+: .*\): aten.atan has no translation"):
        flex_attention(q, k, v, score_mod=uses_atan)


def test_nan_and_inf_constants_in_a_callable():
    got, want = run_both("nan_guard", 21, 30)
    assert not torch.isnan(got).any() and (got.double() - want).abs().max().item() <= 2e-2


CASES["nan_guard"] = (lambda s, b, h, q, kv: torch.where(s > 1e9, float("nan"), torch.where(kv > q, -math.inf, s)),
                      None)


def test_document_ids_written_in_place_or_replaced_change_the_skipped_blocks():
    """The key blocks a document mask visits are built from the ids; writing the ids in place (or capturing a
    new tensor) must give the new documents' attention, never the old block lists. A row whose document is
    absent from the keys (cross-attention) is fully masked: output 0."""
    doc = torch.tensor([0] * 20 + [1] * 17 + [2] * 10)
    kv_doc = torch.tensor([0] * 30 + [1] * 17)

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == kv_doc[kv_idx]) & (q_idx >= kv_idx)

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, H, 47, 16, generator=g) for _ in range(3))

    def check():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = torch_flex(q.double(), k.double(), v.double(),
                              block_mask=create_block_mask(mask_mod, 1, H, 47, 47, device="cpu"))
        got = flex_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), mask_mod=mask_mod).cpu()
        assert torch.isfinite(got).all()
        assert (got.double() - want).abs().max() < 1e-4
        return got

    first = check()
    assert (first[0, :, 37:] == 0).all()   # document 2 has no keys
    doc[5:25] = 1                          # written in place
    kv_doc[:8] = 2
    second = check()
    assert not torch.allclose(first, second)
    doc = torch.tensor([0] * 47)           # a new tensor behind the same name
    check()


@pytest.mark.parametrize("L", [1, 3])
def test_decoding_with_a_document_mask_visits_the_listed_blocks_in_every_chunk(L):
    """Decode runs split over the keys: each chunk program takes its share of the row block's listed key blocks
    (the blocks of the query's document); the combine must give FlexAttention's result, GQA included."""
    S = 150
    doc = torch.tensor([0] * 50 + [1] * 75 + [2] * 25)

    def mask_mod(b, h, q_idx, kv_idx):
        at = q_idx + S - L
        return (doc[at] == doc[kv_idx]) & (at >= kv_idx)

    g = torch.Generator().manual_seed(L)
    q = torch.randn(1, H, L, 16, generator=g)
    k, v = (torch.randn(1, HKV, S, 16, generator=g) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(), enable_gqa=True,
                          block_mask=create_block_mask(mask_mod, 1, H, L, S, device="cpu"))
    got = flex_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), mask_mod=mask_mod, enable_gqa=True).cpu()
    assert (got.double() - want).abs().max() < 1e-4


@pytest.mark.parametrize("row_order", [0, 1, 2])
def test_every_row_order_of_a_listed_mask_gives_the_same_attention(row_order):
    """Programs may take row blocks in the table's order of decreasing work, per head or across heads
    (ROW_ORDER 1, 2) or in their natural order (0): each row block is computed once whatever the order."""
    from neptune_eqsat import flex
    # on a GPU a problem this small is split over the keys (no row order): there, more rows and heads
    scale, heads = (1, 2) if DEVICE == "cpu" else (20, 16)
    doc = torch.tensor([0] * 30 * scale + [1] * 25 * scale + [2] * 15 * scale)
    n = len(doc)

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) | (kv_idx < 3)

    g = torch.Generator().manual_seed(row_order)
    q, k, v = (torch.randn(1, heads, n, 16, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(),
                          block_mask=create_block_mask(mask_mod, 1, heads, n, n, device="cpu"))
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    flex_attention(q, k, v, mask_mod=mask_mod)
    compiled = flex._module_for(flex._plan(mask_mod=mask_mod, score_mod=None, scale=None, enable_gqa=False), q, k, v)
    assert "ROW_ORDER" in compiled.module.CONFIG
    capture = flex._as_kernel_input(doc, q.device)
    with triton_interpret(q.device.type == "cpu"):
        got = compiled.module.forward(q, k, v, capture, config={"ROW_ORDER": row_order}).cpu()
    assert (got.double() - want).abs().max() < 1e-4


def test_a_score_mod_that_masks_and_a_mask_mod_are_classified_together():
    """A score_mod sending scores to -inf (a sliding window) and a mask_mod (documents): blocks are skipped
    where either masks every element and run without tests where both keep every one."""
    doc = torch.tensor([0] * 25 + [1] * 40 + [2] * 15)

    def window(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx - kv_idx <= 20, score, -float("inf"))

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 80, 16, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(), score_mod=window,
                          block_mask=create_block_mask(mask_mod, 1, 2, 80, 80, device="cpu"))
    got = flex_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), score_mod=window, mask_mod=mask_mod).cpu()
    assert (got.double() - want).abs().max() < 1e-4
    from neptune_eqsat import flex
    module = flex._module_for(flex._plan(window, mask_mod, None, False), q, k, v).module
    assert "_block_table" in open(module.__file__).read().split("def forward")[1]   # the lists are used
