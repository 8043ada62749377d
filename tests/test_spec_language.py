"""The spec language reads like the math, and bad specs fail with the spec line named."""
import pytest

from neptune_eqsat import ir
from neptune_eqsat.spec import SpecError, load_spec

HEADER = "from neptune_eqsat.spec import *\nspec = Spec('t')\nR, N = spec.dims('R', 'N')\n" \
         "r, j = spec.axes(r=R, j=N)\nx = spec.input('x', f32, R, N)\n"


def write(tmp_path, body: str) -> str:
    p = tmp_path / "t.py"
    p.write_text(HEADER + body)
    return str(p)


def test_attention_spec_reads_as_math(tmp_path):
    spec = load_spec("specs/causal_pf.py")
    assert spec.output_axes == ("b", "h", "i", "e")
    text = ir.show(spec.output_term)
    assert "max(j, where((i >= j)" in text and "sum(d, (q[b, h, i, d] * k[b, (h // 1), j, d]))" in text
    assert set(spec.inputs) == {"q", "k", "v"}


@pytest.mark.parametrize("body, message", [
    ("spec.output('y', f32, x[r], r)\n", "t.py:6: tensor x has 2 dimensions"),
    ("spec.output('y', f32, x[j, r], r, j)\n", "t.py:6: tensor x, dimension 0 has extent R but axis j runs over N"),
    ("spec.output('y', f32, x[r, j], r)\n", "t.py:6: output y: the value depends on axes ['j']"),
    ("y = sum(j, x[r, 0])\n", "t.py:6: sum over j: the value does not depend on j"),
    ("y = cast(x[r, j], 'f8')\n", "t.py:6: cast to unknown dtype 'f8'"),
    ("y = x[r, j] + undefined_name\n", "t.py:6: NameError"),
    ("z = spec.input('z', 'int7', R)\n", "t.py:6: input z: unknown dtype"),
    ("", "no output"),
    ("x2 = spec.input('x', f32, R, N)\n", "t.py:6: input x: declared twice"),
    ("spec.output('y', f32, sum(j, x[r, j]), 'r')\n", "t.py:6: output y: 'r' is not an axis"),
    ("y = x[r, j] ** 1.5\n", "t.py:6: x .. 1.5: the exponent must be an integer"),
])
def test_bad_specs_name_the_line(tmp_path, body, message):
    with pytest.raises(SpecError, match=".*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_spec(write(tmp_path, body))


def test_missing_file_is_an_error():
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec("specs/does_not_exist.py")


def test_powers_and_pythons_bool(tmp_path):
    """x ** n is n - 1 products (1 / x**-n below zero, sqrt at 0.5); Python's bool names the bool dtype."""
    spec = load_spec(write(tmp_path, "m = spec.input('m', bool, R, N)\n"
                                     "spec.output('y', f32, sum(j, where(m[r, j], x[r, j] ** 3 + x[r, j] ** -2 "
                                     "+ x[r, j] ** 0.5 + x[r, j] ** 0, 0.0)), r)\n"))
    assert spec.inputs["m"].dtype == "bool"
    text = ir.show(spec.output_term)
    assert "((x[r, j] * x[r, j]) * x[r, j])" in text and "(1 / (x[r, j] * x[r, j]))" in text and "sqrt(x[r, j])" in text
