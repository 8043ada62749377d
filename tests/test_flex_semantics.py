"""torch's semantics of what a score_mod or mask_mod computes, against torch's own flex_attention in float64:
truth values of numbers (logical ops, bool casts), casts that wrap or round, integers past int32, integer powers,
Python truth values among values, and the state a callable reads through a module, a property or a slot."""
import math
import sys

import pytest
import torch

from neptune_eqsat import flex_attention
from neptune_eqsat import flex_plans

from test_flex_user_code import error, inputs

FLAGS = torch.tensor([0.5, 0.0])
TAB = torch.randn(9, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("score_mod, mask_mod", [
    # truth values: a number is true where nonzero (0.5 is True, a remainder of 2 is True)
    (None, lambda b, h, q, kv: torch.logical_xor(kv % 3, q % 2)),
    (None, lambda b, h, q, kv: torch.logical_and(kv % 3, q % 2) | (q == kv)),
    (None, lambda b, h, q, kv: FLAGS[h].bool() | (q >= kv)),
    (lambda s, b, h, q, kv: torch.where((s * 0.3).bool(), s, -5.0), None),
    # Python truth values among values
    (None, lambda b, h, q, kv: torch.where(kv < 4, True, q >= kv)),
    (None, lambda b, h, q, kv: (q >= kv).masked_fill(kv < 4, True)),
    (None, lambda b, h, q, kv: ((q >= kv) == True) | ((kv < 3) != False)),   # noqa: E712
    (lambda s, b, h, q, kv: torch.where(q >= kv, s, s.new_full((), -1e9)), None),
    # a truth value's number negated, through a sigmoid, bit-inverted
    (lambda s, b, h, q, kv: s + (-(kv > q).float()) * 1e4, None),
    (lambda s, b, h, q, kv: s + torch.sigmoid((kv > q).float()), None),
    (lambda s, b, h, q, kv: s + (~(q >= kv).int()) * 0.5, None),
    # casts: narrow integers wrap, integers rounded to 16 bits
    (lambda s, b, h, q, kv: s + (q - kv).to(torch.uint8) * 0.01, None),
    (lambda s, b, h, q, kv: s + (q - kv).to(torch.int8) * 0.01, None),
    (lambda s, b, h, q, kv: s + ((q * 97 - kv).half().float() - (q * 97 - kv)) * 0.2, None),
    # integers past int32: a hash, a sentinel, a large offset on both sides; an integer power of a position
    (None, lambda b, h, q, kv: ((q * 100000000 + kv) % 7) > 1),
    (None, lambda b, h, q, kv: (q >= kv) & (q - kv < sys.maxsize)),
    (None, lambda b, h, q, kv: kv + 2**40 > q + 2**40 - 5),
    (None, lambda b, h, q, kv: (q - kv) % (3 ** (h + 1)) == 0),
    (lambda s, b, h, q, kv: s + TAB[2 ** h], None),
])
def test_torch_semantics_of_the_callables(score_mod, mask_mod):
    q, k, v = inputs(1, 2, 40, 40, dtype=torch.float32)
    assert error(q, k, v, score_mod, mask_mod) < 1e-5


def test_state_read_through_a_module_a_property_or_a_slot_is_read_at_every_call():
    """A buffer of an nn.Module replaced, a property's field changed, a slot reassigned, a captured tensor
    retyped: the next call reads the new value (before, the trace cached the first)."""
    q, k, v = inputs(1, 2, 40, 40, dtype=torch.float32)

    class Slopes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("slopes", torch.tensor([0.5, 0.25]))

    class Window:
        def __init__(self):
            self._w = 8

        @property
        def width(self):
            return self._w

    class Slotted:
        __slots__ = ("width",)

    m, w, sl = Slopes(), Window(), Slotted()
    sl.width = 8
    cases = [
        (lambda s, b, h, qi, ki: s + m.slopes[h] * (ki - qi), None,
         lambda: setattr(m, "slopes", torch.tensor([2., 1.]))),
        (None, lambda b, h, qi, ki: (qi >= ki) & (qi - ki < w.width), lambda: setattr(w, "_w", 30)),
        (None, lambda b, h, qi, ki: (qi >= ki) & (qi - ki < sl.width), lambda: setattr(sl, "width", 30)),
        (lambda s, b, h, qi, ki: s + m.slopes[h] * (ki - qi), None, lambda: m.double()),
    ]
    for score_mod, mask_mod, change in cases:
        assert error(q, k, v, score_mod, mask_mod) < 1e-5
        change()
        assert error(q, k, v, score_mod, mask_mod) < 1e-5


def test_a_mask_made_for_every_batch_is_dropped_with_its_captured_tensors():
    """attention-gym's per-batch document mask: each batch's callable captures its ids; once the callable is
    gone its plan and captured tensors go too (before, every batch's ids stayed alive)."""
    import gc
    import weakref
    q, k, v = inputs(1, 1, 32, 32, dtype=torch.float32)
    before = len(flex_plans._CALLABLES)
    refs = []
    for step in range(4):
        doc = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(step)).sort().values
        refs.append(weakref.ref(doc))
        flex_attention(q, k, v, mask_mod=lambda b, h, qi, ki, doc=doc: doc[qi] == doc[ki])
        del doc
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert len(flex_plans._CALLABLES) == before


def test_a_gradient_after_the_callable_is_gone():
    """The backward of a call whose callable was an inline lambda: the plan stays until the backward ran."""
    import gc
    q, k, v = (x.requires_grad_() for x in inputs(1, 2, 24, 24, dtype=torch.float32))
    bias = torch.randn(2, requires_grad=True)
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + bias[h] * (ki - qi))
    gc.collect()
    out.square().sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v, bias))
    assert math.isfinite(bias.grad.sum().item())


def test_state_read_through_methods_helpers_module_lists_and_class_attributes():
    """What a callable reads through a method of an object, a helper taking the object, a ModuleList entry or
    a class attribute is read again at every call (before, the first call's value stayed)."""
    q, k, v = inputs(1, 2, 40, 40, dtype=torch.float32)

    class Cache:
        def __init__(self):
            self.pos = 8

        def mask(self, b, h, qi, ki):
            return (ki <= qi) & (qi - ki < self.pos)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = 8

    class State:
        pos = 8

    def within(c, qi, ki):
        return (ki <= qi) & (qi - ki < c.pos)

    cache, layers, state = Cache(), torch.nn.ModuleList([Layer(), Layer()]), State()
    cases = [
        (lambda b, h, qi, ki: cache.mask(b, h, qi, ki), lambda: setattr(cache, "pos", 30)),
        (lambda b, h, qi, ki: within(cache, qi, ki), lambda: setattr(cache, "pos", 3)),
        (lambda b, h, qi, ki: (ki <= qi) & (qi - ki < layers[1].pos), lambda: setattr(layers[1], "pos", 30)),
        (lambda b, h, qi, ki: (ki <= qi) & (qi - ki < state.pos), lambda: setattr(State, "pos", 30)),
    ]
    for mask_mod, change in cases:
        assert error(q, k, v, None, mask_mod) < 1e-5
        change()
        assert error(q, k, v, None, mask_mod) < 1e-5


def test_inference_tensors_captured_and_a_constant_index_under_inference_mode():
    """Tensors made under inference_mode have no version counter (before: a RuntimeError), and a capture read at
    a constant index traces under inference_mode too (before: aten.detach_ had no translation)."""
    q, k, v = inputs(1, 2, 1, 64, dtype=torch.float32)
    with torch.inference_mode():
        lens = torch.tensor([20, 33])
        cache_len = torch.tensor([20])
    assert error(q, k, v, None, lambda b, h, qi, ki: ki < lens[b]) < 1e-5
    with torch.inference_mode():
        out = flex_attention(q, k, v, mask_mod=lambda b, h, qi, ki: ki < cache_len[0])
    want = torch.softmax((q[..., :1, :].double() @ k[..., :20, :].double().transpose(-1, -2)) / 4, -1) \
        @ v[..., :20, :].double()
    assert (out.double() - want).abs().max().item() < 1e-5


def test_return_aux_without_lse_and_with_return_lse():
    from torch.nn.attention.flex_attention import AuxRequest
    q, k, v = inputs(2, 2, 8, 8, dtype=torch.float32)
    out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=False))
    assert out.shape == (2, 2, 8, 16) and aux.lse is None
    with pytest.raises(ValueError, match="not both"):
        flex_attention(q, k, v, return_lse=True, return_aux=AuxRequest(lse=True))


def test_a_length_rebound_every_step_keeps_a_bounded_number_of_plans():
    """lens = lens + 1 at every decode step makes a new plan (the mask reads a new tensor); a live callable keeps
    its latest PLANS_PER_CALLABLES plans, the older ones dropped with their tensors."""
    import gc
    import weakref
    q, k, v = inputs(1, 1, 1, 48, dtype=torch.float32)
    holder = {"lens": torch.tensor([4])}

    def mask_mod(b, h, qi, ki):
        return ki < holder["lens"][0]
    refs = []
    for step in range(flex_plans.PLANS_PER_CALLABLES + 6):
        holder["lens"] = holder["lens"] + 1
        refs.append(weakref.ref(holder["lens"]))
        flex_attention(q, k, v, mask_mod=mask_mod)
    gc.collect()
    assert sum(r() is not None for r in refs) <= flex_plans.PLANS_PER_CALLABLES


WINDOW = 8


def test_a_compiled_graph_refuses_callables_that_read_other_values_since():
    """A compiled graph holds its plan as a constant, and dynamo guards on none of what the callables read
    through globals or closures: a changed global would run the old window. The graph's operator checks the
    reads and refuses (before: silently the old window)."""
    global WINDOW
    q, k, v = inputs(1, 2, 40, 40, dtype=torch.float32)

    def window(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < WINDOW)
    attn = torch.compile(lambda q, k, v: flex_attention(q, k, v, mask_mod=window), backend="eager")
    try:
        first = attn(q, k, v)
        assert torch.allclose(first, flex_attention(q, k, v, mask_mod=window))
        WINDOW = 20
        with pytest.raises(RuntimeError, match="compiled graph"):
            attn(q, k, v)
    finally:
        WINDOW = 8
