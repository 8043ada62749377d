"""Integer tensors as operands of a matrix product (int8 weights dequantized by the product, int32 counts):
multiplied in fp32. Before, the product got an integer operand, which Triton's dot refuses (an internal error on
a valid spec, in every plan family)."""
import pytest
import torch

from neptune_eqsat.compiler import optimize
from neptune_eqsat.runtime.loader import load_module
from neptune_eqsat.spec import Spec, f16, f32, i8, i32, max, sum


@pytest.mark.parametrize("x_dtype, w_dtype", [(f16, i8), (f32, i32), (i8, i8)])
def test_a_product_with_integer_operands_matches_float64(x_dtype, w_dtype):
    spec = Spec(f"int_dot_{x_dtype}_{w_dtype}")
    R, N = spec.dims(R=64, N=1024)
    r, d, n = spec.axes(r=R, d=32, n=N)
    x = spec.input("x", x_dtype, R, 32)
    w = spec.input("w", w_dtype, N, 32)
    spec.output("y", f32, max(n, sum(d, x[r, d] * w[n, d])), r)
    forward = load_module(optimize(spec).source, spec.name).forward
    g = torch.Generator().manual_seed(0)
    as_torch = {f16: torch.float16, f32: torch.float32, i8: torch.int8, i32: torch.int32}
    X = (torch.randint(-5, 5, (3, 32), generator=g) if x_dtype == i8 else torch.randn(3, 32, generator=g))
    W = torch.randint(-5, 5, (67, 32), generator=g)
    X, W = X.to(as_torch[x_dtype]), W.to(as_torch[w_dtype])
    ref = (X.double() @ W.double().T).amax(dim=1)
    assert (forward(X, W).double() - ref).abs().max().item() < 1e-2
