"""A data-dependent mask's per-call classification with one program per grid value (codegen/block_pairs.py:
every block pair at once) against a program per row block (codegen/block_kernel.py), in one process:

    python bench/experiments/2026-11-26-one-program-classification/one_program.py [--seqs 4096,8192,16384]

For each case and each kernel (the module's builders called with one_program forced, replays and lists dropped
between): `control`, a tensor of the ids' size and dtype, not read by the mask, written before every call;
`new`, the mask's ids written before every call (lists rebuilt); `new - control`, what the rebuild costs a
call; and the classifying kernel's own time (torch.profiler). do_bench medians in microseconds, every output
checked against float64 first. A kernel that fails to compile at a length is reported and skipped.
`--warps 4,16` adds the one-program kernel with other warp counts (the module's text patched, called directly).
First it prints the floor of any one-program kernel at each length: one program of 8 warps that reads the ids
(int32, one load) and writes as many int32 as the lists take (one store), timed the same way.
`--floor` adds the variant `floor`: the module's builders replaced by that least kernel, launched as the
classifying kernel is (a dependent launch, recorded for replay), which reads the ids and copies the lists the
real builder made once: what any separate classifying kernel costs a call.
"""
import argparse
import functools
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/experiments/2026-11-26-per-call-classification"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from bench import common  # noqa: E402
from bench.suite.masks import check, masks, written_in_place  # noqa: E402
from bench.tools.mask_breakdown import kernel_times  # noqa: E402
from per_call import flex_case, global_flags  # noqa: E402


def forced(module, builders, one_program):
    """The module's classifying builders called with `one_program` (or replaced, where it is a dict of
    builders), its replays and block lists dropped."""
    for name, build in builders.items():
        setattr(module, name, one_program[name] if isinstance(one_program, dict)
                else functools.partial(build, one_program=one_program))
    for table in ("_REPLAYS", "_SEEN_ONCE", "_BUILDS", "_SEEN"):
        getattr(module, table).clear()


@triton.jit
def _read_and_write(ids_ptr, out_ptr, S, ROWS: tl.constexpr, COLS: tl.constexpr):
    at = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    ids = tl.load(ids_ptr + at, mask=at < S, other=0)
    tl.store(out_ptr + at, ids + 1, mask=at < S)


@triton.jit
def _copy_lists(ids_ptr, lists_ptr, out_ptr, S, N, ROWS: tl.constexpr, COLS: tl.constexpr, N_PAD: tl.constexpr,
                DEPENDENT: tl.constexpr):
    if DEPENDENT:
        gdc_wait()
        gdc_launch_dependents()
    at = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    ids = tl.load(ids_ptr + at, mask=at < S, other=0)
    slots = tl.arange(0, N_PAD)
    lists = tl.load(lists_ptr + slots, mask=slots < N)
    tl.store(out_ptr + slots, lists + tl.min(tl.min(ids, axis=1), axis=0) * 0, mask=slots < N)


def floor_builders(module, builders):
    """Builders that copy the lists their real builder made for the first tensors they saw, with a least
    kernel reading the first tensor (the ids) as the classifying kernel would."""
    made = {}

    def floor_build(build, *args, rec=None, one_program=None):
        ids = args[-1]
        if build not in made:
            made[build] = build(*args).clone()
        lists = made[build]
        lists = rec.constant(lists) if rec is not None else lists
        out = module._empty(rec, lists.shape, lists.dtype, ids.device)
        dependent = module._dependent_launch(ids.device)
        rows, n_pad = triton.next_power_of_2(-(-ids.numel() // 128)), triton.next_power_of_2(lists.numel())
        cfg = {"ROWS": rows, "COLS": 128, "N_PAD": n_pad, "DEPENDENT": dependent, "num_warps": 8, "num_stages": 1,
               "launch_pdl": dependent}
        module._launch(rec, _copy_lists, (1,), (ids, lists, out, ids.numel(), lists.numel()), cfg,
                       (rows, 128, n_pad, dependent))
        return out
    return {n: functools.partial(floor_build, b) for n, b in builders.items()}


def floor_us(S, block=128):
    """The profiled time of _read_and_write over S ids (what a one-program kernel cannot go below)."""
    ids = torch.arange(S, device="cuda", dtype=torch.int32)
    out = torch.empty_like(ids)
    rows = triton.next_power_of_2(-(-S // block))

    def fn():
        ids.add_(0)
        _read_and_write[(1,)](ids, out, S, ROWS=rows, COLS=block, num_warps=8)
    fn()
    return sum(us for n, us in kernel_times(fn, 30).items() if "_read_and_write" in n)


def with_warps(module, warps):
    """A copy of the module whose one-program classifying kernels run `warps` warps."""
    from neptune_eqsat.codegen import block_pairs
    from neptune_eqsat.runtime.loader import load_module
    text = Path(module.__file__).read_text()
    old = f"'DEPENDENT': dependent, 'num_warps': {block_pairs.WARPS}"
    assert old in text, "no one-program launch found"
    return load_module(text.replace(old, f"'DEPENDENT': dependent, 'num_warps': {warps}"),
                       Path(module.__file__).stem + f"_warps{warps}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=2, help="times to alternate the two kernels")
    ap.add_argument("--warps", default="", help="other warp counts of the one-program kernel")
    ap.add_argument("--floor", action="store_true", help="add the least separate kernel as a variant")
    ap.add_argument("--cases", default="document_causal,document,document_causal_gqa_softcap,"
                                       "document_causal_decode_q1,document_causal_decode_q4,global_flags")
    a = ap.parse_args()
    from neptune_eqsat import flex
    print(f"GPU: {common.gpu_name()}")
    for S in map(int, a.seqs.split(",")):
        print(f"floor at S={S}: one program reading the ids and writing as many: {floor_us(S):5.1f} us", flush=True)
        table = masks(S, "cuda")
        table["global_flags"] = global_flags(S)
        for name in a.cases.split(","):
            call, module, data, mask_mod, score_mod, q, k, v = flex_case(table[name], S)
            builders = {n: f for n, f in vars(module).items() if inspect.isfunction(f)
                        and "one_program" in inspect.signature(f).parameters}
            other = [t.clone() for t in data]
            captures = [flex._as_kernel_input(c, q.device) for c in data]
            variants = [("rows", module, False), ("pairs", module, True)]
            variants += [(f"pairs{w}", with_warps(module, int(w)), True) for w in a.warps.split(",") if w]
            if a.floor:
                variants.append(("floor", module, floor_builders(module, builders)))
            for _ in range(a.rounds):
                for kind, mod, one in variants:
                    mod_builders = {n: getattr(mod, n) for n in builders} if mod is not module else builders
                    forced(mod, mod_builders, one)
                    times = {}
                    try:
                        for label, written in (("control", other), ("new", data)):
                            def fn(written=written, mod=mod):
                                for t in written:
                                    written_in_place(t)
                                return call() if mod is module else mod.forward(q, k, v, *captures)
                            err, ok = check(fn(), q, k, v, mask_mod, score_mod)
                            assert ok, (name, S, kind, label, err)
                            times[label] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
                        builder = sum(us for n, us in kernel_times(fn, 30).items() if "_blocks" in n)
                    except Exception as e:   # (a forced one-program kernel at a length it is not chosen for)
                        print(f"{name:<28} S={S:<6} {kind:<7} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                        continue
                    cost = times["new"] - times["control"]
                    print(f"{name:<28} S={S:<6} {kind:<7} control {times['control']:8.1f} new {times['new']:8.1f} "
                          f"rebuild {cost:5.1f} ({100 * cost / times['control']:4.1f}%)  kernel {builder:5.1f}",
                          flush=True)
            forced(module, builders, None)


if __name__ == "__main__":
    main()
