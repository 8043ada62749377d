"""Where does the Gluon prefill kernel spend the time it trails FlashAttention-4 by at S = 4k? Each ablation
removes one part of the work from a generated module (its output is then wrong: only the timing is read) and the
difference to the module as generated bounds what that part can cost:

    no_store    the epilogue's output stays in shared memory (no copy to global memory, no wait for it)
    no_reload   a persistent program copies its first tile's A (Q) only; later tiles reuse it
    boundary    both: what a tile boundary costs beyond the loop itself
    no_mask     every key block runs the unmasked loop (the mask's per-element work removed)

    PYTHONPATH=. python bench/experiments/2026-11-28-prefill-boundary/ablations.py write DIR MODULE...
    PYTHONPATH=. python bench/experiments/2026-11-28-prefill-boundary/ablations.py time --ops causal_pf
        --variants "generated=DIR/generated;no_store=DIR/no_store;...;order3=DIR2@{\"WS_ORDER\":3}"
        [--seqs 1024,4096,16384] [--rounds 5] [--systems fa4,sdpa_cudnn]

`write` (anywhere, standard library only) writes DIR/<variant>/<module> for each variant and the module itself
as DIR/generated/<module>; `time` (on the GPU) checks every variant that is not an ablation against float64,
with FlashAttention-4 and cuDNN, then times all in turns (ratios to the first variant).
"""
import argparse
import dataclasses
import re
import types
import sys
from pathlib import Path

STORE = re.compile(r"\n\s+tma\.async_copy_shared_to_global\(.*\)\n\s+tma\.store_wait\(pendings=0\)")
RELOAD = re.compile(r"(?P<ind>\n\s+)mbarrier\.expect\(a_bar, (?P<n>.*)\)\n\s+tma\.async_copy_global_to_shared\("
                    r"(?P<args>[^\n]*a_bar, a_smem)\)")


def no_store(src: str) -> str:
    out, n = STORE.subn("", src)
    assert n >= 1, "no epilogue store found"
    return out


def no_reload(src: str) -> str:
    def sub(m):
        i = m["ind"]
        return (f"{i}if tiles_done == 0:{i}    mbarrier.expect(a_bar, {m['n']}){i}    "
                f"tma.async_copy_global_to_shared({m['args']}){i}else:{i}    mbarrier.arrive(a_bar, count=1)")
    out, n = RELOAD.subn(sub, src)
    assert n == 1, "no copy of A found"
    return out


def no_mask(src: str) -> str:
    """The consumer's unmasked loop runs from lo to hi (full_lo = lo, full_hi = hi after their computation)."""
    head = src.index("_consumer(")
    body = src[head:]
    m = re.search(r"(?P<ind>\n\s+)full_hi = [^\n]*", body)
    assert m, "no unmasked bounds in the consumer"
    body = body[:m.end()] + f"{m['ind']}full_lo = lo{m['ind']}full_hi = hi" + body[m.end():]
    return src[:head] + body


VARIANTS = {"no_store": no_store, "no_reload": no_reload, "boundary": lambda s: no_reload(no_store(s)),
            "no_mask": no_mask}


def write(out: Path, modules: list[str]) -> None:
    for path in map(Path, modules):
        src = path.read_text()
        for name, edit in VARIANTS.items():
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / path.name).write_text(edit(src))
        (out / "generated").mkdir(parents=True, exist_ok=True)
        (out / "generated" / path.name).write_text(src)


def time_all(args) -> None:
    """Every variant (NAME=FOLDER, or NAME=FOLDER@JSON for a config over the module's) and system, timed in
    turns; a variant whose name starts with "no_" or is "boundary" is an ablation (its output is not checked),
    every other output is checked against float64 first (a wrong one is not timed)."""
    import json
    import torch
    from bench.suite import attention
    from bench.suite.attention_systems import Case, neptune
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    timer = attention.cuda_timer(50, 300)
    variants = {}
    for item in args.variants.split(";"):
        name, _, where = item.partition("=")
        folder, _, config = where.partition("@")
        variants[name] = (Path(folder), json.loads(config) if config else None)
    for op_name in args.ops.split(","):
        op = attention.OPS[op_name]
        for S in map(int, args.seqs.split(",")):
            rows = []
            for name, (folder, config) in variants.items():
                module = attention.load_module(folder / f"{op_name}.py")
                call = (module.forward if config is None else
                        lambda *a, f=module.forward, c=config: f(*a, config=c))
                entry = types.SimpleNamespace(forward=call)
                attention.BUILDERS[name] = lambda case, m=entry: neptune(dataclasses.replace(case, module=m))
            checked = [n for n in variants if not (n.startswith("no_") or n == "boundary")]
            attention.bench_shape(rows, op, 1, S, checked + [x for x in args.systems.split(",") if x], timer=timer)
            q, k, v = (torch.randn(1, h, S, attention.D, device="cuda", dtype=torch.float16)
                       for h in (op.hq, op.hkv, op.hkv))
            case = Case(op, q, k, v, attention.alibi_slopes(op.hq, "cuda"), "cuda")
            calls = {r["system"]: attention.BUILDERS[r["system"]](case) for r in rows if r["status"] == "ok"}
            calls.update({n: attention.BUILDERS[n](case) for n in variants if n not in checked})
            times = {n: [] for n in calls}
            for _ in range(args.rounds):
                for n, fn in calls.items():
                    times[n].append(timer(fn))
            first = next(iter(variants))
            base = sorted(times[first])[args.rounds // 2] if first in times else None
            for n, ts in times.items():
                ms = sorted(ts)[args.rounds // 2]
                ratio = f"{first} / this {base / ms:6.3f}x" if base else ""
                print(f"{op_name:10s} S={S:<6d} {n:14s} {ms:9.4f} ms  {ratio}  "
                      f"rounds {' '.join(f'{t:.4f}' for t in ts)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("modules", nargs="+")
    t = sub.add_parser("time")
    t.add_argument("--variants", required=True, help="NAME=FOLDER[@JSON];...: the first is the ratios base")
    t.add_argument("--ops", default="causal_pf")
    t.add_argument("--seqs", default="1024,4096,16384")
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--systems", default="fa4,sdpa_cudnn")
    args = ap.parse_args()
    if args.cmd == "write":
        write(Path(args.out), args.modules)
    else:
        time_all(args)


if __name__ == "__main__":
    sys.exit(main())
