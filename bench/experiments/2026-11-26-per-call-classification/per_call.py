"""What a data-dependent mask's per-call classification costs, and what the row order it computes buys:
document masks (and a data-dependent skewed mask: global tokens flagged by a bool tensor) through
neptune_eqsat.flex_attention, with the mask's tensors written before every call:

    python bench/experiments/2026-11-26-per-call-classification/per_call.py [--seqs 4096,16384]

For each case: the call with its tensors unchanged (`same`), with them written before every call (`new`), under
ROW_ORDER 1 (the default: row blocks in the classifying kernel's order of decreasing work) and 0 (the natural
order), and `new_unordered`: the classifying kernel without its ordering step (the last program's ranking),
which only ROW_ORDER 0 may use. Prints do_bench medians and the classifying kernel's time (torch.profiler);
every output is checked against float64 first.
"""
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from bench import common  # noqa: E402
from bench.suite.masks import D, check, masks, written_in_place  # noqa: E402
from bench.tools.mask_breakdown import kernel_times  # noqa: E402


def global_flags(S):
    flags = torch.zeros(S, dtype=torch.bool, device="cuda")
    flags[torch.randperm(S, device="cuda")[:16]] = True

    def mask_mod(b, h, i, j):
        return flags[i] | flags[j] | (i >= j) & (i - j < 256)
    return mask_mod, None, 32


def unordered(module, warps=4, keys=2048):
    """The module with the ordering step of its classifying kernels removed, `warps` warps per program, `keys`
    keys summarized at once."""
    from neptune_eqsat.runtime.loader import load_module
    text = Path(module.__file__).read_text()
    text, n = re.subn(r"    if tl\.atomic_add\(tickets_ptr, 1\) == tl\.num_programs\(0\) - 1:\n.*\n.*\n",
                      "", text)
    assert n >= 1, "no ordering step found"
    text = text.replace("chunk = max(1, 2048 // BLOCK_LOOP)", f"chunk = max(1, {keys} // BLOCK_LOOP)")
    text = re.sub(r"('ORDER_CHUNK': 64, 'num_warps': )4", rf"\g<1>{warps}", text)
    return load_module(text, Path(module.__file__).stem + f"_unordered_{warps}_{keys}")


def case_tensors(entry, S):
    """(mask_mod, score_mod, kv heads, q, k, v) of a table entry of bench.suite.masks at length S."""
    mask_mod, score_mod, hkv, *decode = entry
    g = torch.Generator(device="cuda").manual_seed(S)
    q = torch.randn(1, 32, decode[0] if decode else S, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(1, hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
    return mask_mod, score_mod, hkv, q, k, torch.randn_like(k)


def flex_case(entry, S):
    """A table entry of bench.suite.masks through neptune_eqsat.flex_attention, compiled and waited for:
    (call, its generated module, the tensors its mask captures, mask_mod, score_mod, q, k, v)."""
    import neptune_eqsat
    from neptune_eqsat import flex
    mask_mod, score_mod, hkv, q, k, v = case_tensors(entry, S)

    def call():
        return flex.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=hkv != 32)
    call()
    neptune_eqsat.wait_for_compiles()
    module = flex._module_for(flex._plan(score_mod, mask_mod, None, hkv != 32), q, k, v).module
    data = [c.cell_contents for c in mask_mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    return call, module, data, mask_mod, score_mod, q, k, v


def module_call(module, inputs, config, written=()):
    """A call of the module's forward, the tensors `written` written in place before it (new data)."""
    def fn():
        for t in written:
            written_in_place(t)
        return module.forward(*inputs, config=config)
    return fn


def timed(fn, q, k, v, mask_mod, score_mod, what):
    """fn's output checked against float64, then its do_bench median (us) and its classifying kernels' time."""
    err, ok = check(fn(), q, k, v, mask_mod, score_mod)
    assert ok, (what, err)
    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    return ms * 1e3, sum(us for n, us in kernel_times(fn, 30).items() if "_blocks" in n)


@triton.jit
def _nothing(x_ptr):
    pass


def launch_floor():
    """do_bench of an add_ on a 4-byte tensor followed by an empty Triton kernel: the least any rebuild costs."""
    x = torch.zeros(1, device="cuda")
    _nothing[(32,)](x)

    def fn():
        x.add_(0)
        _nothing[(32,)](x)
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3, \
        triton.testing.do_bench(lambda: x.add_(0), warmup=25, rep=200, return_mode="median") * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--cases", default="document_causal,document,document_causal_gqa_softcap,"
                                       "document_causal_decode_q1,document_causal_decode_q4,global_flags")
    a = ap.parse_args()
    from neptune_eqsat import flex
    print(f"GPU: {common.gpu_name()}")
    both, add_only = launch_floor()
    print(f"floor: add_ + empty kernel {both:.1f} us, add_ alone {add_only:.1f} us")
    for S in map(int, a.seqs.split(",")):
        table = masks(S, "cuda")
        table["global_flags"] = global_flags(S)
        for name in a.cases.split(","):
            mask_mod, score_mod, hkv, q, k, v = case_tensors(table[name], S)
            flex.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=hkv != 32)
            data = [c.cell_contents for c in (mask_mod.__closure__ or ()) if isinstance(c.cell_contents, torch.Tensor)]
            plan = flex._plan(score_mod, mask_mod, None, hkv != 32)
            compiled = flex._module_for(plan, q, k, v)
            captures = [flex._as_kernel_input(c, q.device) for c in data]
            line = f"{name:<28} S={S:<6}"
            for label, module, order, write in [("same", compiled.module, 1, False), ("new", compiled.module, 1, True),
                                                ("same_natural", compiled.module, 0, False),
                                                ("new_natural", compiled.module, 0, True),
                                                ("new_unordered", unordered(compiled.module), 0, True),
                                                ("new_unordered_8w_4096", unordered(compiled.module, 8, 4096), 0,
                                                 True)]:
                config = {"ROW_ORDER": order} if "ROW_ORDER" in module.CONFIG else None
                if config is None and label.endswith("natural"):
                    continue
                fn = module_call(module, (q, k, v, *captures), config, captures if write else ())
                us, build = timed(fn, q, k, v, mask_mod, score_mod, (name, S, label))
                line += f"  {label} {us:8.1f} us ({build:5.2f})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
