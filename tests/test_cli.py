"""The command line: optimize with --explain, spec errors, and rule checking that catches planted bad rules."""
import importlib.util

import pytest
import torch
from click.testing import CliRunner

import neptune_eqsat.rules as rules_pkg
from neptune_eqsat.cli import main
from neptune_eqsat.proof.rulebook import Rule, evaluate_both, identity

from conftest import SPECS, compiled


def test_optimize_explain_writes_a_standalone_module(tmp_path):
    out = tmp_path / "softmax_kernel.py"
    res = CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "-o", str(out), "--explain"])
    assert res.exit_code == 0, res.output
    for part in ("e-graph:", "rules that fired", "roll-sum-mul", "h(t, r, r') = r'*t/r", "candidate plans",
                 "rolled", "unfused", "chosen: rolled",
                 "kernels: Triton only; no warp-specialized Gluon kernel: not a rolled pass over a loop axis"):
        assert part in res.output
    text = out.read_text()
    imports = {line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"concurrent.futures", "dataclasses", "functools", "math", "os", "threading", "types", "weakref",
                       "torch", "triton", "triton.language"}   # stdlib, torch, triton
    spec = importlib.util.spec_from_file_location("softmax_kernel", out)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_spec_error_is_reported_with_its_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from neptune_eqsat.spec import *\nspec = Spec('bad')\nN = spec.dims('N')\n"
                   "j = spec.axes(j=N)\nx = spec.input('x', f32, N)\nspec.output('y', f32, x[j, j], j)\n")
    res = CliRunner().invoke(main, ["optimize", str(bad)])
    assert res.exit_code != 0
    assert "bad.py:6: tensor x has 1 dimensions" in res.output


@pytest.mark.parametrize("names", [pytest.param(["exp-split", "roll-sum-mul", "roll-sum-add"], id="some_rules"),
                                   pytest.param([], id="every_rule", marks=pytest.mark.slow)])
def test_rules_check_passes_on_the_shipped_rules(names):
    """Rules proved afresh and checked on random values: a few here (a sound rule, a refused one), every rule in
    the slow pass (most of its time goes to shrinking the refused rules' counterexamples)."""
    res = CliRunner().invoke(main, ["rules", "check", *names, "--examples", "60"])
    assert res.exit_code == 0, res.output
    assert all(f" {r.name}: " in res.output for r in rules_pkg.ALL_RULES if r.name in names or not names)
    assert "ok      rolling      roll-sum-mul" in res.output
    assert "refused rolling      roll-sum-add" in res.output and "counterexample" in res.output


def test_rules_check_rejects_planted_unsound_rules(monkeypatch):
    unsound = identity("log-of-sum", "algebra", "planted: log(a + b) = log(a) + log(b)",
                       lambda o, a, b: o.un("log", o.bin("add", a, b)),
                       lambda o, a, b: o.bin("add", o.un("log", a), o.un("log", b)), 2)
    # a rule whose (wrong) proof claims success: only the numeric check can catch it
    lying = Rule("max-is-sum", "algebra", "planted: max(a, b) = a + b",
                 lambda: [], lambda: ("max(a, b) = a + b", True),
                 evaluate_both(lambda o, a, b: o.bin("max", a, b), lambda o, a, b: o.bin("add", a, b)), 2)
    monkeypatch.setattr(rules_pkg, "ALL_RULES", rules_pkg.ALL_RULES + [unsound, lying])
    res = CliRunner().invoke(main, ["rules", "check", "log-of-sum", "max-is-sum"])
    assert res.exit_code == 1
    assert "refused algebra      log-of-sum" in res.output
    assert "ERROR   algebra      max-is-sum" in res.output
    assert res.output.count("counterexample:") == 2


def test_rules_explain_shows_rewrite_and_obligation():
    res = CliRunner().invoke(main, ["rules", "explain", "roll-sum-div"])
    assert res.exit_code == 0
    assert "h(t, r, r') = r*t/r'" in res.output and "ETerm.roll" in res.output and "passed" in res.output
    assert "example:  sum(j, div(u[i, j]" in res.output and "-> " in res.output


def test_optimize_device_option_prices_for_the_named_device(tmp_path):
    res = CliRunner().invoke(main, ["optimize", str(SPECS / "causal_dc.py"), "--explain", "--device", "sms=8"])
    assert res.exit_code == 0, res.output
    assert "on 8 SMs" in res.output and "chosen: rolled" in res.output
    res = CliRunner().invoke(main, ["optimize", str(SPECS / "causal_dc.py"), "--device", "h300"])
    assert res.exit_code != 0 and "unknown device 'h300'" in res.output


def test_optimize_plan_forces_a_family_and_names_the_others_when_absent(tmp_path):
    out = tmp_path / "softmax_unfused.py"
    res = CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "--plan", "unfused", "-o", str(out),
                                    "--explain"])
    assert res.exit_code == 0, res.output
    assert "chosen: unfused" in res.output and "why: forced with --plan unfused" in res.output
    assert "the ranking's best: rolled analytic" in res.output
    assert "PLAN = 'unfused: 2 pass(es) over j" in out.read_text()
    res = CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "--plan", "split"])
    assert res.exit_code != 0
    assert "spec softmax has no 'split' plan; the plans extracted are: rolled, unfused" in res.output


def test_optimize_reads_the_measurements_of_the_named_gpu(tmp_path, monkeypatch):
    """On a machine without the GPU: --device names the GPU (its profile and its measurements), the environment
    names the tuning database."""
    import triton

    from neptune_eqsat.tune import database as tune

    monkeypatch.setenv("NEPTUNE_EQSAT_TUNING_DB", str(tmp_path / "tuning.json"))
    gpu, shape = "NVIDIA H100 80GB HBM3", {"B": 1, "Q": 1, "SKV": 32768}
    key = tune.db_key("causal_dc", shape, gpu, triton.__version__)
    tune.store_plan(key, "split", {"config": {"CHUNKS": 8}, "seconds": 80e-6})
    tune.store_plan(key, "rolled", {"config": {"BLOCK_J": 64}, "seconds": 50e-6})
    args = ["optimize", str(SPECS / "causal_dc.py"), "--shape", "SKV=32768", "--explain"]
    res = CliRunner().invoke(main, args + ["--device", gpu])
    assert res.exit_code == 0, res.output
    assert f"device: {gpu} (measured profile shipped with the package)" in res.output
    assert "measured plan times" in res.output and "rolled 50.0 us, split 80.0 us" in res.output
    assert "* rolled        measured      50.0 us" in res.output and "  unfused       analytic" in res.output
    assert "chosen: rolled" in res.output and "'BLOCK_J': 64" in res.output   # the module's CONFIG
    res = CliRunner().invoke(main, args + ["--device", "h200"])   # another GPU: its own (no) measurements
    assert res.exit_code == 0, res.output
    assert "chosen: split" in res.output and "measured      " not in res.output


# ---- a user's mistakes get one line and exit code 2 ------------------------------------------------------------
@pytest.mark.parametrize("command, message", [
    (["check", "softmax", "--shape", "R=5"], "no size for dim N"),
    (["check", "softmax", "--shape", "r=5,n=7"], "unknown dim r, n; spec softmax has dims R, N"),
    (["check", "softmax", "--shape", "R=0,N=3"], "R=0: sizes must be positive"),
    (["check", "softmax", "--shape", "R=3,N=-2"], "N=-2: sizes must be positive"),
    (["optimize", "softmax", "--shape", "R=0,N=0"], "R=0: sizes must be positive"),
    (["optimize", "softmax", "--shape", "X=5"], "unknown dim X"),
    (["optimize", "softmax", "--shape", "R=5,R=6"], "R is given twice"),
    (["optimize", "softmax", "--shape", "R=five"], "expected NAME=INT"),
    (["optimize", "softmax", "--max-nodes", "-1"], "--max-nodes"),
    (["optimize", "softmax", "--max-seconds", "0"], "--max-seconds"),
    (["optimize", "softmax", "--shape", "R=\u00b2"], "expected NAME=INT"),   # a digit, but not an ASCII one
    (["optimize", "softmax", "--device", "sms=0"], "device field sms: must be positive, got 0"),
    (["optimize", "softmax", "--device", "bandwidth=-3e12"], "device field bandwidth: must be positive"),
    (["rules", "check", "--examples", "0", "exp-split"], "--examples"),
    (["optimize", "softmax", "--backward", "--wrt", "x,y"], "no input y; spec softmax has inputs x"),
    (["optimize", "softmax", "--wrt", "x"], "--wrt and --atomic go with --backward"),
])
def test_a_users_mistake_is_one_line_and_exit_code_2(command, message):
    args = [str(SPECS / f"{a}.py") if a == "softmax" else a for a in command]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_output_touches_only_its_own_file(tmp_path):
    unrelated = tmp_path / "kernel.tmp"
    unrelated.write_text("someone else's file")
    result = CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "-o", str(tmp_path / "kernel.py")])
    assert result.exit_code == 0, result.output
    assert unrelated.read_text() == "someone else's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel.py", "kernel.tmp"]


def test_optimize_in_another_dtype(tmp_path):
    out = tmp_path / "causal_bf16.py"
    result = CliRunner().invoke(main, ["optimize", str(SPECS / "causal_pf.py"), "--dtype", "bf16", "-o", str(out)])
    assert result.exit_code == 0 and "rolled plan" in result.output
    assert "'q': ('bfloat16'" in out.read_text()


def test_generated_modules_name_a_wrong_input():
    _, mod = compiled(str(SPECS / "causal_pf.py"))
    q, k, v = (torch.randn(1, 32, 5, 128).half() for _ in range(3))
    with pytest.raises(TypeError, match=r"k: expected dtype torch.float16, got torch.float32"):
        mod.forward(q, k.float(), v)
    with pytest.raises(TypeError, match=r"v: expected a torch.Tensor, got list"):
        mod.forward(q, k, [1.0])
    with pytest.raises(ValueError, match=r"q: dimension 1 must be 32, got 4"):
        mod.forward(q[:, :4], k, v)
    with pytest.raises(ValueError, match=r"k: on device meta, but q is on cpu"):
        mod.forward(q, k.to("meta"), v)


def test_check_compares_every_output_of_a_spec(tmp_path):
    """A spec with two outputs (a softmax and its logsumexp): each is compared with float64 (before: the
    tuple the module returns was taken for one tensor)."""
    path = tmp_path / "softmax_lse.py"
    path.write_text("from neptune_eqsat.spec import *\nspec = Spec('softmax_lse')\nR, N = spec.dims(R=64, N=64)\n"
                    "r, j = spec.axes(r=R, j=N)\nx = spec.input('x', f32, R, N)\nm = max(j, x[r, j])\n"
                    "l = sum(j, exp(x[r, j] - m))\nspec.output('y', f32, exp(x[r, j] - m) / l, r, j)\n"
                    "spec.output('lse', f32, m + log(l), r)\n")
    result = CliRunner().invoke(main, ["check", str(path), "--shape", "R=3,N=7"])
    assert result.exit_code == 0, result.output
    assert "softmax_lse R=3,N=7: y: max |error|" in result.output and ": lse: max |error|" in result.output


def test_an_output_path_that_cannot_be_written_is_refused_before_compiling(tmp_path):
    a_file = tmp_path / "kernel.py"
    a_file.write_text("")
    result = CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "-o", str(a_file / "x.py")])
    assert result.exit_code == 2 and f"{a_file} is a file, not a folder" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_written_module_takes_the_usual_permissions(tmp_path):
    import os
    out = tmp_path / "kernel.py"
    umask = os.umask(0o022)
    try:
        assert CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "-o", str(out)]).exit_code == 0
        assert out.stat().st_mode & 0o777 == 0o644
        out.chmod(0o640)   # a file replaced keeps its own
        assert CliRunner().invoke(main, ["optimize", str(SPECS / "softmax.py"), "-o", str(out)]).exit_code == 0
        assert out.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_a_rule_declared_twice_is_a_one_line_error(monkeypatch):
    from neptune_eqsat.proof.rulebook import RuleDeclarationError

    def declared_twice():
        raise RuleDeclarationError("rule 'mul-commute' is declared twice (families algebra and algebra)")
    monkeypatch.setattr("neptune_eqsat.cli._select", lambda names: declared_twice())
    result = CliRunner().invoke(main, ["rules", "check", "exp-split"])
    assert result.exit_code == 1 and "Error: rule 'mul-commute' is declared twice" in result.output
    assert "Traceback" not in result.output


def test_the_api_checks_sizes_and_takes_a_device_by_name():
    from neptune_eqsat.compiler import optimize
    from neptune_eqsat.spec import SpecError
    spec = str(SPECS / "softmax.py")
    for sizes, message in (({"Q": 3}, "unknown dim Q; spec softmax has dims R, N"),
                           ({"R": 0}, "size R must be a positive int, got 0"),
                           ({"R": "7"}, "size R must be a positive int, got '7'")):
        with pytest.raises(SpecError, match=message):
            optimize(spec, sizes=sizes)
    assert optimize(spec, device="h200").device.name == "NVIDIA H200"   # a name, as --device takes it
