"""An output axis the spec also reduces over (GroupNorm's channels within a group, a mean over heads written
beside each head) needs the whole axis in one program: the schedule holds it as the tile's columns wherever it
stands among the output axes. Before, only the last output axis could be, and one elsewhere was divided among
the programs: each reduced over its own slice, a silent wrong answer (GroupNorm off by 1.5)."""
import torch
import torch.nn.functional as F

from neptune_eqsat.compiler import optimize
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, f32, log, exp, max, sqrt, sum
from neptune_eqsat.training import Differentiable


def compiled_module(spec: Spec):
    """The spec's module's forward."""
    return load_module(optimize(spec).source, spec.name).forward


def _group_norm() -> Spec:
    spec = Spec("group_norm_channels_inside")
    B, S = spec.dims(B=8, S=1024)
    b, g, c, s = spec.axes(b=B, g=4, c=8, s=S)   # 4 groups of 8 channels, S positions; stats over (c, s)
    x = spec.input("x", f32, B, 4, 8, S)
    n = 8 * S
    mean = sum(c, sum(s, x[b, g, c, s])) / n
    var = sum(c, sum(s, (x[b, g, c, s] - mean) * (x[b, g, c, s] - mean))) / n
    spec.output("y", f32, (x[b, g, c, s] - mean) / sqrt(var + 1e-5), b, g, c, s)
    return spec


def test_group_norm_with_channels_before_positions_matches_torch():
    X = torch.randn(2, 4, 8, 7, generator=torch.Generator().manual_seed(0)) * 2 + 1
    ref = F.group_norm(X.double().reshape(2, 32, 7), 4, eps=1e-5).reshape(X.shape)
    out = compiled_module(_group_norm())(X)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_group_norm_gradient_matches_torch():
    X = torch.randn(2, 4, 8, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    up = torch.randn(2, 4, 8, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = X.float().requires_grad_()
    (Differentiable(_group_norm())(ours) * up.float()).sum().backward()
    ref = X.clone().requires_grad_()
    (F.group_norm(ref.reshape(2, 32, 5), 4, eps=1e-5).reshape(X.shape) * up).sum().backward()
    assert (ours.grad.double() - ref.grad).abs().max().item() < 1e-4


def test_a_mean_over_heads_beside_each_head_and_a_joint_log_softmax():
    spec = Spec("lse_less_mean_over_heads")
    B, N = spec.dims(B=4, N=1024)
    b, h, j = spec.axes(b=B, h=4, j=N)
    x = spec.input("x", f32, B, 4, N)
    m = max(j, x[b, h, j])
    lse = m + log(sum(j, exp(x[b, h, j] - m)))
    spec.output("y", f32, x[b, h, j] - lse + sum(h, lse) / 4, b, h, j)
    X = torch.randn(3, 4, 67, generator=torch.Generator().manual_seed(3))
    lse_ref = torch.logsumexp(X.double(), dim=2, keepdim=True)
    ref = X.double() - lse_ref + lse_ref.mean(dim=1, keepdim=True)
    assert (compiled_module(spec)(X).double() - ref).abs().max().item() < 1e-5

    joint = Spec("joint_log_softmax_over_heads")
    B, N = joint.dims(B=4, N=1024)
    b, h, j = joint.axes(b=B, h=4, j=N)
    x = joint.input("x", f32, B, 4, N)
    m = max(h, max(j, x[b, h, j]))
    joint.output("y", f32, x[b, h, j] - m - log(sum(h, sum(j, exp(x[b, h, j] - m)))), b, h, j)
    ref = torch.log_softmax(X.double().reshape(3, -1), dim=1).reshape(X.shape)
    assert (compiled_module(joint)(X).double() - ref).abs().max().item() < 1e-5


def test_two_reduced_output_axes_of_a_long_reduction():
    """A mean over (c, d, s) beside an output along all of them: the reductions over c and d read the long
    reduction over s renamed, each program holding whole c and d."""
    spec = Spec("two_reduced_output_axes")
    B, S = spec.dims(B=8, S=1024)
    b, c, d, s = spec.axes(b=B, c=4, d=8, s=S)
    x = spec.input("x", f32, B, 4, 8, S)
    spec.output("y", f32, x[b, c, d, s] - sum(c, sum(d, sum(s, x[b, c, d, s]))) / (32 * S), b, c, d, s)
    X = torch.randn(2, 4, 8, 5, generator=torch.Generator().manual_seed(4))
    ref = X.double() - X.double().mean((1, 2, 3), keepdim=True)
    assert (compiled_module(spec)(X).double() - ref).abs().max().item() < 1e-5
