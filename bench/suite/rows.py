"""Row reductions beyond attention: the kernels the compiler derives for LayerNorm, softmax, log-softmax and
cross-entropy, beside eager torch, torch.compile of the same math and Liger-kernel's Triton kernels where it has
the op.

    python -m bench.suite.rows --generate                  # with the compiler: bench/generated/rows/
    python -m bench.suite.rows [--out DIR] [--ops layernorm_fp16,softmax]   # on the GPU: table, JSON and PNG
    python -m bench.suite.rows --sweep [--ops ...]         # each module over a grid of block sizes, warps, stages

Each system's forward is timed alone (median of triton.testing.do_bench) and reported in GB/s of the bytes the
op must move (inputs read once, output written once), and every output is checked against float64 first: a
system whose output is wrong is reported as such and not timed. LayerNorm also runs on rows offset far from zero,
where a one-pass E[x^2] - E[x]^2 would lose its precision.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from bench import common

GENERATED = common.GENERATED / "rows"
EPS = 1e-5


@dataclass
class Op:
    spec: str                 # the spec file in specs/
    dtype: str | None         # retype the spec's 16-bit tensors (None: as written)
    shapes: tuple             # (rows, row length)
    inputs: Callable          # (R, N, gen) -> tensors in the spec's order
    math: Callable            # the plain math, for eager and torch.compile
    liger: Callable | None = None
    tol: float = 2e-2
    shape: str | None = None  # the sizes the plan is chosen for (optimize --shape), else the spec's typical ones
    plan: str | None = None   # a forced plan family (optimize --plan), to time it beside the chosen one


def _layernorm_inputs(dtype, offset=0.0):
    def make(R, N, g):
        x = (torch.randn(R, N, generator=g, device="cuda") * 2 + offset).to(dtype)
        return x, torch.randn(N, generator=g, device="cuda").to(dtype), torch.randn(N, generator=g, device="cuda").to(dtype)
    return make


def _layernorm_math(x, w, b):
    acc = torch.promote_types(x.dtype, torch.float32)   # fp32 statistics, float64 for the reference
    xf = x.to(acc)
    mean = xf.mean(-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + EPS) * w.to(acc) + b.to(acc)).to(x.dtype)


def _liger_layernorm(x, w, b):
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    return LigerLayerNormFunction.apply(x, w, b, EPS)


def _logits(R, N, g):
    return (torch.randn(R, N, generator=g, device="cuda") * 3,)


def _labelled(R, N, g):
    return torch.randn(R, N, generator=g, device="cuda") * 3, torch.randint(0, N, (R,), generator=g, device="cuda").float()


def _cross_entropy_math(x, target):
    return torch.logsumexp(x, -1) - x.gather(1, target.long()[:, None])[:, 0]


def _hidden_states(R, N, g, hidden=4096):
    h = (torch.randn(R, hidden, generator=g, device="cuda") * 0.05).half()
    w = (torch.randn(N, hidden, generator=g, device="cuda") * 0.05).half()
    return h, w, torch.randint(0, N, (R,), generator=g, device="cuda").float()


def _linear_cross_entropy_math(h, w, target):
    acc = torch.promote_types(h.dtype, torch.float32)
    return F.cross_entropy((h @ w.T).to(acc), target.long(), reduction="none")


def _liger_linear_cross_entropy(h, w, target):
    """Liger's fused linear cross-entropy: its forward also computes the input's gradient (it is built for a
    training step), and it returns the mean loss."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    loss = LigerFusedLinearCrossEntropyFunction.apply(h, w, target.long())
    return loss[0] if isinstance(loss, tuple) else loss   # (loss, z-loss) in some versions


def _matrices(R, N, g, cols=4096):
    """R matrices of N // cols x cols, for a softmax over each whole matrix (two long axes jointly)."""
    return ((torch.randn(R, N // cols, cols, generator=g, device="cuda") * 3).half(),)


def _joint_softmax_math(x):
    acc = torch.promote_types(x.dtype, torch.float32)
    return torch.softmax(x.to(acc).flatten(1), -1).view_as(x).to(x.dtype)


OPS = {
    "layernorm_fp16": Op("layernorm", None, ((8192, 4096), (4096, 16384)), _layernorm_inputs(torch.float16),
                         _layernorm_math, _liger_layernorm),
    "layernorm_bf16": Op("layernorm", "bf16", ((8192, 4096), (4096, 16384)), _layernorm_inputs(torch.bfloat16),
                         _layernorm_math, _liger_layernorm, tol=1.5e-1),
    "layernorm_offset_fp16": Op("layernorm", None, ((8192, 4096),), _layernorm_inputs(torch.float16, 300.0),
                                _layernorm_math, _liger_layernorm),
    "softmax": Op("softmax", None, ((4096, 32768),), _logits, lambda x: torch.softmax(x, -1), tol=1e-5),
    "log_softmax": Op("log_softmax", None, ((4096, 32768),), _logits, lambda x: torch.log_softmax(x, -1), tol=1e-4),
    "cross_entropy": Op("cross_entropy", None, ((4096, 131072),), _labelled, _cross_entropy_math, tol=1e-3),
    # tokens x vocabulary, hidden 4096: the logits h W^T (T x V) are never stored by ours or Liger's
    "linear_cross_entropy": Op("linear_cross_entropy", None, ((4096, 131072), (16384, 32768)), _hidden_states,
                               _linear_cross_entropy_math, _liger_linear_cross_entropy, tol=2e-2),
    # a few very long rows (sampling over a vocabulary, a norm of long rows): priced at 4 rows, the row statistics
    # run as stages split into chunks and the last kernel writes in parallel; beside it the one-kernel plan
    "softmax_few_rows": Op("softmax", None, ((4, 1 << 20), (16, 1 << 20)), _logits, lambda x: torch.softmax(x, -1),
                           tol=1e-5, shape="R=4,N=1048576"),
    "softmax_few_rows_one_kernel": Op("softmax", None, ((4, 1 << 20), (16, 1 << 20)), _logits,
                                      lambda x: torch.softmax(x, -1), tol=1e-5, shape="R=4,N=1048576", plan="rolled"),
    "log_softmax_few_rows": Op("log_softmax", None, ((4, 1 << 20), (16, 1 << 20)), _logits,
                               lambda x: torch.log_softmax(x, -1), tol=1e-4, shape="R=4,N=1048576"),
    "layernorm_few_rows": Op("layernorm", None, ((4, 1 << 20),), _layernorm_inputs(torch.float16), _layernorm_math,
                             _liger_layernorm, shape="R=4,N=1048576"),
    "layernorm_few_rows_one_kernel": Op("layernorm", None, ((4, 1 << 20),), _layernorm_inputs(torch.float16),
                                        _layernorm_math, _liger_layernorm, shape="R=4,N=1048576", plan="rolled"),
    # batches x (i x j): a softmax over each 4096 x 4096 matrix, run as stages (no one kernel loops over both)
    "joint_softmax": Op("joint_softmax", None, ((8, 4096 * 4096),), _matrices, _joint_softmax_math, tol=1e-3),
}


def module_path(op: Op) -> Path:
    shape = "_" + op.shape.replace(",", "_").replace("=", "") if op.shape else ""
    plan = f"_{op.plan}" if op.plan else ""
    return GENERATED / f"{op.spec}_{op.dtype or 'as_written'}{shape}{plan}.py"


def generate(names: list[str]) -> None:
    GENERATED.mkdir(parents=True, exist_ok=True)
    for op in {module_path(OPS[n]): OPS[n] for n in names}.values():
        cmd = ["neptune-eqsat", "optimize", str(common.SPECS / f"{op.spec}.py"), "-o", str(module_path(op))]
        cmd += ["--dtype", op.dtype] if op.dtype else []
        cmd += ["--shape", op.shape] if op.shape else []
        subprocess.run(cmd + (["--plan", op.plan] if op.plan else []), check=True)


def load(path: Path):
    return common.load_module(path, prefix="neptune_rows_")


def systems(op: Op) -> dict[str, Callable]:
    out = {"neptune": load(module_path(op)).forward, "eager": op.math,
           "inductor": torch.compile(op.math, dynamic=False)}
    if op.liger is not None:
        try:
            import liger_kernel  # noqa: F401
            out["liger"] = op.liger
        except ImportError:
            pass
    return out


def bench(names: list[str], warmup_ms: int, rep_ms: int) -> list[dict]:
    import triton.testing
    rows = []
    for name in names:
        op = OPS[name]
        calls = systems(op)
        for R, N in op.shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            inputs = op.inputs(R, N, g)
            ref = op.math(*(t.double() for t in inputs)).double()
            out_bytes = ref.numel() * (inputs[0].element_size() if ref.dim() == 2 else 4)
            nbytes = sum(t.numel() * t.element_size() for t in inputs) + out_bytes
            for system, fn in calls.items():
                row = dict(op=name, rows=R, length=N, system=system)
                try:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    held = torch.cuda.memory_allocated()
                    out = fn(*inputs)
                    torch.cuda.synchronize()
                    row["peak_extra_mb"] = (torch.cuda.max_memory_allocated() - held) / 2**20
                    if out.dim() == 0:   # a system that returns the mean loss (Liger's)
                        out, want = out.reshape(1), ref.mean().reshape(1)
                    else:
                        want = ref
                    err = (out.double() - want).abs().max().item()
                    row["max_error"] = err
                    if not err <= op.tol:
                        row["error"] = f"max error {err:.3g} > {op.tol}"
                    else:
                        ms = triton.testing.do_bench(lambda: fn(*inputs), warmup=warmup_ms, rep=rep_ms,
                                                     return_mode="median")
                        row.update(ms=ms, gbps=nbytes / ms / 1e6)
                except Exception as e:   # a system that cannot run the op is reported, not fatal
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
                print(row, flush=True)
            torch.cuda.empty_cache()
    return rows


def sweep(names: list[str], grid: dict) -> dict:
    """The median time of each generated module over a grid of its row and loop blocks, warps and stages, at each
    of its op's shapes: where the default config stands among them."""
    return {f"{name} {R}x{N}": sweep_shape(OPS[name], R, N, grid) for name in names for R, N in OPS[name].shapes}


def sweep_shape(op: Op, R: int, N: int, grid: dict) -> dict:
    import itertools

    import triton.testing
    module = load(module_path(op))
    inputs = op.inputs(R, N, torch.Generator(device="cuda").manual_seed(0))
    row, loop, *inner = (k for k in module.CONFIG if k.startswith("BLOCK_") and not isinstance(module.CONFIG[k], dict))
    times = {}
    for br, bj, warps, stages, bk in itertools.product(grid["rows"], grid["loop"], grid["warps"], grid["stages"],
                                                       grid["inner"] if inner else [0]):
        cfg = {**module.CONFIG, row: br, loop: bj, "num_warps": warps, "num_stages": stages,
               **{k: bk for k in inner}}
        try:
            times[(br, bj, warps, stages, bk)] = triton.testing.do_bench(
                lambda: module.forward(*inputs, config=cfg), warmup=5, rep=20, return_mode="median")
        except Exception:   # out of resources: not a candidate
            times[(br, bj, warps, stages, bk)] = float("inf")
    default = triton.testing.do_bench(lambda: module.forward(*inputs), warmup=5, rep=20, return_mode="median")
    best = sorted(times.items(), key=lambda kv: kv[1])[:5]
    print(op.spec, R, N, "default", round(default, 4), "best (row block, loop block, warps, stages, inner block):", best, flush=True)
    torch.cuda.empty_cache()
    return dict(shape=[R, N], default_ms=default, best=[[list(k), v] for k, v in best])


def table(rows: list[dict]) -> str:
    cases = sorted({(r["op"], r["rows"], r["length"]) for r in rows}, key=lambda c: (list(OPS).index(c[0]), c[1:]))
    names = [s for s in ("neptune", "eager", "inductor", "liger") if any(r["system"] == s for r in rows)]
    lines = ["| op | rows × length | " + " | ".join(f"{s} GB/s" for s in names) + " | neptune / inductor | "
             "neptune / liger |", "|---" * (len(names) + 4) + "|"]
    for op, R, N in cases:
        got = {r["system"]: r for r in rows if (r["op"], r["rows"], r["length"]) == (op, R, N)}
        cell = lambda s: f"{got[s]['gbps']:.0f}" if "gbps" in got.get(s, {}) else got.get(s, {}).get("error", "—")[:30]  # noqa: E731
        ratio = lambda s: (f"{got[s]['ms'] / got['neptune']['ms']:.2f}×"  # noqa: E731
                           if "ms" in got.get(s, {}) and "ms" in got.get("neptune", {}) else "—")
        lines.append(f"| {op} | {R} × {N} | " + " | ".join(cell(s) for s in names) +
                     f" | {ratio('inductor')} | {ratio('liger')} |")
    lines += ["", "Memory a call allocates beyond its inputs (MB, peak):", "",
              "| op | rows × length | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for op, R, N in cases:
        got = {r["system"]: r for r in rows if (r["op"], r["rows"], r["length"]) == (op, R, N)}
        lines.append(f"| {op} | {R} × {N} | " + " | ".join(
            f"{got[s]['peak_extra_mb']:.0f}" if "peak_extra_mb" in got.get(s, {}) else "—" for s in names) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cases = sorted({(r["op"], r["rows"], r["length"]) for r in rows}, key=lambda c: (list(OPS).index(c[0]), c[1:]))
    names = [s for s in ("neptune", "eager", "inductor", "liger") if any(r["system"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    width = 0.8 / len(names)
    for k, s in enumerate(names):
        vals = [next((r.get("gbps", 0) for r in rows if (r["op"], r["rows"], r["length"]) == c and r["system"] == s), 0)
                for c in cases]
        ax.bar([i + k * width for i in range(len(cases))], vals, width, label=s)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([f"{o}\n{R}×{N}" for o, R, N in cases], fontsize=7)
    ax.set_ylabel("GB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", action="store_true", help="write the kernel modules (needs the compiler)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--out", default=None, help="default $OUT, else bench/results/<gpu>/<date>-rows")
    ap.add_argument("--sweep", action="store_true", help="time each module over a grid of its configs")
    for key, default in (("rows", "1,4,16"), ("loop", "512,1024,2048"), ("warps", "4,8"), ("stages", "1,3"),
                         ("inner", "32,64")):
        ap.add_argument(f"--sweep-{key}", default=default, help=f"the sweep's {key} values")
    ap.add_argument("--warmup-ms", type=int, default=25)
    ap.add_argument("--rep-ms", type=int, default=100)
    args = ap.parse_args()
    if args.generate:
        generate(args.ops.split(","))
        return
    gpu = common.gpu_name()
    import triton
    info = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__)
    out = Path(args.out) if args.out else common.default_out("rows")
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        (out / "sweep.json").write_text(json.dumps(dict(info=info, ops=sweep(args.ops.split(","), {k: [int(v) for v in getattr(args, f"sweep_{k}").split(",")]
                                                                       for k in ("rows", "loop", "warps", "stages", "inner")})), indent=1))
        return
    rows = bench(args.ops.split(","), args.warmup_ms, args.rep_ms)
    (out / "results.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    md = f"{gpu}, torch {info['torch']}, Triton {info['triton']}; GB/s of inputs read once and output written once\n\n"
    md += table(rows) + "\n"
    (out / "results.md").write_text(md)
    plot(rows, out / "results.png")
    print(md)


if __name__ == "__main__":
    main()
