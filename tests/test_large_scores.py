"""Large scores: a softmax's max far above 11 (where exp overflows fp16) and 88 (fp32). Every plan must keep the
max subtracted before the exp, also where the score_mod takes an exp of its own: the cost model counts an exp
that may overflow once per use, and a plan dropping the subtraction (sum exp(s) times exp(-max)) once looked
less risky than the shifted one there, giving NaN. Checked against torch's flex_attention in float64, prefill
and decode (the split plan), in fp16, bf16 and fp32."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from neptune_eqsat import flex_attention

from conftest import DEVICE

TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 2e-4}
SCORE_MODS = {
    "plain": lambda s, b, h, q, kv: s,
    "own_exp": lambda s, b, h, q, kv: s + torch.exp(s * 0.01),
    "own_expm1": lambda s, b, h, q, kv: torch.expm1(s * 0.01) * 50.0,
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("L, S", [(43, 43), (1, 300), (4, 300)])
@pytest.mark.parametrize("name", sorted(SCORE_MODS))
def test_large_scores_keep_the_max_subtracted(name, L, S, dtype):
    g = torch.Generator().manual_seed(L + S)
    q = (torch.randn(1, 2, L, 16, generator=g) * 40).to(dtype)   # scores of a few hundred
    k, v = (torch.randn(1, 2, S, 16, generator=g).to(dtype) for _ in range(2))
    score_mod = SCORE_MODS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch_flex(q.double(), k.double(), v.double(), score_mod=score_mod)
    assert (score_mod(q.double() @ k.double().transpose(-1, -2) / 4, 0, 0, 0, 0).amax() > 100).item()
    got = flex_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), score_mod=score_mod).cpu()
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max().item() <= TOLERANCE[dtype]
