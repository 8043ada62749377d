"""neptune-eqsat: optimize a spec into a fused Triton kernel module, check it, and inspect the rules.

Each command imports the stages it runs when it runs, so that `--help` and the light commands start without
loading egglog, torch or triton (the one place the package imports inside functions)."""
from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import click

from neptune_eqsat.frontend.spec import SpecError


def _sizes(text: str | None) -> dict[str, int]:
    """--shape NAME=INT,...: each name once, each size positive."""
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(",")):
        name, _, value = (x.strip() for x in part.partition("="))
        if not name or not value.lstrip("-").isascii() or not value.lstrip("-").isdigit():   # ASCII digits only
            raise click.BadParameter(f"{part!r}: expected NAME=INT, e.g. B=1,S=4096", param_hint="--shape")
        if name in out:
            raise click.BadParameter(f"{name} is given twice", param_hint="--shape")
        if int(value) <= 0:
            raise click.BadParameter(f"{name}={value}: sizes must be positive", param_hint="--shape")
        out[name] = int(value)
    return out


def _spec_sizes(spec, sizes: dict[str, int], every: bool) -> dict[str, int]:
    """`sizes` checked against the spec's dims: no unknown name and, when `every`, none missing."""
    from neptune_eqsat.frontend.spec_checks import unknown_dims

    dims = list(spec.dims_)
    if problem := unknown_dims(spec, sizes):
        raise click.BadParameter(problem, param_hint="--shape")
    missing = [n for n in dims if n not in sizes]
    if every and missing:
        raise click.BadParameter(f"no size for dim {', '.join(missing)} of spec {spec.name} (dims: "
                                 f"{', '.join(dims)})", param_hint="--shape")
    return sizes


def _load(spec_file: str, dtype: str | None = None):
    from neptune_eqsat.frontend.spec import load_spec
    try:
        spec = load_spec(spec_file)
        return spec.retyped(dtype) if dtype else spec
    except SpecError as e:
        raise click.ClickException(str(e)) from e


def _writable(output: str) -> None:
    """Refuse, before anything compiles, an output path that cannot be written: its nearest existing folder is a
    file, or one this user cannot write in."""
    path = Path(output).resolve()
    above = path.parent
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise click.BadParameter(f"cannot write {output}: {above} is a file, not a folder", param_hint="-o")
    if not os.access(above, os.W_OK):
        raise click.BadParameter(f"cannot write {output}: no permission to write in {above}", param_hint="-o")


def _write(output: str, text: str) -> None:
    """Write `output` through a temporary file of its own beside it (nothing else in the folder is touched),
    with the permissions a new file gets (the umask's; an existing file's own where it is replaced)."""
    folder = Path(output).resolve().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{Path(output).name}.", suffix=".tmp")
    except OSError as e:
        raise click.ClickException(f"cannot write {output}: {e.strerror}") from e
    umask = os.umask(0)
    os.umask(umask)
    mode = Path(output).stat().st_mode & 0o777 if Path(output).is_file() else 0o666 & ~umask
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, output)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {output}: {e.strerror}") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


DEVICE_HELP = ("Device to price plans for and whose measured plan times to use (tuning database, "
               "NEPTUNE_EQSAT_TUNING_DB): h100, h200, a GPU name from a device profile (e.g. \"NVIDIA H100 80GB "
               "HBM3\"), and/or FIELD=VALUE (sms, bandwidth, ...; name=GPU to read that GPU's measurements); "
               "default: the GPU here, else h100.")


def _device(text: str | None):
    from neptune_eqsat.plan.cost import parse_device

    try:
        return parse_device(text) if text else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--device") from e


class _Commands(click.Group):
    """The commands, a mistake in the rule files (a rule declared twice) reported as a one-line error."""

    def invoke(self, ctx):
        from neptune_eqsat.proof.rulebook import RuleDeclarationError
        try:
            return super().invoke(ctx)
        except RuleDeclarationError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Commands)
def main() -> None:
    """Equality-saturation superoptimizer for chains of reductions (attention, softmax, norms)."""


@main.command()
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where to write the generated module.")
@click.option("--explain", is_flag=True, help="Print rules fired, e-graph size and time, candidate plans, choice.")
@click.option("--shape", default=None, help="Sizes used to price plans, e.g. B=1,S=16384 (defaults: the spec's).")
@click.option("--max-nodes", default=20_000, show_default=True, type=click.IntRange(min=1), help="E-graph node limit.")
@click.option("--max-seconds", default=20.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Saturation time limit.")
@click.option("--dtype", type=click.Choice(["f16", "bf16", "f32"]), default=None,
              help="Compile the spec with its 16-bit inputs, casts and output in this dtype.")
@click.option("--device", "device_text", default=None, help=DEVICE_HELP)
@click.option("--plan", default=None, help="Generate this plan family (rolled, unfused, split, ...+packed) instead "
                                           "of the best, e.g. to time it with tune.")
@click.option("--backward", is_flag=True, help="Also derive the backward pass and emit its kernels in the same "
                                               "module, with backward(*inputs, out=, grad_out=).")
@click.option("--atomic", is_flag=True, help="With --backward: a kernel whose loop runs over another's rows adds "
                                             "its gradients into that kernel's atomically (dQ beside dK and dV; "
                                             "not deterministic).")
@click.option("--wrt", default=None, help="With --backward: the inputs to differentiate with respect to, "
                                          "comma-separated (default: every floating input the output reads).")
def optimize(spec_file: str, output: str | None, explain: bool, shape: str | None, max_nodes: int,
             max_seconds: float, dtype: str | None, device_text: str | None, plan: str | None,
             backward: bool, atomic: bool, wrt: str | None) -> None:
    """Optimize SPEC_FILE and write the fused kernel module."""
    from neptune_eqsat.compiler import PlanError, optimize as run
    from neptune_eqsat.plan.saturate import Limits

    spec = _load(spec_file, dtype)
    sizes = _spec_sizes(spec, _sizes(shape), every=False)
    names = _wrt(spec, wrt, backward, atomic)
    if output:
        _writable(output)
    try:
        result = run(spec, sizes=sizes, limits=Limits(max_nodes, max_seconds), spec_file=spec_file,
                     device=_device(device_text), out_file=output or "OUT.py", plan=plan)
    except (SpecError, PlanError) as e:
        raise click.ClickException(str(e)) from e
    if explain:
        click.echo(result.explain())
    if backward:
        result.source = _with_backward(result, sizes, Limits(max_nodes, max_seconds), explain, atomic, names)
    if output:
        _write(output, result.source)
        click.echo(f"wrote {output} ({result.summary()})")
    elif not explain:
        click.echo(result.source)


def _wrt(spec, wrt: str | None, backward: bool, atomic: bool) -> tuple[str, ...] | None:
    """The --wrt names, checked against the spec's inputs before anything compiles."""
    if (wrt or atomic) and not backward:
        raise click.UsageError("--wrt and --atomic go with --backward")
    if not wrt:
        return None
    names = tuple(n.strip() for n in wrt.split(",") if n.strip())
    unknown = [n for n in names if n not in spec.inputs]
    if unknown or not names:
        raise click.BadParameter(f"no input {', '.join(unknown) or repr(wrt)}; spec {spec.name} has inputs "
                                 f"{', '.join(spec.inputs)}", param_hint="--wrt")
    return names


def _with_backward(result, sizes: dict[str, int], limits, explain: bool, atomic: bool,
                   wrt: tuple[str, ...] | None = None) -> str:
    """The forward module's source with the derived backward's kernels beside it (codegen/backward_module.py)."""
    from neptune_eqsat.plan.autodiff import differentiate
    from neptune_eqsat.codegen.backward_module import module_source
    from neptune_eqsat.compiler import optimize as run

    try:
        bw = differentiate(result.spec, wrt, accumulate=atomic)
        sources = {}
        for key, sub in [(s.name, s.spec) for s in bw.stages] + [(k.spec.name, k.spec) for k in bw.kernels]:
            sub_sizes = {n: v for n, v in sizes.items() if n in sub.dims_}
            sources[key] = run(sub, sizes=sub_sizes, limits=limits, device=result.device,
                               spec_file=result.spec.name, out_file=key).source
        if bw.saved:   # the forward writing the saved values too, as a training step runs it
            try:
                sources["forward_saved"] = run(bw.forward_spec(), sizes=sizes, limits=limits, device=result.device,
                                               spec_file=result.spec.name, out_file="forward_saved").source
            except SpecError:   # a forward no one kernel runs with them (stages): the backward computes them
                pass
        source = module_source(result.spec, result.source, bw, sources)
    except SpecError as e:
        raise click.ClickException(str(e)) from e
    if explain:
        click.echo("\n".join(bw.explain()))
    return source


@main.command()
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--shape", required=True, help="Sizes to tune at, e.g. B=1,S=4096 (stored per power-of-two bucket).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the module with the tuned config.")
@click.option("--budget", default=60.0, show_default=True, help="Seconds of measuring at most.")
@click.option("--plan", default=None, help="Tune this plan family instead of the best one.")
def tune(spec_file: str, shape: str, output: str | None, budget: float, plan: str | None) -> None:
    """Measure SPEC_FILE's kernel tunables on this GPU, store the best config and time of its plan family in the
    tuning database, and (with -o) write the module with it. Later `optimize` runs for this GPU rank plans by
    the stored times and use the stored config."""
    if not _has_gpu():
        raise click.ClickException("tuning measures kernels on a GPU, and this machine has none")
    from neptune_eqsat.compiler import PlanError, optimize as run
    from neptune_eqsat.runtime.loader import load_module
    from neptune_eqsat.tune.database import db_path, random_inputs_for, tune_module

    sizes = _spec_sizes(_load(spec_file), _sizes(shape), every=False)
    try:
        result = run(spec_file, sizes=sizes, plan=plan)
    except (SpecError, PlanError) as e:
        raise click.ClickException(str(e)) from e
    kernels = result.kernels()   # a staged spec: each stage's spec and the last one's, tuned as specs of their own
    if len(kernels) > 1:
        click.echo(f"spec {result.spec.name} runs as {result.summary()}: tuning each of its {len(kernels)} kernels "
                   f"for {budget / len(kernels):g} s")
    for spec, part in kernels:
        mod, at = load_module(part.source, spec.name), {**spec.typical, **sizes}
        key, tuned = tune_module(mod, spec.name, at, random_inputs_for(mod, at), budget / len(kernels))
        click.echo(f"{key} [{part.chosen.family} plan]: best {tuned.best_ms:.4f} ms with {tuned.best}; before "
                   f"{tuned.default_ms:.4f} ms ({len(tuned.tried)} configs, {tuned.stopped}); stored in {db_path()}")
    if output:   # the plan just tuned, even if its measured time now ranks another plan first
        result = run(spec_file, sizes=sizes, out_file=output, plan=None if result.stages else result.chosen.family)
        _write(output, result.source)
        click.echo(f"wrote {output}")


@main.command()
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Devices file to write (default: NEPTUNE_EQSAT_DEVICES, else devices.json beside the tuning "
                   "database).")
def calibrate(out: str | None) -> None:
    """Measure the cost model's constants on this GPU (bandwidth, matrix, vector and transcendental rates, launch
    overhead) and store them as its device profile, which pricing then uses for this GPU."""
    if not _has_gpu():
        raise click.ClickException("calibration measures the GPU, and this machine has none")
    from neptune_eqsat.tune.calibrate import calibrate as run

    click.echo(run(out))


@main.command()
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--shape", required=True, help="Run-time sizes, e.g. B=1,S=45.")
@click.option("--seed", default=0, show_default=True)
def check(spec_file: str, shape: str, seed: int) -> None:
    """Run the generated kernel (GPU if there is one, else Triton's interpreter) against float64."""
    on_gpu = _has_gpu()
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    from neptune_eqsat.compiler import optimize as run
    from neptune_eqsat.runtime.loader import load_module
    from neptune_eqsat.frontend.reference import evaluate_all, random_inputs, tolerance

    sizes = _spec_sizes(_load(spec_file), _sizes(shape), every=True)
    # Triton's interpreter computes masked-off lanes too (0 / 0 there): numpy's warnings about them are noise
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.")
    try:
        result = run(spec_file)
        mod = load_module(result.source, result.spec.name)
        inputs = random_inputs(result.spec, sizes, seed, "cuda" if on_gpu else "cpu")
        outs = mod.forward(*inputs.values())
        refs = evaluate_all(result.spec, inputs)
    except SpecError as e:
        raise click.ClickException(str(e)) from e
    spec = result.spec
    outputs = [(spec.output_name, spec.output_dtype)] + [(o.name, o.dtype) for o in spec.also]
    failed = False
    for (name, dtype), out, ref in zip(outputs, outs if isinstance(outs, tuple) else (outs,), refs):
        err = (out.double().cpu() - ref).abs().max().item() if out.numel() else 0.0
        tol = tolerance(dtype)
        failed |= not err <= tol
        click.echo(f"{spec.name} {shape}: {name}: max |error| vs float64 = {err:.3g} (tolerance {tol:g}) on "
                   f"{'GPU' if on_gpu else 'the Triton interpreter'}")
    sys.exit(1 if failed else 0)


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


@main.group()
def rules() -> None:
    """The rewrite rules and their proofs."""


@rules.command("list")
def rules_list() -> None:
    """Name, family and meaning of every rule; rules whose proof fails are marked refused."""
    from neptune_eqsat.rules import ALL_RULES

    for r in ALL_RULES:
        status = "" if r.proof[1] else "  [refused: obligation not proved]"
        click.echo(f"{r.family:12s} {r.name:24s} {r.meaning}{status}")


def _select(names: tuple[str, ...]):
    from neptune_eqsat.rules import ALL_RULES

    unknown = set(names) - {r.name for r in ALL_RULES}
    if unknown:
        raise click.ClickException(f"unknown rule(s): {', '.join(sorted(unknown))}")
    return [r for r in ALL_RULES if not names or r.name in names]


@rules.command("check")
@click.argument("names", nargs=-1)
@click.option("--examples", default=200, show_default=True, type=click.IntRange(min=1),
              help="Random cases hypothesis tries per rule.")
def rules_check(names: tuple[str, ...], examples: int) -> None:
    """Prove each rule with sympy and test it on random values with hypothesis (all rules by default).

    A rule whose proof fails is refused (it never fires); a proved rule that fails numerically is an error."""
    from neptune_eqsat.proof.verdicts import reproving

    failed = False
    for r in _select(names):
        with reproving():   # proved now, not taken from the proofs kept on disk (and stored there)
            stmt, ok = r.prove()
        bad = r.counterexample(examples)
        if ok and bad is None:
            status = "ok      "
        elif not ok:
            status = "refused "
        else:
            status, failed = "ERROR   ", True
        click.echo(f"{status}{r.family:12s} {r.name}: {stmt}")
        if bad is not None:
            click.echo(f"         counterexample: {bad}")
    sys.exit(1 if failed else 0)


@rules.command("explain")
@click.argument("name")
def rules_explain(name: str) -> None:
    """A rule's meaning, its rewrite, its obligation and whether it holds."""
    (r,) = _select((name,))
    stmt, ok = r.proof
    click.echo(f"{r.name} ({r.family}): {r.meaning}")
    if r.example:
        click.echo(f"  example:  {r.example[0]}\n        ->  {r.example[1]}")
    for cmd in r.egglog():
        click.echo(f"  e-graph rule: {cmd}")
    click.echo(f"  obligation: {stmt}")
    click.echo(f"  proved by sympy: {'yes' if ok else 'no: the rule is refused and never fires'}")
    bad = r.counterexample()
    click.echo(f"  numeric check: {'passed' if bad is None else 'counterexample ' + bad}")


if __name__ == "__main__":
    main()
