"""The backward pass of the six prefill operators: the kernels `optimize --backward` derives from each spec,
beside FlexAttention's backward, SDPA's cuDNN and flash backward where they express the op, and torch.compile of
the plain math.

    python -m bench.suite.backward --generate [--dtype bf16]        # with the compiler: bench/generated/backward/
    python -m bench.suite.backward --seqs 4096,16384 [--dtype bf16]  # on the GPU: table and JSON in --out
    python -m bench.suite.backward --breakdown --ops causal_pf --seqs 16384   # each kernel of ours timed alone
    python -m bench.suite.backward --systems neptune,neptune_before,flex --before DIR   # a change, in one run
    NEPTUNE_EQSAT_CACHE=bench/flex_cache python -m bench.suite.backward --systems neptune_api,flex   # the API

Each system's backward alone is timed (the forward runs once; torch's systems call autograd.grad on the kept
graph; neptune's module calls backward(q, k, v, out=, grad_out=, saved=) with the row values its forward_saved
wrote, as FlexAttention's backward reads the forward's logsumexp). Every system computes the gradients of q, k
and v: the modules are generated with `--wrt q,k,v`, so ALiBi's slopes are a captured tensor without a gradient,
as the other systems take them (`optimize --backward` alone also derives the slopes' gradient). Throughput counts 2.5 times the forward's useful FLOPs. Our gradients are checked against float64
autograd of the plain math on the first group of heads (every query head of KV head 0). `neptune_api` times
neptune_eqsat.flex_attention's backward with the backward it chooses on the GPU, `neptune_api_deterministic`
with torch asked for deterministic algorithms (the two passes); a GPU without the compiler runs them from a
cache filled by `bench.tools.flex_cache --backward`.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

import torch

from bench import common
from bench.suite.attention import D, OPS, Case, alibi_slopes, attention_math, flex_args, load_module, work

PREFILL = [name for name, op in OPS.items() if op.mode == "prefill"]
GENERATED = common.GENERATED / "backward"
SYSTEMS = ("neptune", "neptune_atomic", "neptune_before", "neptune_api", "neptune_api_deterministic", "flex",
           "sdpa_cudnn", "sdpa_flash", "inductor")
MODULES = ("neptune", "neptune_atomic", "neptune_before")   # the systems that time a generated module
TOL = {"fp16": 3e-2, "bf16": 1e-1}


def module_path(name: str, dtype: str, system: str = "neptune", before: str | None = None) -> Path:
    """The generated module of an op: neptune's default backward, neptune_atomic's (--atomic), or
    neptune_before's (the same name in the folder `before`, --before: a change measured in one run)."""
    if system == "neptune_before" and before is None:
        raise ValueError("neptune_before times the modules of --before DIR: give the folder")
    folder = Path(before) if system == "neptune_before" else GENERATED
    return folder / f"{name}_{dtype}{'_atomic' if system == 'neptune_atomic' else ''}.py"


def generate(dtype: str, ops: list[str]) -> None:
    GENERATED.mkdir(parents=True, exist_ok=True)
    for name in ops:
        for system in ("neptune", "neptune_atomic"):
            out = module_path(name, dtype, system)
            cmd = ["neptune-eqsat", "optimize", str(common.SPECS / f"{name}.py"), "--backward", "--wrt", "q,k,v",
                   "-o", str(out)]
            cmd += ["--dtype", "bf16"] if dtype == "bf16" else []
            cmd += ["--atomic"] if system == "neptune_atomic" else []
            subprocess.run(cmd, check=True)


def module_call(path, S: int, dtype: str, heads: int, kv_heads: int | None = None, warm: int = 5):
    """A call of a generated backward module's backward(q, k, v, out=, grad_out=, saved=) on random inputs
    (B = 1, D = 128), its forward_saved run once and the call run `warm` times; returns (module, call)."""
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    module = load_module(path)
    q = torch.randn(1, heads, S, D, device="cuda", dtype=dt)
    k, v = (torch.randn(1, kv_heads or heads, S, D, device="cuda", dtype=dt) for _ in range(2))
    out, saved = module.forward_saved(q, k, v)
    grad = torch.randn_like(out)

    def call():
        return module.backward(q, k, v, out=out, grad_out=grad, saved=saved)
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    return module, call


def profiled(call, label: str, calls: int = 10):
    """`calls` calls under the torch profiler; prints the GPU, `label` and each kernel's time. Returns the
    profiler (its events: the kernels on a timeline)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    print(torch.cuda.get_device_name(), label)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    return prof


def grads_of(fn, inputs, grad):
    """A call running the backward of fn's graph (built once) with autograd.grad."""
    out = fn()
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


def api_step(op, q, k, v, slopes, grad, deterministic: bool):
    """neptune_eqsat.flex_attention's backward (its forward run once): the one pass or the two passes it
    chooses on this GPU, or the two passes where torch is asked for deterministic algorithms."""
    from bench.suite.attention_systems import api_callables, import_package
    mod, mask = api_callables(op, slopes, 0)
    package = import_package()
    api = package.flex_attention
    step = grads_of(lambda: api(q, k, v, score_mod=mod, mask_mod=mask, enable_gqa=op.hq != op.hkv), (q, k, v), grad)

    def call():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        try:
            return step()
        finally:
            torch.use_deterministic_algorithms(False)
    call()
    package.wait_for_compiles()   # a first call's quick kernels give way to the tuned ones, compiled meanwhile
    return call


def system_call(name, op, module, q, k, v, slopes, grad):
    import torch.nn.functional as F
    gqa = op.hq != op.hkv
    if name in MODULES:
        args = (q, k, v, slopes) if op.mod == "alibi" else (q, k, v)
        plain = [t.detach() for t in args]
        out, saved = module.forward_saved(*plain)   # as a training step's forward: the row values too
        return lambda: module.backward(*plain, out=out, grad_out=grad, saved=saved)
    if name.startswith("neptune_api"):
        return api_step(op, q, k, v, slopes, grad, name.endswith("deterministic"))
    if name == "flex":
        from torch.nn.attention.flex_attention import flex_attention
        mod, block_mask, _ = flex_args(Case(op, q, k, v, slopes, "cuda"))
        torch._dynamo.reset()   # a fresh compile per shape: past the recompile limit dynamo falls back to eager
        compiled = torch.compile(flex_attention, dynamic=False)
        return grads_of(lambda: compiled(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa),
                        (q, k, v), grad)
    if name.startswith("sdpa"):
        if op.mod is not None or op.mask not in (None, "causal"):
            return None
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[name]

        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=op.mask == "causal", enable_gqa=gqa)
        return grads_of(call, (q, k, v), grad)
    if name == "inductor":
        compiled = torch.compile(lambda q, k, v: attention_math(op, q, k, v, slopes), dynamic=False)
        return grads_of(lambda: compiled(q, k, v), (q, k, v), grad)
    raise ValueError(name)


def check(op, ours, q, k, v, slopes, grad, dtype) -> float:
    """Largest error of our gradients (`ours`, of q, k, v) relative to their scale, against float64 autograd on
    heads of KV head 0; beyond 4096 keys (where that reference would not fit), dQ of the last 256 query rows of
    query head 0."""
    group = op.hq // op.hkv
    hq, hkv = (group, 1) if group > 1 else (2, 2)
    S = q.shape[2]
    rows = slice(0, S) if S <= 4096 else slice(S - 256, S)
    hq, hkv, names = (hq, hkv, 3) if S <= 4096 else (1, 1, 1)
    ref = [t.detach()[:, :n].double().requires_grad_() for t, n in ((q, hq), (k, hkv), (v, hkv))]
    q_rows = ref[0][:, :, rows]
    expect = attention_math(op, q_rows, ref[1], ref[2], slopes[:hq].double(), q_offset=rows.start)
    expect.backward(grad[:, :hq, rows].double())
    worst = 0.0
    for got, r, n in list(zip(ours[:3], ref, (hq, hkv, hkv)))[:names]:
        want = r.grad[:, :, rows] if r is ref[0] else r.grad
        got = got[:, :n, rows] if r is ref[0] else got[:, :n]
        scale = max(1.0, want.abs().max().item())
        err = (got.double() - want).abs().max().item() / scale
        worst = max(worst, err if not math.isnan(err) else math.inf)   # max() alone passes a NaN over
    if worst > TOL[dtype]:
        raise AssertionError(f"{op.name}: gradients off by {worst:.3g} (relative), tolerance {TOL[dtype]}")
    return worst


def run(args) -> list[dict]:
    import triton.testing
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for name in args.ops.split(","):
        op = OPS[name]
        systems = args.systems.split(",")
        ours = {system: load_module(module_path(name, args.dtype, system, args.before)) if system in MODULES else None
                for system in systems if system.startswith("neptune")}
        for S in (int(s) for s in args.seqs.split(",")):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(1, h, S, D, device="cuda", dtype=dt, generator=g).requires_grad_()
                       for h in (op.hq, op.hkv, op.hkv))
            slopes = alibi_slopes(op.hq, "cuda")
            grad = torch.randn(1, op.hq, S, D, device="cuda", dtype=dt, generator=g)
            flops = 2.5 * work(op, 1, S, S)[0]
            errors = {system: check(op, system_call(system, op, module, q, k, v, slopes, grad)(), q, k, v, slopes,
                                    grad, args.dtype) for system, module in ours.items()}
            for system in systems:
                module = ours.get(system)
                row = {"op": name, "S": S, "dtype": args.dtype, "system": system}
                try:
                    call = system_call(system, op, module, q, k, v, slopes, grad)
                    if call is None:
                        continue
                    ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
                    row.update(ms=ms, tflops=flops / ms / 1e9)
                    if system in errors:
                        row["max_rel_error"] = errors[system]
                    if module is not None:
                        # what a training step's forward costs: the output alone, and with the saved values
                        plain = [t.detach() for t in ((q, k, v, slopes) if op.mod == "alibi" else (q, k, v))]
                        row["forward_ms"] = triton.testing.do_bench(lambda: module.forward(*plain), warmup=20,
                                                                    rep=100, return_mode="median")
                        row["forward_saved_ms"] = triton.testing.do_bench(lambda: module.forward_saved(*plain),
                                                                          warmup=20, rep=100, return_mode="median")
                except Exception as e:   # a system that fails (out of memory, no kernel) is a row saying so
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def breakdown(args) -> None:
    """The time of each kernel module of our backward (stages and gradient kernels), and the host's part."""
    import time
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    for name in args.ops.split(","):
        op = OPS[name]
        module = load_module(module_path(name, args.dtype))
        S = int(args.seqs.split(",")[0])
        q, k, v = (torch.randn(1, h, S, D, device="cuda", dtype=dt) for h in (op.hq, op.hkv, op.hkv))
        args_ = (q, k, v, alibi_slopes(op.hq, "cuda")) if op.mod == "alibi" else (q, k, v)
        out, saved = module.forward_saved(*args_)
        grad = torch.randn_like(out)
        times: dict[str, list[float]] = {}
        run_one = module._run

        def timed(kernel, t, reads):
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = run_one(kernel, t, reads)
            torch.cuda.synchronize()
            times.setdefault(kernel, []).append((time.perf_counter() - start) * 1e3)
            return result
        module._run = timed
        for _ in range(4):
            torch.cuda.synchronize()
            start = time.perf_counter()
            module.backward(*args_, out=out, grad_out=grad, saved=saved)
            torch.cuda.synchronize()
            total = (time.perf_counter() - start) * 1e3
        module._run = run_one
        parts = ", ".join(f"{k} {min(v):.3f}" for k, v in times.items())
        print(f"{name} S={S}: backward {total:.3f} ms; kernels (ms): {parts}", flush=True)


def table(rows: list[dict]) -> str:
    shapes = sorted({(r["op"], r["S"]) for r in rows}, key=lambda x: (PREFILL.index(x[0]), x[1]))
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    ours = [s for s in systems if s.startswith("neptune")]
    lines = ["| op | S | " + " | ".join(systems) + "".join(f" | {s} / flex" for s in ours) + " |",
             "|---|---|" + "---|" * (len(systems) + len(ours))]
    for op, S in shapes:
        got = {r["system"]: r for r in rows if (r["op"], r["S"]) == (op, S)}
        cells = [f"{got[s]['tflops']:.0f}" if "tflops" in got.get(s, {}) else ("fail" if s in got else "-")
                 for s in systems]
        ratios = [got[s]["tflops"] / got["flex"]["tflops"] if "tflops" in got.get(s, {}) and
                  "tflops" in got.get("flex", {}) else math.nan for s in ours]
        lines.append(f"| {op} | {S} | " + " | ".join(cells + [f"{r:.2f}" for r in ratios]) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generate", action="store_true")
    p.add_argument("--breakdown", action="store_true", help="time each kernel module of our backward")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--ops", default=",".join(PREFILL))
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s != "neptune_before"))
    p.add_argument("--before", default=None, help="folder of modules to time as neptune_before (add it to --systems)")
    p.add_argument("--out", default=None, help="default $OUT, else bench/results/<gpu>/<date>-backward")
    args = p.parse_args()
    if args.generate:
        generate(args.dtype, args.ops.split(","))
        return
    if args.breakdown:
        breakdown(args)
        return
    gpu = common.gpu_name()
    rows = run(args)
    text = f"backward TFLOP/s (2.5x forward FLOPs), {gpu}, torch {torch.__version__}, {args.dtype}, B=1, D={D}\n\n"
    text += table(rows)
    print(text)
    out = Path(args.out) if args.out else common.default_out("backward")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"backward_{args.dtype}.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__,
                                                                 "rows": rows}, indent=1))
    (out / f"backward_{args.dtype}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
