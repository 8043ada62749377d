#!/usr/bin/env python3
"""Neptune's generated attention kernels against the compilers and libraries, side by side on one CUDA GPU.

For every operator and shape: seeded fp16 inputs (D = 128), a float64 reference, then per system one call
whose output is checked (max abs error <= 2e-2; a wrong output is reported WRONG and not timed), then the
median time of triton.testing.do_bench. Prefill is reported in TFLOP/s of useful work 4*B*Hq*pairs*D
(pairs = unmasked (query, key) pairs), decode in GB/s of the Q, K, V and O bytes.

Systems: neptune (the generated module <op>.py, loaded from --modules), flex (FlexAttention compiled),
inductor (torch.compile of the plain math), sdpa_cudnn / sdpa_flash / sdpa_mem_eff (where SDPA can express the
operator: no score mod, no mask or causal), eager (the plain math, only when asked for).

Writes results.json, results.md and results.png (if matplotlib imports) into --out. Needs torch, triton and a
CUDA GPU; `--help` and `--selfcheck` (CPU checks of the reference and the accounting) run without them.

    python -m bench.suite.attention [--ops OP,...] [--seqs ...] [--kv ...] [--out DIR]   # from the repository root
    python -m bench.suite.attention --selfcheck
"""
import argparse
import gc
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.suite import attention_ops
from bench.suite.attention_ops import (CAP, COMPILERS, D, DEFAULT_SYSTEMS, DTYPES, FULL_CHECK, OPS, REF_CHUNK, SAMPLED,
                                       SYSTEMS, TOL, TOLS, UNITS, WINDOW, Op, alibi_slopes, attention_math,
                                       check_output, check_targets, keep, metric, pairs, reference, score_mod, work)
from bench.suite.attention_report import (cell, fmt_ratio, geomean, groups, markdown, merge, plot, ratios, summary,
                                          write_results)
from bench.suite.attention_systems import (BUILDERS, COPY_ROW, READ_ROW, Case, api_callables, eager, flex, flex_args,
                                           import_package, inductor, neptune, neptune_api, read_only,
                                           same_bytes_copy, sdpa)

try:
    import torch
except ImportError:  # --help still works; running says what is missing
    torch = None

# The benchmark is split over bench.suite.attention_ops (operators, semantics, reference, check, metrics),
# attention_systems (the systems' builders, BUILDERS, the decode ceilings), attention_report (tables, plot, merge)
# and attention_selfcheck; its names stay importable from here, and BUILDERS and OPS are the same objects.
__all__ = [
    "CAP", "COMPILERS", "D", "DEFAULT_SYSTEMS", "DTYPES", "FULL_CHECK", "OPS", "REF_CHUNK", "SAMPLED", "SYSTEMS", "TOL",
    "TOLS", "UNITS", "WINDOW", "Op", "alibi_slopes", "attention_math", "check_output", "check_targets", "keep",
    "metric", "pairs", "reference", "score_mod", "work",
    "BUILDERS", "COPY_ROW", "READ_ROW", "Case", "api_callables", "eager", "flex", "flex_args", "import_package",
    "inductor", "neptune", "neptune_api", "read_only", "same_bytes_copy", "sdpa",
    "cell", "fmt_ratio", "geomean", "groups", "markdown", "merge", "plot", "ratios", "summary", "write_results",
    "short", "synchronize", "free", "cuda_timer", "run_system", "bench_shape", "again_in_turns", "print_row",
    "load_module", "shapes", "portable", "run_all", "device_info", "copy_bandwidth", "int_list", "name_list",
    "parse_args", "main", "selfcheck",
]


def __getattr__(name):
    """attention.DTYPE: the dtype of the run, which lives in attention_ops (check_output reads it there)."""
    if name == "DTYPE":
        return attention_ops.DTYPE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- running

def short(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:200]


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def free(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def cuda_timer(warmup_ms, rep_ms):
    import triton.testing

    def time_ms(fn):
        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return time_ms


def run_system(name, case, refs, flops, nbytes, timer):
    """(one measurement row without the shape fields, the timed call where its output was right), or (None, None)
    where the system cannot express the op."""
    row = dict(status="failed", ms=None, tflops=None, gbs=None, max_err=None, first_call_s=None, error=None)
    stage = "build"
    try:
        fn = BUILDERS[name](case)
        if fn is None:
            return None, None
        stage = "first call"
        t0 = time.perf_counter()
        out = fn()
        synchronize(case.device)
        row["first_call_s"] = round(time.perf_counter() - t0, 3)
        stage = "check"
        err, wrong = check_output(out, refs, case.q.shape)
        del out
        row["max_err"] = err if err is None or math.isfinite(err) else str(err)
        if wrong:
            return dict(row, status="wrong", error=wrong), None
        stage = "timing"
        ms = timer(fn)
        return dict(row, status="ok", ms=ms, tflops=flops / ms / 1e9, gbs=nbytes / ms / 1e6), fn
    except Exception as e:  # OOM, unsupported, compile errors: report and go on
        return dict(row, error=f"{stage}: {short(e)}"), None


def bench_shape(rows, op, B, S, systems, module=None, module_error=None, device="cuda", timer=None, rounds=1):
    """Every system on one op and shape (prefill: Sq = Skv = S; decode: Sq = 1, Skv = S); appends to rows. With
    rounds > 1 the systems that ran correctly are timed again, in turns, and each row keeps the median."""
    Sq = S if op.mode == "prefill" else 1
    torch._dynamo.reset()
    torch.manual_seed(0)
    q = torch.randn(B, op.hq, Sq, D, device=device, dtype=DTYPES[attention_ops.DTYPE])
    k = torch.randn(B, op.hkv, S, D, device=device, dtype=DTYPES[attention_ops.DTYPE])
    v = torch.randn(B, op.hkv, S, D, device=device, dtype=DTYPES[attention_ops.DTYPE])
    case = Case(op, q, k, v, alibi_slopes(op.hq, device), device, module, module_error)
    targets = check_targets(B, op.hq, Sq, S)
    refs = reference(op, q, k, v, case.slopes, targets)
    checked = "all" if len(targets) == B * op.hq else f"{len(targets)} of {B * op.hq} (b,h): {targets}"
    flops, nbytes = work(op, B, Sq, S)
    timed = []   # (row, call) of every correct timing, for the further rounds
    for name in systems:
        row, fn = run_system(name, case, refs, flops, nbytes, timer)
        if row is None:
            continue
        rows.append(dict(op=op.name, mode=op.mode, B=B, Hq=op.hq, Hkv=op.hkv, Sq=Sq, Skv=S, system=name,
                         **row, flops=flops, bytes=nbytes, checked=checked))
        print_row(rows[-1])
        if fn is not None and rounds > 1:
            timed.append((rows[-1], fn))
        free(device)
    if op.mode == "decode" and device == "cuda" and timer is not None:
        for name, fn in ((COPY_ROW, same_bytes_copy(nbytes)), (READ_ROW, read_only(k, v))):
            ms = timer(fn)
            rows.append(dict(op=op.name, mode=op.mode, B=B, Hq=op.hq, Hkv=op.hkv, Sq=1, Skv=S, system=name,
                             status="ok", ms=ms, tflops=None, gbs=nbytes / ms / 1e6, max_err=None,
                             first_call_s=None, error=None, flops=0, bytes=nbytes, checked=""))
            timed.append((rows[-1], fn))
            print_row(rows[-1])
        free(device)
    if rounds > 1 and timed:
        again_in_turns(timed, rounds, timer)


def again_in_turns(timed, rounds, timer):
    """Time every (row, call) rounds - 1 more times, taking turns, so a drift of the clock or a noisy neighbour
    weighs on all systems alike; each row keeps its timings and their median."""
    for row, _ in timed:
        row["round_ms"] = [row["ms"]]
    for _ in range(rounds - 1):
        for row, fn in timed:
            row["round_ms"].append(timer(fn))
    print(f"  median of {rounds} rounds in turns:")
    for row, _ in timed:
        ms = sorted(row["round_ms"])[len(row["round_ms"]) // 2]
        row.update(ms=ms, gbs=row["bytes"] / ms / 1e6, tflops=row["flops"] / ms / 1e9 if row["flops"] else None)
        print_row(row)


def print_row(r):
    head = f"{r['op']:11s} B{r['B']:<3d} S{r['Skv']:<6d} {r['system']:13s}"
    if r["status"] == "ok":
        err = f" err {r['max_err']:.1e}" if isinstance(r["max_err"], float) else ""
        print(f"{head} {r['ms']:9.4f} ms {metric(r):8.1f} {UNITS[r['mode']]:7s}{err}", flush=True)
    else:
        print(f"{head} {r['status'].upper()}: {r['error']}", flush=True)


def load_module(path):
    """Import a generated kernel module from its file (registered in sys.modules, as Triton and dataclasses expect)."""
    module = common.load_module(path)
    if not callable(getattr(module, "forward", None)):
        raise AttributeError(f"{path} has no forward()")
    return module


def shapes(args, op):
    """(B, S) pairs for the op: --batch x (--seqs or --kv), then --batch-sweep x --batch-sweep-seq, deduplicated."""
    seqs = args.seqs if op.mode == "prefill" else args.kv
    todo = [(args.batch, s) for s in seqs] + [(b, args.batch_sweep_seq) for b in args.batch_sweep]
    return list(dict.fromkeys(todo))


def portable(value):
    """A path as the results file keeps it: relative to the working folder, or from $OUT, not the machine's."""
    if not isinstance(value, (str, Path)) or not os.path.isabs(str(value)):
        return value
    text, out = str(value), os.environ.get("OUT")
    if out and text.startswith(out.rstrip("/") + "/"):
        return "$OUT/" + text[len(out.rstrip("/")) + 1:]
    return os.path.relpath(text) if text.startswith(os.getcwd()) else text


def run_all(args, device="cuda", timer=None, info=None):
    """The whole benchmark; writes the results after every shape, so a run cut short keeps what it measured."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = attention_ops.DTYPE
    results = dict(device=info or {}, config=dict(D=D, window=WINDOW, cap=CAP, tol=TOLS[dtype], dtype=dtype,
                                                  full_check=FULL_CHECK, sampled=SAMPLED,
                                                  args={k: portable(v) for k, v in vars(args).items()}),
                   modules={}, skipped=[], errors=[], rows=[], summary={})
    for name in args.ops:
        op = OPS[name]
        module = module_error = None
        if "neptune" in args.systems:
            path = Path(args.modules) / f"{name}.py"
            if not path.exists():
                print(f"skipping {name}: no module {path}", flush=True)
                results["skipped"].append(dict(op=name, reason=f"no module {path}"))
                continue
            try:
                module = load_module(path)
                meta = dict(path=portable(path), NAME=getattr(module, "NAME", None), PLAN=getattr(module, "PLAN", None))
                print(f"{name}: {path}" + "".join(f"\n  {k}: {v}" for k, v in meta.items() if k != "path" and v))
            except Exception as e:
                module_error = f"load {path}: {short(e)}"
                meta = dict(path=portable(path), error=module_error)
                print(f"{name}: {module_error}", flush=True)
            results["modules"][name] = meta
        for B, S in shapes(args, op):
            try:
                bench_shape(results["rows"], op, B, S, args.systems, module, module_error, device, timer,
                            args.rounds)
            except Exception as e:  # inputs or reference did not fit, or the device is in a bad state
                print(f"{name} B{B} S{S}: setup failed: {short(e)}", flush=True)
                results["errors"].append(dict(op=name, B=B, S=S, error=short(e)))
            free(device)
            results["summary"] = summary(results["rows"])
            write_results(results, out_dir, plot_png=False)
    write_results(results, out_dir, plot_png=True)
    return results



def device_info():
    import triton
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                            timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = None
    info["copy_gbs"] = copy_bandwidth()
    return info


def copy_bandwidth():
    """Device-to-device copy of 1 GiB, GB/s of bytes read plus written (the cost model's calibration of the
    same): the ceiling decode runs against."""
    import_package()
    from neptune_eqsat.tune.calibrate import gpu_timer, memory_bandwidth
    gbs = memory_bandwidth(gpu_timer) / 1e9
    free("cuda")
    return gbs


# ---------------------------------------------------------------- command line

def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def name_list(choices):
    def parse(text):
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(choices)}")
        return names
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "Shapes: --batch x --seqs for prefill ops, --batch x --kv for decode ops, plus --batch-sweep x "
        "--batch-sweep-seq for every op (duplicates run once). --quick: short timing (warmup 10 ms, rep 50 ms) and, "
        "unless --seqs/--kv are given, only S = 1024 and KV = 4096. --out defaults to $OUT, else bench/results/<gpu>/<date>-attention."),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=name_list(list(OPS)), default=list(OPS), help="comma list (default: all ten)")
    p.add_argument("--seqs", type=int_list, default=None, help="prefill S (default 1024,4096,16384)")
    p.add_argument("--kv", type=int_list, default=None, help="decode KV length (default 4096,32768)")
    p.add_argument("--batch", type=int, default=1, help="batch for --seqs/--kv (default 1)")
    p.add_argument("--batch-sweep", type=int_list, default=[], help="extra batches, e.g. 1,2,4,8,16,32")
    p.add_argument("--batch-sweep-seq", type=int, default=8192, help="S (or KV) of the batch sweep (default 8192)")
    p.add_argument("--modules", default=str(common.GENERATED), help="folder of <op>.py (default bench/generated)")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else bench/results/<gpu>/<date>-attention)")
    p.add_argument("--systems", type=name_list(SYSTEMS), default=DEFAULT_SYSTEMS,
                   help=f"comma list from {','.join(SYSTEMS)} (default all but eager, neptune_api and "
                        "fa4, which needs flash-attn-4)")
    p.add_argument("--quick", action="store_true", help="short timing, smallest default shapes")
    p.add_argument("--rounds", type=int, default=1,
                   help="time each shape's systems this many times, in turns, and keep the medians (default 1)")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                   help="dtype of q, k, v and the output (bf16 needs modules generated with --dtype bf16)")
    p.add_argument("--selfcheck", action="store_true", help="CPU checks of the reference and the accounting, then exit")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="join earlier runs' results.json (one GPU) into --out, "
                   "for a suite split over several runs; measures nothing")
    args = p.parse_args(argv)
    if args.seqs is None:
        args.seqs = [1024] if args.quick else [1024, 4096, 16384]
    if args.kv is None:
        args.kv = [4096] if args.quick else [4096, 32768]
    if args.out is None and not args.selfcheck:
        args.out = str(common.default_out("attention"))
    return args


def main(argv=None):
    args = parse_args(argv)
    attention_ops.DTYPE = args.dtype   # the run's dtype, read by check_output
    if torch is None:
        sys.exit("bench.suite.attention needs torch (not importable here)")
    if args.selfcheck:
        return selfcheck()
    if args.merge:
        return merge(args.merge, Path(args.out))
    if not torch.cuda.is_available():
        sys.exit("bench.suite.attention needs a CUDA GPU (torch.cuda.is_available() is False); "
                 "--selfcheck runs the CPU checks")
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("bench.suite.attention needs triton (for triton.testing.do_bench)")
    for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, 4096)
    info = device_info()
    print(info, flush=True)
    timer = cuda_timer(10, 50) if args.quick else cuda_timer(50, 300)
    results = run_all(args, "cuda", timer, info)
    print()
    print(markdown(results))
    for mode, s in results["summary"].items():
        print(f"geomean {mode}: neptune / best compiler {fmt_ratio(s['neptune_over_best_compiler']['geomean'])}, "
              f"neptune / cuDNN {fmt_ratio(s['neptune_over_cudnn']['geomean'])}")
    print(f"wrote {Path(args.out) / 'results.json'}, results.md, results.png")



def selfcheck():
    """CPU checks of the reference and the accounting (bench.suite.attention_selfcheck, which imports this module:
    loaded when called)."""
    from bench.suite import attention_selfcheck
    return attention_selfcheck.selfcheck()


if __name__ == "__main__":
    main()
