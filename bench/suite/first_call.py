"""The first call with a new callable: neptune_eqsat.flex_attention (trace, e-graph, Triton compile, run) beside
torch's FlexAttention as a model uses it (create_block_mask, torch.compile of flex_attention, run), for the ten
operators' callables, then calls at other sequence lengths (the e-graph never runs again for a new length;
FlexAttention recompiles unless its shapes are marked dynamic). Every output is checked against float64.

    python -m bench.suite.first_call [--ops global_pf,...] [--seqs 4096,8192,4999] [--out DIR]

Needs a GPU and the compiler (egglog) beside torch and triton. The kernel cache starts empty
(NEPTUNE_EQSAT_CACHE is set to a new folder), so every first call compiles; the proof cache is the user's, as
for anyone who has compiled before (the first op of a run without one also proves the rules).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["NEPTUNE_EQSAT_CACHE"] = tempfile.mkdtemp(prefix="neptune_first_call_")
os.environ["NEPTUNE_EQSAT_COMPILE_AHEAD"] = "1"   # as a user's first call runs (bench.common turns it off)

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.suite import attention  # noqa: E402


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def inputs(op, S, dtype):
    Sq = S if op.mode == "prefill" else 1
    g = torch.Generator(device="cuda").manual_seed(S)
    shape = lambda h, n: (1, h, n, attention.D)   # noqa: E731
    q = torch.randn(shape(op.hq, Sq), device="cuda", dtype=dtype, generator=g)
    k = torch.randn(shape(op.hkv, S), device="cuda", dtype=dtype, generator=g)
    v = torch.randn(shape(op.hkv, S), device="cuda", dtype=dtype, generator=g)
    return attention.Case(op, q, k, v, attention.alibi_slopes(op.hq, "cuda"), "cuda")


def check(case, out):
    targets = attention.check_targets(1, case.op.hq, case.q.shape[2], case.k.shape[2])
    refs = attention.reference(case.op, case.q, case.k, case.v, case.slopes, targets)
    err, why = attention.check_output(out, refs, case.q.shape[:3] + (attention.D,))
    return why or "ok"


OPTIMIZE_SECONDS = []   # the e-graph's share of each first call: spec to module source


def timing_optimize():
    """Wrap the compiler's optimize so each first call reports how long the e-graph part took."""
    from neptune_eqsat import compiler
    inner = compiler.optimize

    def optimize(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            OPTIMIZE_SECONDS.append(time.perf_counter() - t0)
    compiler.optimize = optimize


def neptune_calls(op, seqs, dtype):
    """Seconds of each call at each length: new callables, so the first call traces and compiles."""
    api = attention.import_package().flex_attention
    offset = torch.tensor(0, device="cuda")
    mod, mask = attention.api_callables(op, attention.alibi_slopes(op.hq, "cuda"), offset)
    rows = []
    for S in seqs:
        case = inputs(op, S, dtype)
        offset.fill_(case.k.shape[2] - case.q.shape[2])
        gqa = op.hq != op.hkv
        before = len(OPTIMIZE_SECONDS)
        out, seconds = timed(lambda: api(case.q, case.k, case.v, score_mod=mod, mask_mod=mask, enable_gqa=gqa))
        rows.append(dict(system="neptune_api", S=S, seconds=seconds, check=check(case, out),
                         optimize_s=sum(OPTIMIZE_SECONDS[before:])))
    return rows


def flex_calls(op, seqs, dtype):
    from torch.nn.attention.flex_attention import flex_attention
    compiled = torch.compile(flex_attention)
    rows = []
    for S in seqs:
        case = inputs(op, S, dtype)

        def call():
            mod, block_mask, gqa = attention.flex_args(case)   # builds the block mask, as a first call must
            return compiled(case.q, case.k, case.v, score_mod=mod, block_mask=block_mask, enable_gqa=gqa)
        out, seconds = timed(call)
        rows.append(dict(system="flex", S=S, seconds=seconds, check=check(case, out)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=attention.name_list(list(attention.OPS)), default=list(attention.OPS))
    ap.add_argument("--seqs", type=attention.int_list, default=[4096, 8192, 4999],
                    help="prefill S or decode KV of the calls in turn (default 4096,8192,4999)")
    ap.add_argument("--out", default=None, help="default $OUT, else bench/results/<gpu>/<date>-first-call")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench.suite.first_call needs a CUDA GPU")
    for key in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, 4096)
    info = attention.device_info()
    print(info, flush=True)
    t0 = time.perf_counter()
    attention.import_package()
    import neptune_eqsat.compiler  # noqa: F401  (the compiler's import is part of a first call's cost)
    import neptune_eqsat.rules  # noqa: F401
    setup = time.perf_counter() - t0
    timing_optimize()
    rows = []
    for name in args.ops:
        op = attention.OPS[name]
        for system_rows in (neptune_calls(op, args.seqs, torch.float16), flex_calls(op, args.seqs, torch.float16)):
            for r in system_rows:
                rows.append(dict(op=name, **r))
                part = f" (e-graph and codegen {r['optimize_s']:.3f} s)" if r.get("optimize_s") else ""
                print(f"{name:11s} {r['system']:12s} S {r['S']:6d} {r['seconds']:8.3f} s{part}  {r['check']}", flush=True)
    lines = [f"# First calls: {info.get('device')} (torch {info.get('torch')}, triton {info.get('triton')})", "",
             f"Seconds per call with new callables, each output checked against float64; importing the compiler "
             f"and proving its rules took {setup:.2f} s once before the first op.", "",
             "| op | " + " | ".join(f"neptune S={S} | flex S={S}" for S in args.seqs)
             + " | first: flex / neptune | neptune's e-graph and codegen |",
             "|---|" + "---|---|" * len(args.seqs) + "---|---|"]
    for name in args.ops:
        got = {(r["system"], r["S"]): r for r in rows if r["op"] == name}
        cells = []
        for S in args.seqs:
            for system in ("neptune_api", "flex"):
                r = got[(system, S)]
                cells.append(f"{r['seconds']:.2f}" + ("" if r["check"] == "ok" else f" ({r['check']})"))
        first = got[("flex", args.seqs[0])]["seconds"] / got[("neptune_api", args.seqs[0])]["seconds"]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {first:.2f}× | {got[('neptune_api', args.seqs[0])]['optimize_s']:.2f} |")
    out = Path(args.out) if args.out else common.default_out("first-call")
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_call.json").write_text(json.dumps(dict(device=info, setup_s=setup, rows=rows), indent=1))
    (out / "first_call.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
