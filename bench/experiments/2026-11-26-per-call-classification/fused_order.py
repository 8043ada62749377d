"""Can a data-dependent mask's per-call classification cost <= 3% of the call? Two changes tried on the
generated modules' text, document masks at S = 4096 / 16384 with the ids written before every call:

    python bench/experiments/2026-11-26-per-call-classification/fused_order.py [--seqs 4096,16384]

- `rank`: the classifying kernel without its ordering step (the last program's ranking of row blocks, which
  costs a ticket and a serial tail); each attention program ranks the row blocks itself from their counts
  (the same order: decreasing work, ties in row order) and takes the one whose rank is its program index.
- `pdl`: both kernels launched as programmatic dependent launches: the classifying kernel lets the attention
  kernel launch at its start, and each waits for the grid before it (griddepcontrol.wait) before its reads.
Every variant's output is checked against float64 before it is timed (do_bench medians, microseconds).
It patches modules generated before dependent launches landed (run it from a checkout of 3d97981); on later
modules, whose kernels already take them, it stops: dependent_launch.py measures the landed change.
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
from bench.suite.masks import masks  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from per_call import case_tensors, module_call, timed  # noqa: E402

RANK = """
        n_rb_ = (L + BLOCK_I - 1) // BLOCK_I
        n_kb_ = (S + BLOCK_J - 1) // BLOCK_J
        me = tl.program_id(0)
        pid_row = 0
        for rc in range(0, n_rb_, 64):
            rows = rc + tl.arange(0, 64)
            live = rows < n_rb_
            at = blocks0_ptr + rows.to(tl.int64) * (2 * n_kb_ + 2)
            mine = tl.load(at, mask=live, other=-1) + tl.load(at + n_kb_ + 1, mask=live, other=0)
            rank = tl.zeros([64], tl.int32)
            for sc in range(0, n_rb_, 64):
                others = sc + tl.arange(0, 64)
                ok = others < n_rb_
                at2 = blocks0_ptr + others.to(tl.int64) * (2 * n_kb_ + 2)
                theirs = tl.load(at2, mask=ok, other=-1) + tl.load(at2 + n_kb_ + 1, mask=ok, other=0)
                ahead = (theirs[None, :] > mine[:, None]) | \\
                    ((theirs[None, :] == mine[:, None]) & (others[None, :] < rows[:, None]))
                rank += tl.sum(ahead.to(tl.int32), axis=1)
            pid_row += tl.sum(tl.where(live & (rank == me), rows, 0), axis=0)
"""


def variant(module, rank, pdl, keys=2048):
    from neptune_eqsat.runtime.loader import load_module
    text = Path(module.__file__).read_text()
    if "DEPENDENT: tl.constexpr" in text:
        sys.exit("these modules launch as dependents already: run dependent_launch.py, or this from 3d97981")
    if rank:
        text, n = re.subn(r"    if tl\.atomic_add\(tickets_ptr, 1\) == tl\.num_programs\(0\) - 1:\n.*\n.*\n",
                          "", text)
        assert n >= 1, "no ordering step found"
        text, n = re.subn(r"(    elif ROW_ORDER == 1:\n        pid_grid = tl\.program_id\(1\)\n)        pid_row = .*\n",
                          lambda m: m.group(1) + RANK.lstrip("\n"), text)
        assert n == 1, "no row order to replace"
    if pdl:
        text = text.replace("import triton.language as tl\n",
                            "import triton.language as tl\nfrom triton.language.extra.cuda import gdc_wait, "
                            "gdc_launch_dependents\n", 1)
        text, n = re.subn(r'(def _\w+_blocks0_kernel\(.*\n    """.*"""\n)',
                          lambda m: m.group(1) + "    gdc_wait()\n    gdc_launch_dependents()\n", text)
        assert n == 1, "no classifying kernel"
        text, n = re.subn(r"(\n    ONE_LOOP: tl.constexpr,\n\):\n)", lambda m: m.group(1) + "    gdc_wait()\n", text)
        assert n == 1, "no attention kernel"
        text = text.replace("'num_warps': 4, 'num_stages': 1}", "'num_warps': 4, 'num_stages': 1, 'launch_pdl': True}")
    text = text.replace("chunk = max(1, 2048 // BLOCK_LOOP)", f"chunk = max(1, {keys} // BLOCK_LOOP)")
    return load_module(text, Path(module.__file__).stem + f"_r{int(rank)}_p{int(pdl)}_{keys}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--cases", default="document_causal,document,document_causal_gqa_softcap")
    a = ap.parse_args()
    from neptune_eqsat import flex
    print(f"GPU: {common.gpu_name()}")
    x = torch.zeros(1, device="cuda")
    print(f"add_ alone {triton.testing.do_bench(lambda: x.add_(0), warmup=25, rep=200, return_mode='median') * 1e3:.1f} us")
    for S in map(int, a.seqs.split(",")):
        table = masks(S, "cuda")
        for name in a.cases.split(","):
            mask_mod, score_mod, hkv, q, k, v = case_tensors(table[name], S)
            flex.flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=hkv != 32)
            flex.wait_for_compiles() if hasattr(flex, "wait_for_compiles") else None
            data = [c.cell_contents for c in mask_mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
            compiled = flex._module_for(flex._plan(score_mod, mask_mod, None, hkv != 32), q, k, v)
            captures = [flex._as_kernel_input(c, q.device) for c in data]
            line = f"{name:<28} S={S:<6}"
            for label, rank, pdl, keys, write in [
                    ("same", 0, 0, 2048, 0), ("new", 0, 0, 2048, 1),
                    ("same_rank", 1, 0, 2048, 0), ("new_rank", 1, 0, 2048, 1),
                    ("same_pdl", 0, 1, 2048, 0), ("new_pdl", 0, 1, 2048, 1),
                    ("same_rank_pdl", 1, 1, 2048, 0), ("new_rank_pdl", 1, 1, 2048, 1),
                    ("new_rank_pdl_4096", 1, 1, 4096, 1)]:
                module = compiled.module if not (rank or pdl or keys != 2048) else variant(compiled.module, rank,
                                                                                           pdl, keys)
                config = {"ROW_ORDER": 1, "launch_pdl": True} if pdl else {"ROW_ORDER": 1}
                fn = module_call(module, (q, k, v, *captures), config, captures if write else ())
                us, build = timed(fn, q, k, v, mask_mod, score_mod, (name, S, label))
                line += f"  {label} {us:7.1f} ({build:4.1f})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
