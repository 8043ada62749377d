"""A gathered tile whose index is one value over a block is read once (codegen/uniform.py): which indices are
ranged. Outputs of kernels that take the scalar read are checked against torch in tests/test_flex_corpus.py
(relative bias, distance buckets)."""
from types import SimpleNamespace

from neptune_eqsat import ir
from neptune_eqsat.codegen.uniform import block_ranges


def _writer():
    count = iter(range(1000))
    return SimpleNamespace(row="i", loop="j", s=SimpleNamespace(grid=["h"]), block=lambda a: f"BLOCK_{a.upper()}",
                           ext=lambda a: {"i": "L", "j": "S"}[a], fresh=lambda stem: f"{stem}{next(count)}")


def distance(scale=1.0):
    i, j = ir.axis("i"), ir.axis("j")
    return ir.bin("add", ir.bin("min", ir.bin("max", ir.bin("mul", ir.bin("sub", i, j), ir.const(scale)),
                                              ir.const(-8.0)), ir.const(8.0)), ir.const(8.0))


def test_integer_index_arithmetic_is_ranged():
    ranged = block_ranges(_writer(), (ir.axis("h"), distance()))
    assert ranged is not None
    lines, bounds = ranged
    assert len(bounds) == 2 and bounds[0][0] == bounds[0][1]   # the grid value: one value
    assert any("i_lo" in x for x in lines) and any("start" in x for x in lines)


def test_an_index_through_rounding_keeps_the_gather():
    """A non-integer constant (float32 in the kernel, float64 here) could round the two apart at an integer's
    edge, and a cast to 16 bits rounds large integers: neither is ranged."""
    assert block_ranges(_writer(), (distance(0.1),)) is None
    assert block_ranges(_writer(), (ir.cast("f16", ir.bin("sub", ir.axis("i"), ir.axis("j"))),)) is None
    assert block_ranges(_writer(), (ir.un("exp", ir.axis("i")),)) is None
