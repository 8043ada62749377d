"""Kernels run under Triton's interpreter on the CPU: the variable must be set before triton is imported."""
import os

DEVICE = os.environ.get("NEPTUNE_TEST_DEVICE", "cpu")
if DEVICE == "cpu":   # NEPTUNE_TEST_DEVICE=cuda: the compiled kernels
    os.environ["TRITON_INTERPRET"] = "1"
import tempfile  # noqa: E402

os.environ["NEPTUNE_EQSAT_CACHE"] = tempfile.mkdtemp(prefix="neptune_eqsat_cache_")   # flex_attention's kernels
os.environ["NEPTUNE_EQSAT_PROOF_CACHE"] = tempfile.mkdtemp(prefix="neptune_eqsat_proofs_")   # proved afresh
os.environ["NEPTUNE_EQSAT_TUNING_DB"] = os.path.join(tempfile.mkdtemp(prefix="neptune_eqsat_tuning_"), "db.json")

import functools  # noqa: E402
import hashlib  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from neptune_eqsat.compiler import optimize  # noqa: E402
from neptune_eqsat.frontend.reference import evaluate, evaluate_all, random_inputs, tolerance  # noqa: E402
from neptune_eqsat.plan.autodiff import differentiate  # noqa: E402
from neptune_eqsat.runtime.loader import load_module  # noqa: E402
from neptune_eqsat.spec import load_spec  # noqa: E402
from neptune_eqsat.training import Differentiable  # noqa: E402

SPECS = Path(__file__).resolve().parent.parent / "specs"

# Random shapes per kernel test (2 by default; NEPTUNE_KERNEL_EXAMPLES=20 python -m pytest tests/test_kernels.py
# tests/test_split.py tries more): each example runs a shipped kernel under the interpreter.
KERNEL_EXAMPLES = int(os.environ.get("NEPTUNE_KERNEL_EXAMPLES", "2"))
FEW = settings(max_examples=KERNEL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@functools.lru_cache(maxsize=None)
def compiled(path: str):
    """(result, module) for a spec file, compiled once per test session."""
    result = optimize(path)
    return result, load_module(result.source, result.spec.name)


def spec_variant(tmp_path: Path, name: str, replace: dict[str, str]) -> str:
    """A copy of a shipped spec with some text replaced (e.g. a smaller window), as a new spec file."""
    text = (SPECS / f"{name}.py").read_text()
    for old, new in replace.items():
        assert old in text, f"{old!r} not in {name}.py"
        text = text.replace(old, new)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = tmp_path / f"{name}_{digest}.py"   # one file per variant: compiled() caches by path
    path.write_text(text)
    return str(path)


def on_device(forward, *tensors, **kwargs):
    """forward(*tensors) on the test device (the interpreter on CPU, the compiled kernels on a GPU), back on CPU."""
    return forward(*(t.to(DEVICE) for t in tensors), **kwargs).cpu()


def run_against_reference(path: str, sizes: dict[str, int], seed: int = 0, inputs=None):
    """Run the generated kernel and the float64 reference; return (output, reference, max error)."""
    result, mod = compiled(path)
    inputs = inputs or random_inputs(result.spec, sizes, seed)
    out = on_device(mod.forward, *inputs.values())
    ref = evaluate(result.spec, inputs)
    assert out.shape == ref.shape
    err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    return out, ref, err


def assert_close(path: str, sizes: dict[str, int], seed: int = 0, inputs=None):
    out, ref, err = run_against_reference(path, sizes, seed, inputs)
    assert not torch.isnan(out).any(), "NaN in kernel output"
    spec = load_spec(path)
    assert err <= tolerance(spec.output_dtype), f"{spec.name} {sizes}: max error {err}"
    return out, ref


def gradient_tolerance(spec) -> float:
    """A gradient is as precise as the least precise values it is computed from (fp16 probabilities reach an
    fp32 slope's gradient)."""
    return 4 * max(tolerance(t.dtype) for t in spec.inputs.values() if t.dtype in ("f16", "bf16", "f32"))


def check_gradients(spec, sizes: dict, dtype: str | None = None, seed: int = 0, deterministic: bool = True,
                    outputs: tuple[int, ...] | None = None) -> dict[str, float]:
    """The gradients Differentiable(spec) gives every floating input against float64 autograd of the spec's
    reference, for a random gradient of each output numbered in `outputs` (default: every output; the others
    take no part in the loss); asserts each within tolerance and returns the errors relative to the largest
    gradient (at least 1)."""
    if dtype:
        spec = spec.retyped(dtype)
    inputs = random_inputs(spec, {**spec.typical, **sizes}, seed=seed)
    xs = [t.clone().requires_grad_(t.is_floating_point() and n in differentiate(spec).wrt)
          for n, t in inputs.items()]
    outs = Differentiable(spec, deterministic)(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ref_in = {n: t.detach().clone().requires_grad_(x.requires_grad) for (n, t), x in zip(inputs.items(), xs)}
    refs = evaluate_all(spec, ref_in, differentiable=True)
    chosen = range(len(outs)) if outputs is None else outputs
    gen = torch.Generator().manual_seed(seed + 1)
    seeds = {k: torch.randn(outs[k].shape, dtype=torch.float64, generator=gen) for k in chosen}
    torch.autograd.backward([outs[k] for k in chosen], [seeds[k].to(outs[k].dtype) for k in chosen])
    torch.autograd.backward([refs[k] for k in chosen], [seeds[k] for k in chosen])
    allowed = gradient_tolerance(spec)
    errors = {}
    for (n, r), x in zip(ref_in.items(), xs):
        if not x.requires_grad:
            continue
        assert x.grad is not None and not torch.isnan(x.grad).any(), n
        ref = r.grad if r.grad is not None else torch.zeros_like(r)   # an input the chosen outputs do not read
        scale = max(1.0, ref.abs().max().item())
        errors[n] = (x.grad.double() - ref).abs().max().item() / scale
        assert errors[n] < allowed, (spec.name, n, errors[n])
    return errors
