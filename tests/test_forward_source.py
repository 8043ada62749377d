"""The generated forward is short: the launch runtime (shipped in the package and copied into each module) checks
the inputs against the module's INPUTS table and chooses the config; forward keeps only the replay fast path, one
call to the runtime's _setup and its own launches."""
import inspect

import pytest
import torch

from conftest import SPECS, compiled
from neptune_eqsat.runtime import launch


def preamble(mod) -> list[str]:
    """forward's lines up to and including its setup, without the def line and the docstring."""
    lines = inspect.getsource(mod.forward).splitlines()
    return lines[2:next(n for n, line in enumerate(lines) if "_setup(" in line) + 1]


@pytest.mark.parametrize("name", ["softmax", "alibi_dc"])
def test_forward_is_short_whatever_the_number_of_inputs(name):
    _, mod = compiled(str(SPECS / f"{name}.py"))
    source = inspect.getsource(mod.forward)
    assert len(source.splitlines()) <= 45
    assert len(preamble(mod)) == 7   # the replay fast path (5 lines), compiling ahead and the setup, for 1 input as for 4
    assert "_bind(" not in source and "_tuned_config" not in source and "CPU tensors" not in source
    assert f"_setup(INPUTS, CONFIG, INTERPRETER_CONFIG, TUNED, TUNED_FOR, ({', '.join(mod.INPUTS)},), config)" in source


def test_bind_errors_name_the_input_of_a_module_with_four():
    _, mod = compiled(str(SPECS / "alibi_dc.py"))
    assert list(mod.INPUTS) == ["q", "k", "v", "slope"]
    q, k, v = (torch.zeros(1, 32, n, 128, dtype=torch.float16) for n in (2, 9, 9))
    slope = torch.zeros(32)
    with pytest.raises(TypeError, match=r"slope: expected dtype torch.float32, got torch.float16"):
        mod.forward(q, k, v, slope.half())
    with pytest.raises(ValueError, match=r"slope: dimension 0 must be 32, got 8"):
        mod.forward(q, k, v, slope[:8])
    with pytest.raises(ValueError, match=r"v: dimension 2 is SKV = 8, but another input has SKV = 9"):
        mod.forward(q, k, v[:, :, :8], slope)
    with pytest.raises(ValueError, match=r"slope: expected 1 dimensions \[32\], got shape \(1, 32\)"):
        mod.forward(q, k, v, slope[None])
    with pytest.raises(TypeError, match=r"q: expected a torch.Tensor, got NoneType"):
        mod.forward(None, k, v, slope)


def test_setup_binds_from_the_inputs_table_and_layers_the_config(monkeypatch):
    monkeypatch.setattr(launch, "_INTERPRETED", True)   # CPU tensors, as under the interpreter
    inputs = {"x": ("float32", ("R", 4)), "w": ("float32", (4,))}
    x, w = torch.zeros(3, 4), torch.zeros(4)
    sizes, device, cfg, rec = launch._setup(inputs, {"BLOCK": 64, "num_warps": 4}, {"BLOCK": 8, "num_warps": 1},
                                            {"GPU": {"R=4": {"BLOCK": 128}}}, "GPU", (x, w), {"num_warps": 2})
    assert sizes == {"R": 3} and device == x.device and rec is None
    assert cfg == {"BLOCK": 8, "num_warps": 2}   # the interpreter's config on the CPU, the caller's over it
    assert launch._measured_config({"GPU": {"R=4": {"BLOCK": 128}}}, "GPU", "Other", "R=4") == {"BLOCK": 128}
    with pytest.raises(ValueError, match=r"w: dimension 0 must be 4, got 5"):
        launch._setup(inputs, {}, {}, {}, "", (x, torch.zeros(5)), None)
