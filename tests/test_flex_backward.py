"""Gradients through neptune_eqsat.flex_attention: q, k, v and captured float tensors that require grad (a
learnable bias table, ALiBi slopes), against torch's autograd of the plain attention math in float64, the
callables applied the way FlexAttention applies them (one vmap per index). FlexAttention itself has no
backward on CPU, so this reference stands in for it; on the GPU (NEPTUNE_TEST_DEVICE=cuda) the same tests run
the compiled kernels."""
import math

import pytest
import torch
from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

from neptune_eqsat import flex_attention

from conftest import DEVICE

TOL = {torch.float16: 2e-2, torch.bfloat16: 8e-2, torch.float32: 1e-3}


def _vmapped(fn, n_args):
    """FlexAttention's own application of a callable: one vmap per index, the key index innermost."""
    lead = (0,) if n_args == 5 else ()
    for k in range(4):
        dims = [None] * 4
        dims[3 - k] = 0
        fn = torch.vmap(fn, in_dims=lead + tuple(dims), out_dims=0)
    return fn


def math_attention(q, k, v, score_mod=None, mask_mod=None, scale=None):
    B, H, L, D = q.shape
    S, G = k.shape[2], H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D) if scale is None else scale)
    idx = [torch.arange(n, dtype=torch.int32) for n in (B, H, L, S)]
    with TransformGetItemToIndex():
        if score_mod is not None:
            s = _vmapped(score_mod, 5)(s, *idx)
        if mask_mod is not None:
            s = torch.where(_vmapped(mask_mod, 4)(*idx), s, -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(m == -math.inf, 0, m))
    l = p.sum(-1, keepdim=True)
    return (p @ v) / torch.where(l == 0, 1, l)


def run_both(shape, dtype, make_mods, learn=(), scale=None, seed=0):
    """Gradients of neptune's flex_attention and of the float64 math for mods made by make_mods(tensors)."""
    B, H, HKV, L, S, D = shape
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(B, H, L, D, generator=g), torch.randn(B, HKV, S, D, generator=g),
            torch.randn(B, HKV, S, D, generator=g)] + [t.clone() for t in learn]
    ours = [t.to(DEVICE, dtype if k < 3 else t.dtype).clone().requires_grad_() for k, t in enumerate(base)]
    ref = [t.double().requires_grad_() for t in base]
    out = flex_attention(*ours[:3], *make_mods(ours[3:]), scale=scale, enable_gqa=H != HKV)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad.to(out.device, out.dtype))
    expect = math_attention(*ref[:3], *make_mods(ref[3:]), scale=scale)
    expect.backward(grad.double())
    assert (out.double().cpu() - expect).abs().max().item() < TOL[dtype]
    for k, (a, r) in enumerate(zip(ours, ref)):
        assert a.grad is not None and not torch.isnan(a.grad).any(), k
        want = r.grad if r.grad is not None else torch.zeros_like(r)   # an input the scores do not read
        err = (a.grad.double().cpu() - want).abs().max().item() / max(1.0, want.abs().max().item())
        assert err < TOL[dtype], (k, err)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_causal_gqa_with_a_learnable_bias_table_and_an_empty_row(dtype):   # bf16 gradients: also test_autodiff
    def mods(learned):
        (bias,) = learned

        def rel_bias(score, b, h, q_idx, kv_idx):
            return score + bias[h, (q_idx - kv_idx).clamp(-8, 8) + 8]

        def mask(b, h, q_idx, kv_idx):
            return causal(b, h, q_idx, kv_idx) & (q_idx != 4)   # row 4 keeps no key: output and gradients 0
        return rel_bias, mask
    run_both((2, 4, 2, 21, 27, 16), dtype, mods, learn=[torch.randn(4, 17)])


def test_learnable_alibi_slopes_and_soft_cap_in_fp32():
    def mods(learned):
        (slopes,) = learned

        def alibi_capped(score, b, h, q_idx, kv_idx):
            score = score + slopes[h] * (kv_idx - q_idx)
            return 30 * torch.tanh(score / 30)
        return alibi_capped, causal
    run_both((1, 2, 2, 23, 23, 16), torch.float32, mods, learn=[torch.rand(2) * 0.5], scale=0.3)


def test_decode_shaped_gradients():
    def mods(learned):
        return None, lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 40 - 3   # bottom-right causal
    run_both((1, 4, 1, 3, 40, 16), torch.float16, mods)


def test_no_gradient_needed_runs_no_backward():
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16, device=DEVICE)
    out = flex_attention(q, q, q, mask_mod=causal)
    assert out.grad_fn is None


def test_a_small_transformer_trains_like_eager_attention():
    """A one-layer transformer on random tokens: the loss with these kernels tracks the loss with eager
    attention, step for step, from the same weights (fp32, so the curves differ only by rounding)."""
    torch.manual_seed(0)
    V, E, H, T = 13, 32, 2, 24

    class Block(torch.nn.Module):
        def __init__(self, attend):
            super().__init__()
            self.attend = attend
            self.emb, self.qkv = torch.nn.Embedding(V, E), torch.nn.Linear(E, 3 * E)
            self.out, self.head = torch.nn.Linear(E, E), torch.nn.Linear(E, V)

        def forward(self, tokens):
            x = self.emb(tokens)
            q, k, v = self.qkv(x).view(1, T, 3, H, E // H).permute(2, 0, 3, 1, 4)
            y = self.attend(q, k, v).transpose(1, 2).reshape(1, T, E)
            return self.head(x + self.out(y))

    def eager(q, k, v):
        return math_attention(q, k, v, mask_mod=causal)

    def ours(q, k, v):
        return flex_attention(q, k, v, mask_mod=causal)

    models = [Block(eager), Block(ours)]
    models[1].load_state_dict(models[0].state_dict())
    models[1].to(DEVICE)
    tokens = torch.randint(0, V, (1, T + 1))
    curves = []
    for model in models:
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        t = tokens.to(next(model.parameters()).device)
        for _ in range(6):
            loss = torch.nn.functional.cross_entropy(model(t[:, :-1])[0], t[0, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    assert curves[0][-1] < curves[0][0] - 0.1   # it learns
    assert max(abs(a - b) for a, b in zip(*curves)) < 1e-3, curves


def test_gradients_under_torch_compile_match_eager():
    """The forward and backward operators are opaque nodes of a compiled graph: fullgraph compiles, and the
    gradients are the eager ones."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 19, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))

    def loss(q, k, v):
        return flex_attention(q, k, v, mask_mod=causal).square().sum()
    for a, b in zip(*_eager_and_compiled_gradients(loss, (q, k, v))):
        assert torch.equal(a, b)


def _eager_and_compiled_gradients(loss, tensors) -> tuple[list, list]:
    """The gradients of `loss` at `tensors` eagerly, then through torch.compile(fullgraph=True)."""
    loss(*tensors).backward()
    eager = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    torch.compile(loss, fullgraph=True)(*tensors).backward()
    return eager, [t.grad for t in tensors]


def test_gradients_under_torch_compile_with_captured_tensors_match_eager():
    """Callables that capture tensors (a fixed bias, learnable fp32 and float64 slopes) under fullgraph
    compile with gradients wanted (before: the training operator's fake traced the callables under fake
    tensors and failed), and a float64 capture gets its gradient, in float64 (before: none)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 13, 16, generator=g).to(DEVICE).requires_grad_()
    bias = torch.randn(2, generator=g).to(DEVICE)
    slopes = [torch.rand(2, generator=g, dtype=dt).to(DEVICE).requires_grad_() for dt in (torch.float32,
                                                                                      torch.float64)]

    def biased(s, b, h, qi, ki):   # made outside the compiled function, as fullgraph needs
        return s + bias[h] + (slopes[0][h] + slopes[1][h]) * (ki - qi)

    def loss(q):
        return flex_attention(q, q, q, score_mod=biased).square().sum()
    loss(q).backward()
    eager = [t.grad.clone() for t in (q, *slopes)]
    assert slopes[1].grad.dtype == torch.float64
    for t in (q, *slopes):
        t.grad = None
    torch.compile(loss, fullgraph=True)(q).backward()
    for a, b in zip(eager, (q.grad, *(s.grad for s in slopes))):
        assert torch.equal(a, b)
    qd, sd = q.detach().double().cpu().requires_grad_(), [s.detach().double().cpu().requires_grad_() for s in slopes]
    pos = torch.arange(13, dtype=torch.float64)
    scores = qd @ qd.transpose(-1, -2) / 4 + bias.cpu().double()[:, None, None] + \
        (sd[0] + sd[1])[:, None, None] * (pos[None, :] - pos[:, None])
    (torch.softmax(scores, -1) @ qd).square().sum().backward()   # float64 autograd of the plain math
    assert (slopes[1].grad.cpu() - sd[1].grad).abs().max() <= 1e-2 * sd[1].grad.abs().max()


def test_the_training_forward_writes_what_the_backward_reads(monkeypatch):
    """With gradients wanted, the forward kernel also writes the row max and row sum; the backward reads them
    and runs no kernel of its own to compute them again."""
    from neptune_eqsat import training
    ran = []
    real = training.run_spec

    def counted(spec, tensors):
        ran.append(spec.name)
        return real(spec, tensors)
    monkeypatch.setattr(training, "run_spec", counted)

    def mods(learned):
        return None, causal
    run_both((1, 2, 1, 21, 21, 16), torch.float16, mods, seed=3)
    forward, *backward = ran   # one forward kernel (with its further outputs), then the backward's
    assert all(n.startswith(forward + "_") for n in backward), ran
    assert not any("saved" in n for n in backward), ran   # no stage computes the row max or sum again
    assert [n[len(forward) + 1:].rstrip("0123456789") for n in backward] == ["stat", "dv_dk", "dq"], ran


def test_an_eager_training_step_hashes_no_spec_and_skips_the_operators(monkeypatch):
    """After a first call, an eager training step's forward and backward hash no spec again (three hashes a
    forward call before: its derivation, its key, and a forward_spec made again each call) and do not go
    through the custom operators' dispatch (their wrappers cost as much host time as the rest of the call's
    Python): the step is one autograd node of the API's own. torch.compile still traces the operators
    (test_gradients_under_torch_compile_match_eager)."""
    from neptune_eqsat import flex, training
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 11, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    flex_attention(q, k, v, mask_mod=causal).sum().backward()   # the first call: derives and compiles
    hashed = []
    real_key = training.spec_key
    monkeypatch.setattr(training, "spec_key", lambda spec: hashed.append(spec.name) or real_key(spec))

    def no_operator(*args):
        raise AssertionError("an eager call went through a custom operator")
    monkeypatch.setattr(flex, "train_op", no_operator)
    monkeypatch.setattr(flex, "backward_op", no_operator)
    grads = []
    for _ in range(2):
        out = flex_attention(q, k, v, mask_mod=causal)
        assert type(out.grad_fn).__name__.startswith("_EagerTraining"), out.grad_fn
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    assert hashed == []
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(reentrant):
    """Under torch.utils.checkpoint (the forward run again in the backward) the gradients of q, k, v and of a
    learnable capture are those of the plain call. Before, the non-reentrant form (PyTorch's default) failed:
    the backward unpacked its saved tensors three times, where checkpointing allows each one unpacking."""
    from torch.utils.checkpoint import checkpoint
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    bias = torch.randn(2, generator=g).to(DEVICE).requires_grad_()

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bias[h], mask_mod=causal)
    grads = []
    for run in (attend, lambda *xs: checkpoint(attend, *xs, use_reentrant=reentrant)):
        run(q, k, v).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v, bias)])
        for t in (q, k, v, bias):
            t.grad = None
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_gradients_under_torch_compile_with_dynamic_shapes():
    """torch.compile(dynamic=True) with gradients wanted, over lengths that change (prefill to decode-shaped)
    and a GQA ratio: the gradients are eager's. Before, the training operator's fake traced the callables with
    symbolic head counts and failed ("axis h: extent must be an int or a Dim")."""
    def loss(q, k, v):
        return flex_attention(q, k, v, mask_mod=causal, enable_gqa=True).square().sum()
    compiled = torch.compile(loss, dynamic=True)
    g = torch.Generator().manual_seed(8)
    for L, S in ((17, 17), (29, 29), (4, 31)):
        q = torch.randn(1, 4, L, 16, generator=g).to(DEVICE).requires_grad_()
        k, v = (torch.randn(1, 2, S, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
        compiled(q, k, v).backward()
        got = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        loss(q, k, v).backward()
        for a, t in zip(got, (q, k, v)):
            assert torch.allclose(a, t.grad, atol=1e-5, rtol=1e-5)


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 4)


def test_one_compiled_graph_with_two_masks_and_the_logsumexp():
    """torch.compile(fullgraph=True) of a function calling flex_attention with two masks (layers alternating a
    sliding window and causal attention) and asking for the logsumexp: equal to eager, gradients too. Before,
    the second plan made while the graph was traced was looked up in a dict dynamo had read at the first
    lookup, and the compile failed with a KeyError."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))

    def loss(q, k, v):
        x = flex_attention(q, k, v, mask_mod=sliding)
        out, lse = flex_attention(x, k, v, mask_mod=causal, return_lse=True)
        return out.square().sum() + lse.sum()
    results = []
    for run in (torch.compile(loss, fullgraph=True), loss):   # compiled first: its plans are made while tracing
        value = run(q, k, v)
        value.backward()
        results.append([value.detach()] + [t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_the_logsumexps_gradient_with_rows_the_mask_empties():
    """A loss reading the output and the logsumexp (its -inf rows set aside, as a merge of chunks does) where the
    mask empties rows: float64 autograd's gradients (the gradient kernels' shift was -inf on those rows, and
    their zero adjoint came out NaN in dQ and dK)."""
    def mask(b, h, q_idx, kv_idx):
        return (q_idx < 10) & (kv_idx <= q_idx)
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, 37, 16, generator=g) for _ in range(3)]
    ours = [t.to(DEVICE).clone().requires_grad_() for t in base]
    ref = [t.double().requires_grad_() for t in base]
    out, lse = flex_attention(*ours, mask_mod=mask, return_lse=True)
    (out.sum() + lse.masked_fill(lse.isinf(), 0).sum()).backward()
    idx = torch.arange(37)
    s = ((ref[0] @ ref[1].transpose(-1, -2)) / 4.0).masked_fill(~mask(0, 0, idx[:, None], idx[None, :]), -math.inf)
    want_lse = torch.logsumexp(s, -1)
    want = torch.exp(s - want_lse[..., None]).nan_to_num(0.0) @ ref[2]
    (want.sum() + want_lse.masked_fill(want_lse.isinf(), 0).sum()).backward()
    for a, r in zip(ours, ref):
        assert not torch.isnan(a.grad).any()
        assert (a.grad.double().cpu() - r.grad).abs().max().item() < 1e-4


@pytest.mark.parametrize("case", ["distance", "uniform window"])
def test_scores_made_of_positions_alone_train(case):
    """A score_mod that never reads the score (attention by distance, a uniform window): its training forward's
    saved row max reads no key tensor, and was refused for a size no input carried."""
    def mods(learned):
        if case == "distance":
            (slopes,) = learned
            return (lambda s, b, h, q_idx, kv_idx: -slopes[h] * (q_idx - kv_idx).abs()), None
        return (lambda s, b, h, q_idx, kv_idx: torch.where((q_idx - kv_idx).abs() < 4, torch.zeros_like(s),
                                                           -math.inf)), None
    run_both((1, 2, 2, 11, 13, 16), torch.float32, mods, learn=[torch.rand(2) * 0.5] if case == "distance" else [])


def test_a_first_call_under_checkpointing_with_a_capture_that_requires_grad():
    """The first call of a score_mod traces it; under non-reentrant checkpointing that trace ran with grad enabled
    and saved tensors the recomputation did not (CheckpointError: a different number of tensors saved). Here
    the slopes are made from a parameter at every call, so every call traces again."""
    from torch.utils.checkpoint import checkpoint
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 13, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    p = torch.randn(2, generator=g).to(DEVICE).requires_grad_()

    def attend(q, k, v):
        slopes = torch.exp(p)
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s - slopes[h] * (i - j).abs())
    grads = []
    for run in (lambda *xs: checkpoint(attend, *xs, use_reentrant=False), attend):
        run(q, k, v).square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v, p)])
        for t in (q, k, v, p):
            t.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_gradients_under_torch_compile_with_inputs_in_model_layout():
    """q, k, v held as [B, S, H, D] and transposed into the call (as model code does): the backward operator's
    gradients are contiguous, as its fake says (before, the fake kept the inputs' strides and the compiled graph
    failed its stride check)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 19, 2, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))

    def loss(q, k, v):
        return flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask_mod=causal).square().sum()
    for a, b in zip(*_eager_and_compiled_gradients(loss, (q, k, v))):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_second_order_gradient_is_refused_not_silently_wrong():
    """create_graph=True through the backward kernels would give gradients autograd does not see (a gradient
    penalty counted as a constant): refused by name."""
    q, k, v = (torch.randn(1, 1, 8, 16).to(DEVICE) for _ in range(3))
    q.requires_grad_()
    out = flex_attention(q, k, v)
    with pytest.raises(RuntimeError, match="not differentiable again"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)
