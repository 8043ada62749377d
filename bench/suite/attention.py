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
import functools
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import common

try:
    import torch
except ImportError:  # --help still works; running says what is missing
    torch = None

D, WINDOW, CAP, TOL = 128, 4096, 50.0, 2e-2
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16} if torch is not None else {}
TOLS = {"fp16": TOL, "bf16": 5e-2}   # bf16 keeps 8 bits of mantissa to fp16's 11
DTYPE = "fp16"   # the inputs' dtype of a run (--dtype)
FULL_CHECK = 2 ** 27     # B*Hq*Sq*Skv up to which every (batch, head) is checked against float64
SAMPLED = 4              # otherwise this many fixed random (batch, head) pairs, all their query rows
REF_CHUNK = 2 ** 25      # float64 score elements per reference chunk (256 MiB)


@dataclass(frozen=True)
class Op:
    name: str
    mode: str            # "prefill" (Sq = Skv = S) or "decode" (Sq = 1 at position Skv - 1)
    hq: int
    hkv: int
    mask: str | None     # None, "causal" (i >= j) or "window" (i >= j and i - j < WINDOW)
    mod: str | None      # None, "alibi" (s + slope[h] * (j - i)) or "softcap" (CAP * tanh(s / CAP))


OPS = {op.name: op for op in [
    Op("global_pf", "prefill", 32, 32, None, None),
    Op("causal_pf", "prefill", 32, 32, "causal", None),
    Op("gqa_pf", "prefill", 64, 8, "causal", None),
    Op("alibi_pf", "prefill", 32, 32, "causal", "alibi"),
    Op("softcap_pf", "prefill", 32, 16, "causal", "softcap"),
    Op("window_pf", "prefill", 32, 8, "window", "softcap"),
    Op("causal_dc", "decode", 32, 32, None, None),
    Op("gqa_dc", "decode", 64, 8, None, None),
    Op("alibi_dc", "decode", 32, 32, None, "alibi"),
    Op("softcap_dc", "decode", 32, 16, None, "softcap"),
]}
SYSTEMS = ["neptune", "flex", "inductor", "sdpa_cudnn", "sdpa_flash", "sdpa_mem_eff", "eager", "neptune_api"]
DEFAULT_SYSTEMS = SYSTEMS[:-2]
COMPILERS = ("flex", "inductor")   # best compiler = the faster of these two
UNITS = {"prefill": "TFLOP/s", "decode": "GB/s"}


# ---------------------------------------------------------------- semantics (shared by every system and the reference)

def keep(mask, i, j):
    """Whether query position i may attend to key position j (tensors); None when nothing is masked."""
    if mask == "causal":
        return i >= j
    if mask == "window":
        return (i >= j) & (i - j < WINDOW)
    return None


def score_mod(mod, s, slope, i, j):
    """The score modification, applied to scores already scaled by 1/sqrt(D), at query i, key j."""
    if mod == "alibi":
        return s + slope * (j - i)
    if mod == "softcap":
        return CAP * torch.tanh(s / CAP)
    return s


def attention_math(op, q, k, v, slopes, q_offset=None):
    """The plain math in q's dtype with fp32 scores (float64 stays float64): eager, inductor and the reference.
    q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D], slopes [Hq]; query row r sits at position q_offset + r
    (default Skv - Sq: prefill rows at 0.., a decode row at Skv - 1)."""
    Sq, Skv = q.shape[-2], k.shape[-2]
    if q_offset is None:
        q_offset = Skv - Sq
    if k.shape[1] != q.shape[1]:   # query head h reads kv head h // (Hq / Hkv)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = q @ k.transpose(-1, -2)
    s = (s if s.dtype == torch.float64 else s.float()) / math.sqrt(q.shape[-1])
    i = torch.arange(Sq, device=q.device)[:, None] + q_offset
    j = torch.arange(Skv, device=q.device)[None, :]
    s = score_mod(op.mod, s, slopes.to(s.dtype)[:, None, None], i, j)
    allowed = keep(op.mask, i, j)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1).to(q.dtype) @ v


def alibi_slopes(hq, device):
    return torch.tensor([2 ** (-8 * (h + 1) / hq) for h in range(hq)], device=device, dtype=torch.float32)


# ---------------------------------------------------------------- reference and check

def check_targets(B, Hq, Sq, Skv):
    """The (batch, head) pairs checked: all of them for small shapes, else SAMPLED fixed random ones."""
    if B * Hq * Sq * Skv <= FULL_CHECK:
        return [(b, h) for b in range(B) for h in range(Hq)]
    picked = torch.randperm(B * Hq, generator=torch.Generator().manual_seed(1234))[:SAMPLED].sort().values
    return [(int(x) // Hq, int(x) % Hq) for x in picked]


def reference(op, q, k, v, slopes, targets, chunk_elems=REF_CHUNK):
    """float64 outputs {(b, h): [Sq, D]} for the targets, computed per head in query chunks of chunk_elems scores."""
    Sq, Skv = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    rows = max(1, chunk_elems // Skv)
    refs = {}
    for b, h in targets:
        kh = k[b, h // group].double()[None, None]
        vh = v[b, h // group].double()[None, None]
        slope = slopes[h:h + 1].double()
        refs[(b, h)] = torch.cat([
            attention_math(op, q[b, h, r:r + rows].double()[None, None], kh, vh, slope, q_offset=Skv - Sq + r)[0, 0]
            for r in range(0, Sq, rows)])
    return refs


def check_output(out, refs, shape):
    """(max abs error over the checked heads, None) or (error or None, why the output is wrong)."""
    if not torch.is_tensor(out):
        return None, f"returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(shape):
        return None, f"shape {tuple(out.shape)}, expected {tuple(shape)}"
    if out.dtype != DTYPES[DTYPE]:
        return None, f"dtype {out.dtype}, expected {DTYPES[DTYPE]}"
    err = torch.stack([(out[b, h].double() - r).abs().max() for (b, h), r in refs.items()]).max().item()
    tol = TOLS[DTYPE]
    return err, None if err <= tol else f"max abs error {err:.3g} > {tol}"   # NaN fails too


# ---------------------------------------------------------------- metrics

def pairs(mask, Sq, Skv):
    """Unmasked (query, key) pairs; query row r sits at position Skv - Sq + r."""
    if mask is None:
        return Sq * Skv
    width = WINDOW if mask == "window" else Skv
    return sum(min(i + 1, width) for i in range(Skv - Sq, Skv))


def work(op, B, Sq, Skv):
    """(useful FLOPs 4*B*Hq*pairs*D, bytes of Q, K, V and O in fp16)."""
    flops = 4 * B * op.hq * pairs(op.mask, Sq, Skv) * D
    nbytes = 2 * (2 * B * op.hq * Sq * D + 2 * B * op.hkv * Skv * D)
    return flops, nbytes


def metric(row):
    return row["tflops"] if row["mode"] == "prefill" else row["gbs"]


# ---------------------------------------------------------------- systems: each returns a zero-argument call, or None where it cannot express the op

@dataclass
class Case:
    op: Op
    q: "torch.Tensor"
    k: "torch.Tensor"
    v: "torch.Tensor"
    slopes: "torch.Tensor"
    device: str
    module: object = None       # the loaded neptune module
    module_error: str = None    # why it could not be loaded


def neptune(case):
    if case.module is None:
        raise RuntimeError(case.module_error or "no module")
    forward, q, k, v = case.module.forward, case.q, case.k, case.v
    if case.op.mod == "alibi":
        return lambda: forward(q, k, v, case.slopes)
    return lambda: forward(q, k, v)


def flex_args(case):
    """FlexAttention's score_mod, block_mask and enable_gqa for the case."""
    from torch.nn.attention.flex_attention import create_block_mask
    op, slopes = case.op, case.slopes
    Sq, Skv = case.q.shape[2], case.k.shape[2]
    off = Skv - Sq   # flex numbers query rows from 0
    mod = None if op.mod is None else (lambda s, b, h, i, j: score_mod(op.mod, s, slopes[h], i + off, j))
    block_mask = None if op.mask is None else create_block_mask(
        lambda b, h, i, j: keep(op.mask, i + off, j), None, None, Sq, Skv, device=case.device)
    return mod, block_mask, case.q.shape[1] != case.k.shape[1]


def api_callables(op, slopes, offset):
    """score_mod and mask_mod for neptune_eqsat.flex_attention: FlexAttention's, with the query's position
    i + offset read from a captured 0-d tensor (so one kernel serves every KV length)."""
    mod = None if op.mod is None else (lambda s, b, h, i, j: score_mod(op.mod, s, slopes[h], i + offset, j))
    mask = None if op.mask is None else (lambda b, h, i, j: keep(op.mask, i + offset, j))
    return mod, mask


def import_package():
    """neptune_eqsat from this checkout (also without the package installed)."""
    return common.import_package()


def neptune_api(case):
    api = import_package().flex_attention
    offset = case.k.shape[2] - case.q.shape[2]
    if offset:   # decode: a captured position, so that one kernel serves every KV length
        offset = torch.tensor(offset, device=case.device)
    mod, mask = api_callables(case.op, case.slopes, offset)
    q, k, v, gqa = case.q, case.k, case.v, case.q.shape[1] != case.k.shape[1]
    return lambda: api(q, k, v, score_mod=mod, mask_mod=mask, enable_gqa=gqa)


def flex(case):
    from torch.nn.attention.flex_attention import flex_attention
    mod, block_mask, gqa = flex_args(case)
    compiled, q, k, v = torch.compile(flex_attention, dynamic=False), case.q, case.k, case.v
    return lambda: compiled(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)


def inductor(case):
    compiled = torch.compile(functools.partial(attention_math, case.op), dynamic=False)
    q, k, v, slopes = case.q, case.k, case.v, case.slopes
    return lambda: compiled(q, k, v, slopes)


def eager(case):
    op, q, k, v, slopes = case.op, case.q, case.k, case.v, case.slopes
    return lambda: attention_math(op, q, k, v, slopes)


def sdpa(backend, case):
    if case.op.mod is not None or case.op.mask not in (None, "causal"):
        return None
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend)
    q, k, v = case.q, case.k, case.v
    causal = case.op.mask == "causal" and q.shape[2] == k.shape[2]   # a decode row sees every key anyway
    gqa = q.shape[1] != k.shape[1]

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return call


BUILDERS = {
    "neptune": neptune, "neptune_api": neptune_api, "flex": flex, "inductor": inductor, "eager": eager,
    "sdpa_cudnn": functools.partial(sdpa, "CUDNN_ATTENTION"),
    "sdpa_flash": functools.partial(sdpa, "FLASH_ATTENTION"),
    "sdpa_mem_eff": functools.partial(sdpa, "EFFICIENT_ATTENTION"),
}


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
    q = torch.randn(B, op.hq, Sq, D, device=device, dtype=DTYPES[DTYPE])
    k = torch.randn(B, op.hkv, S, D, device=device, dtype=DTYPES[DTYPE])
    v = torch.randn(B, op.hkv, S, D, device=device, dtype=DTYPES[DTYPE])
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


COPY_ROW = "same_bytes_copy"   # not a system: the copy ceiling of a decode shape, timed like the systems
READ_ROW = "same_bytes_read"   # not a system: reading the shape's K and V alone, timed like the systems


def same_bytes_copy(nbytes):
    """A device-to-device copy moving the decode shape's bytes (half read, half written), for the same timer:
    the ceiling at this size, where the timer's cache flush before every call weighs as much as on the op."""
    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


@functools.cache
def _read_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read(k_ptr, v_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        total = tl.load(k_ptr + offs, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
        total += tl.load(v_ptr + offs, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + tl.program_id(0), tl.sum(total))
    return read


def read_only(k, v, block=8192, num_warps=4):
    """A kernel that reads K and V once (16 KB blocks per program, read-once hint) and writes a sum per block:
    what reading the decode shape's bytes alone reaches under the same timer (copies write half their bytes, and
    writes can still sit in the cache when the timer stops, so a copy can beat a pure read of its size)."""
    programs = -(-k.numel() // block)
    sums = torch.empty(programs, device=k.device)
    return lambda: _read_kernel()[(programs,)](k, v, sums, k.numel(), BLOCK=block, num_warps=num_warps)


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
    results = dict(device=info or {}, config=dict(D=D, window=WINDOW, cap=CAP, tol=TOLS[DTYPE], dtype=DTYPE, full_check=FULL_CHECK,
                                                  sampled=SAMPLED, args={k: portable(v) for k, v in vars(args).items()}),
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


# ---------------------------------------------------------------- reporting

def groups(rows):
    """Rows grouped by (mode, op, B, Skv) in the order measured: {key: {system: row}}."""
    out = {}
    for r in rows:
        out.setdefault((r["mode"], r["op"], r["B"], r["Skv"]), {})[r["system"]] = r
    return out


def ratios(by_system):
    """(neptune / best compiler, neptune / cuDNN), None where a side has no correct timing."""
    def value(name):
        r = by_system.get(name)
        return metric(r) if r and r["status"] == "ok" else None
    nep, cudnn = value("neptune"), value("sdpa_cudnn")
    compilers = [x for x in map(value, COMPILERS) if x is not None]
    best = max(compilers) if compilers else None
    return (nep / best if nep and best else None), (nep / cudnn if nep and cudnn else None)


def geomean(xs):
    xs = [x for x in xs if x]
    return dict(geomean=math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None, n=len(xs))


def summary(rows):
    out = {}
    by_shape = groups(rows)
    for mode in ("prefill", "decode", "all"):
        rs = [ratios(g) for (m, *_), g in by_shape.items() if mode in ("all", m)]
        out[mode] = dict(neptune_over_best_compiler=geomean([a for a, _ in rs]),
                         neptune_over_cudnn=geomean([b for _, b in rs]))
    return out


def fmt_ratio(x):
    return f"{x:.2f}×" if x else "—"


def cell(row):
    if row is None:
        return "—"
    return f"{metric(row):.1f}" if row["status"] == "ok" else {"wrong": "WRONG", "failed": "FAIL"}[row["status"]]


def markdown(results):
    rows = results["rows"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    by_shape = groups(rows)
    dev, config = results["device"], results.get("config", {})
    lines = [f"# Attention benchmark: {dev.get('device', '?')} (torch {dev.get('torch', '?')}, "
             f"triton {dev.get('triton', '?')})", "",
             f"{config.get('dtype', 'fp16')}, D = {D}; median of triton.testing.do_bench; outputs checked against "
             f"float64 (max abs error <= {config.get('tol', TOL)}). best compiler = max(flex, inductor). WRONG = output off, not timed; "
             "FAIL = see below; — = not expressible.", ""]
    for mode in ("prefill", "decode"):
        keys = [key for key in by_shape if key[0] == mode]
        if not keys:
            continue
        lines += [f"## {mode.capitalize()} ({UNITS[mode]})", "",
                  "| op | B | " + ("S" if mode == "prefill" else "KV") + " | " + " | ".join(systems)
                  + " | neptune / best compiler | neptune / cuDNN |",
                  "|---|---|---|" + "---|" * (len(systems) + 2)]
        for key in keys:
            g = by_shape[key]
            cells = [cell(g.get(s)) for s in systems]
            lines.append(f"| {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " | "
                         + " | ".join(map(fmt_ratio, ratios(g))) + " |")
        lines.append("")
        copy = dev.get("copy_gbs")
        if mode == "decode" and copy:
            longest = max(key[3] for key in keys)
            shares = [f"{key[1]} B{key[2]} {metric(by_shape[key]['neptune']) / copy:.0%}" for key in keys
                      if key[3] == longest and by_shape[key].get("neptune", {}).get("status") == "ok"]
            lines += [f"Device copy bandwidth (1 GiB device to device, read + write): {copy:.0f} GB/s. "
                      f"neptune at KV = {longest}: " + ", ".join(shares) + " of it.", ""]
            same = [f"{key[1]} B{key[2]} KV {key[3]}: {metric(g['neptune']) / metric(g[COPY_ROW]):.0%} "
                    f"(copy {metric(g[COPY_ROW]):.0f} GB/s)" for key in keys for g in [by_shape[key]]
                    if COPY_ROW in g and g.get("neptune", {}).get("status") == "ok"]
            if same:
                lines += ["A copy of the same bytes (half read, half written), timed the same way, carries the "
                          "timer's cache flush too; neptune's share of it: " + ", ".join(same) + ".", ""]
            read = [f"{key[1]} B{key[2]} KV {key[3]}: {metric(g['neptune']) / metric(g[READ_ROW]):.0%} "
                    f"(read {metric(g[READ_ROW]):.0f} GB/s, {metric(g[READ_ROW]) / copy:.0%} of the copy bandwidth)"
                    for key in keys for g in [by_shape[key]]
                    if READ_ROW in g and g.get("neptune", {}).get("status") == "ok"]
            if read:
                lines += ["A kernel that only reads the same K and V (`same_bytes_read`, read-once hint), timed the "
                          "same way; neptune's share of it: " + ", ".join(read) + ".", ""]
    lines += ["## Geomean", ""]
    for mode, s in results["summary"].items():
        bc, cu = s["neptune_over_best_compiler"], s["neptune_over_cudnn"]
        lines.append(f"- {mode}: neptune / best compiler {fmt_ratio(bc['geomean'])} (n = {bc['n']}), "
                     f"neptune / cuDNN {fmt_ratio(cu['geomean'])} (n = {cu['n']})")
    problems = [r for r in rows if r["status"] != "ok"]
    if problems or results["skipped"] or results["errors"]:
        lines += ["", "## Failures, wrong outputs, skipped ops", ""]
        lines += [f"- {r['op']} B{r['B']} S{r['Skv']} {r['system']}: {r['status'].upper()} {r['error']}" for r in problems]
        lines += [f"- {s['op']}: skipped, {s['reason']}" for s in results["skipped"]]
        lines += [f"- {e['op']} B{e['B']} S{e['S']}: setup failed, {e['error']}" for e in results["errors"]]
    return "\n".join(lines) + "\n"


def plot(results, path):
    """Grouped bars, one panel per mode; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by_shape = groups(results["rows"])
    modes = [m for m in ("prefill", "decode") if any(key[0] == m for key in by_shape)]
    if not modes:
        return False
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in results["rows"])]
    fig, axes = plt.subplots(len(modes), 1, figsize=(14, 4.5 * len(modes)), squeeze=False)
    width = 0.8 / len(systems)
    for ax, mode in zip(axes[:, 0], modes):
        keys = [key for key in by_shape if key[0] == mode]
        for n, s in enumerate(systems):
            ys = [metric(by_shape[key][s]) if s in by_shape[key] and by_shape[key][s]["status"] == "ok" else 0
                  for key in keys]
            ax.bar([x + (n - (len(systems) - 1) / 2) * width for x in range(len(keys))], ys, width, label=s)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{op}\nB{B} {'S' if mode == 'prefill' else 'KV'}{S}" for _, op, B, S in keys],
                           fontsize=7)
        ax.set_ylabel(UNITS[mode])
        ax.set_title(f"{mode} ({results['device'].get('device', '?')})")
        ax.legend(fontsize=7, ncol=len(systems))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_results(results, out_dir, plot_png):
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "results.md").write_text(markdown(results))
    if plot_png and not plot(results, out_dir / "results.png"):
        print("results.png not written (matplotlib missing or nothing measured)")


def merge(dirs, out_dir):
    """One result out of runs on the same GPU model: rows joined, geomeans over all of them. A shape measured
    again in a later run takes all its rows from that run, so the systems of a shape are always compared within
    one run; the device fields (copy bandwidth among them) are the last run's."""
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in dirs]
    gpus = {r["device"].get("device") for r in runs}
    if len(gpus) != 1:
        sys.exit(f"--merge: the runs were made on different GPUs ({', '.join(map(str, gpus))})")
    merged = dict(device={**runs[-1]["device"], "merged_from": [str(d) for d in dirs],
                          "dates": [r["device"].get("date") for r in runs]},
                  config=runs[-1]["config"], modules={}, skipped=[], errors=[], rows=[], summary={})
    shape = lambda r: (r["mode"], r["op"], r["B"], r["Skv"])   # noqa: E731
    for n, r in enumerate(runs):
        later = {shape(x) for x in sum((run["rows"] for run in runs[n + 1:]), [])}
        merged["rows"] += [x for x in r["rows"] if shape(x) not in later]
        merged["skipped"] += r["skipped"]
        merged["errors"] += r["errors"]
        merged["modules"].update(r["modules"])
    merged["summary"] = summary(merged["rows"])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(merged, out_dir, plot_png=True)
    print(markdown(merged))


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
                   help=f"comma list from {','.join(SYSTEMS)} (default all but eager)")
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
    global DTYPE
    DTYPE = args.dtype
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


# ---------------------------------------------------------------- CPU self-check

def naive(op, q, k, v, slopes):
    """The operator table written out row by row in numpy float64, independent of attention_math."""
    import numpy as np
    q, k, v, slopes = (t.double().numpy() for t in (q, k, v, slopes))
    B, Hq, Sq, Dh = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    j = np.arange(Skv)
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            for r in range(Sq):
                i = Skv - Sq + r
                s = k[b, kv] @ q[b, h, r] / math.sqrt(Dh)
                if op.mod == "softcap":
                    s = 50 * np.tanh(s / 50)
                if op.mod == "alibi":
                    s = s + slopes[h] * (j - i)
                if op.mask == "causal":
                    s = np.where(i >= j, s, -np.inf)
                if op.mask == "window":
                    s = np.where((i >= j) & (i - j < 4096), s, -np.inf)
                p = np.exp(s - s.max())
                out[b, h, r] = p / p.sum() @ v[b, kv]
    return torch.from_numpy(out)


def selfcheck():
    """On CPU: pairs and bytes against brute force and hand counts, the chunked float64 reference against a direct
    one and against the row-by-row table, FlexAttention's mods (eager) against the reference, the fp16 plain math
    within TOL, and the whole run loop with stand-in modules (one right, one wrong, one missing)."""
    torch.manual_seed(0)
    # accounting
    for mask in (None, "causal", "window"):
        for Sq, Skv in ((37, 37), (1, 53), (4200, 4200), (1, 5000), (10, 4500)):
            i = torch.arange(Sq)[:, None] + (Skv - Sq)
            allowed = keep(mask, i, torch.arange(Skv)[None, :])
            brute = Sq * Skv if allowed is None else int(allowed.sum())
            assert pairs(mask, Sq, Skv) == brute, (mask, Sq, Skv)
    assert pairs("causal", 4, 4) == 10 and pairs("window", 8192, 8192) == 4096 * 4097 // 2 + 4096 * 4096
    assert work(OPS["causal_pf"], 1, 4, 4) == (4 * 32 * 10 * 128, 2 * (2 * 32 * 4 * 128 + 2 * 32 * 4 * 128))
    assert work(OPS["gqa_dc"], 2, 1, 64)[1] == 2 * (2 * 2 * 64 * 1 * 128 + 2 * 2 * 8 * 64 * 128)
    assert work(OPS["gqa_dc"], 2, 1, 64)[0] == 4 * 2 * 64 * 64 * 128
    print("selfcheck: pairs, FLOPs and bytes ok")
    # reference: chunked vs direct vs the table, every op, small head counts with the op's group
    for op in OPS.values():
        group = op.hq // op.hkv
        shapes_ = [(2, 2 * group, 2, 37 if op.mode == "prefill" else 1, 53 if op.mode == "decode" else 37)]
        if op.mask == "window":
            shapes_.append((1, group, 1, 4200, 4200))
        for B, Hq, Hkv, Sq, Skv in shapes_:
            q, k, v = (torch.randn(B, H, S, D) for H, S in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
            slopes = alibi_slopes(Hq, "cpu")
            direct = attention_math(op, q.double(), k.double(), v.double(), slopes.double())
            targets = [(b, h) for b in range(B) for h in range(Hq)]
            chunked = reference(op, q, k, v, slopes, targets, chunk_elems=5 * Skv)
            table = naive(op, q, k, v, slopes)
            for (b, h), r in chunked.items():
                assert torch.allclose(r, direct[b, h], atol=1e-10), (op.name, b, h, "chunked")
                assert torch.allclose(r, table[b, h], atol=1e-10), (op.name, b, h, "table")
            half = attention_math(op, q.half(), k.half(), v.half(), slopes)
            assert check_output(half, chunked, q.shape)[1] is None, (op.name, "fp16 math")
            try:
                from torch.nn.attention.flex_attention import flex_attention
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mod, block_mask, gqa = flex_args(Case(op, q, k, v, slopes, "cpu"))
                    got = flex_attention(q, k, v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)
                assert (got.double() - direct).abs().max() < 1e-4, (op.name, "flex")
                flex_ok = "flex ok"
            except ImportError as e:
                flex_ok = f"flex not checked ({short(e)})"
        print(f"selfcheck: {op.name:11s} reference (chunked = direct = table), fp16 math ok, {flex_ok}")
    t = check_targets(32, 64, 8192, 8192)
    assert len(t) == SAMPLED == len(set(t)) and t == check_targets(32, 64, 8192, 8192)
    assert all(0 <= b < 32 and 0 <= h < 64 for b, h in t) and len(check_targets(1, 64, 1, 32768)) == 64
    # the run loop on CPU with stand-in modules
    right = ("import math, torch\nNAME = 'stand-in'\nPLAN = 'plain torch'\n"
             "def forward(q, k, v):\n"
             "    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])\n"
             "    return (torch.softmax(s, -1) @ v.float()).half()\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "global_pf.py").write_text(right)
        (Path(tmp) / "causal_pf.py").write_text(right)       # ignores the causal mask: must come out WRONG
        (Path(tmp) / "causal_dc.py").write_text(right)       # decode with no mask: right
        (Path(tmp) / "softcap_dc.py").write_text("def forward(q, k, v):\n    raise RuntimeError('boom')\n")
        args = parse_args(["--ops", "global_pf,causal_pf,alibi_pf,causal_dc,softcap_dc", "--seqs", "64",
                           "--kv", "96", "--modules", tmp, "--out", str(Path(tmp) / "out"),
                           "--systems", "neptune,eager,sdpa_cudnn", "--rounds", "3"])
        calls = {}

        def timer(fn):   # every call's second timing is an outlier the median must drop
            calls[fn] = calls.get(fn, 0) + 1
            return 9.0 if calls[fn] == 2 else 1.0
        results = run_all(args, "cpu", timer=timer, info=dict(device="cpu"))
        status = {(r["op"], r["system"]): r["status"] for r in results["rows"]}
        assert status == {("global_pf", "neptune"): "ok", ("global_pf", "eager"): "ok",
                          ("global_pf", "sdpa_cudnn"): "failed", ("causal_pf", "neptune"): "wrong",
                          ("causal_pf", "eager"): "ok", ("causal_pf", "sdpa_cudnn"): "failed",
                          ("causal_dc", "neptune"): "ok", ("causal_dc", "eager"): "ok",
                          ("causal_dc", "sdpa_cudnn"): "failed", ("softcap_dc", "neptune"): "failed",
                          ("softcap_dc", "eager"): "ok"}, status
        assert [s["op"] for s in results["skipped"]] == ["alibi_pf"]
        timed = [r for r in results["rows"] if r["status"] == "ok"]
        assert all(len(r["round_ms"]) == 3 and r["ms"] == 1.0 for r in timed), timed   # medians, not the 9 ms
        assert results["modules"]["global_pf"]["NAME"] == "stand-in"
        row = next(r for r in results["rows"] if r["op"] == "global_pf" and r["system"] == "neptune")
        assert row["flops"] == 4 * 32 * 64 * 64 * 128 and abs(row["tflops"] - row["flops"] / 1e9) < 1e-9
        saved = json.loads((Path(tmp) / "out" / "results.json").read_text())
        assert len(saved["rows"]) == len(results["rows"])
        assert "| global_pf | 1 | 64 |" in (Path(tmp) / "out" / "results.md").read_text()
        # a later run replaces the rows of the shapes it measured again, and adds the others
        later = dict(saved, rows=[dict(r, ms=7.5) for r in saved["rows"] if r["op"] == "global_pf"])
        (Path(tmp) / "later").mkdir()
        (Path(tmp) / "later" / "results.json").write_text(json.dumps(later))
        merge([Path(tmp) / "out", Path(tmp) / "later"], Path(tmp) / "merged")
        joined = json.loads((Path(tmp) / "merged" / "results.json").read_text())
        assert len(joined["rows"]) == len(results["rows"])
        assert all((r["ms"] == 7.5) == (r["op"] == "global_pf") for r in joined["rows"] if r["ms"] is not None)
        assert joined["summary"]["all"]["neptune_over_best_compiler"]["n"] == 0   # no compiler ran here
    print("selfcheck: run loop, WRONG/FAIL/skip handling, results.json and results.md ok")
    print("selfcheck passed")


if __name__ == "__main__":
    main()
