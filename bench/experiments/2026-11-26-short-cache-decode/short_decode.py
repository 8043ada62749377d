"""Where does split decode lose time on a short cache (KV = 4k), where the issue's target is 85% of a copy of the
same bytes? Times the generated module of each decode operator over its tunables (chunks per kv head, key block,
warps) and under kernel edits, beside cuDNN, a copy of the same bytes and kernels that only read K and V:

    emitted        the module as generated, at the chunk counts, key blocks and warps of --grid
    nocombine      no program combines (the output is not written): what the combine costs at the end
    vearly         every key block's V load issued right after its K load, before the scores
    read_chunks    not attention: the split kernel's programs (kv head x chunk) only read their K and V blocks
    read_flat      not attention: K and V read as two flat arrays in blocks of 16-128 KB

With --graphs every system is captured in a CUDA graph and the timer replays the graph, so what is timed is the
GPU's work alone, however long the host takes to launch it.

    PYTHONPATH=. python bench/experiments/2026-11-26-short-cache-decode/short_decode.py
                           [--ops gqa_dc,causal_dc] [--kv 4096] [--rounds 3] [--variants emitted,nocombine,vearly]
                           [--reads] [--graphs]

Every variant that writes the output is compared with float64 first. Imports only torch and triton.
"""
import argparse
import importlib.util
import itertools
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton

from bench.common import FLUSH_BYTES, GENERATED, HEADS, cudnn_attention, load, time_in_rounds
from bench.suite.attention_systems import COPY_ROW, same_bytes_copy

_EARLIER = Path(__file__).parents[1] / "2026-11-22-gqa-decode-time" / "gqa_decode_variants.py"
_spec = importlib.util.spec_from_file_location("gqa_decode_variants", _EARLIER)
earlier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(earlier)   # its read-only kernels (read_systems)

UNCHECKED = (COPY_ROW, "nocombine", "read_chunks", "read_flat", "read_interleave", "read_dynamic")
GRID = ([(128, w, c) for w, c in itertools.product((4, 8), (0, 4, 8, 16, 32, 64))]
        + [(64, w, c) for w, c in itertools.product((4, 2), (16, 32, 64))] + [(32, 2, c) for c in (32, 64, 128)])
COMBINE_TEST = "if tl.atomic_add(ticket, 1) == tl.num_programs(2) - 1:"


def edit(src: str, variant: str) -> str:
    """The module source with one kernel edit (every key loop of the split kernel)."""
    if variant == "nocombine":
        assert COMBINE_TEST in src
        return src.replace(COMBINE_TEST, "if tl.atomic_add(ticket, 1) < 0:")
    if variant == "vearly":
        k_load = re.compile(r"^(\s+)(ld\d+) = (tl\.load\(k_ptr .*)$")
        v_load = re.compile(r"^(\s+)(ld\d+) = (tl\.load\(v_ptr .*)$")
        lines = src.splitlines()
        out, pending = [], None
        for line in lines:
            if (m := v_load.match(line)) and pending is not None:
                out.append(f"{m.group(1)}{m.group(2)} = v_early")
                pending = None
                continue
            out.append(line)
            if m := k_load.match(line):   # the V load of the same block, with the K load's mask form
                v_line = next(ln for ln in lines[lines.index(line):] if v_load.match(ln))
                out.append(f"{m.group(1)}v_early = {v_load.match(v_line).group(3)}")
                pending = True
        return "\n".join(out) + "\n"
    return src


def in_graph(fn):
    """fn captured in a CUDA graph (after three eager calls: compiled, recorded, replayed); returns the replay."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return lambda: (graph.replay(), out)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="gqa_dc,causal_dc")
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="emitted,nocombine,vearly")
    ap.add_argument("--reads", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graph replays of every system")
    args = ap.parse_args()
    clean = torch.empty(FLUSH_BYTES // 2, device="cuda", dtype=torch.float16).normal_()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__} triton {triton.__version__}", flush=True)
    folder = Path(tempfile.mkdtemp())
    for op in args.ops.split(","):
        hq, hkv = HEADS[op]
        src = (GENERATED / f"{op}.py").read_text()
        q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, hkv, args.kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                enable_gqa=hq != hkv)
        nbytes = (2 * q.numel() + 2 * k.numel()) * 2
        systems = {COPY_ROW: same_bytes_copy(nbytes), "cudnn": lambda: cudnn_attention(q, k, v)}
        if args.reads:
            systems.update(earlier.read_systems(k, v))
        for variant in args.variants.split(","):
            path = folder / f"{op}_{variant}.py"
            path.write_text(edit(src, variant))
            mod = load(path)
            systems[f"{variant} tuned"] = lambda mod=mod: mod.forward(q, k, v)
            grid = GRID if variant == "emitted" else [(128, 4, c) for c in (8, 16, 32)]
            for bj, w, c in grid:
                cfg = dict(BLOCK_J=bj, num_warps=w, CHUNKS=c, STREAM=1, USE_TMA=0, num_stages=1)
                systems[f"{variant} BJ={bj} w={w} chunks={c}"] = lambda mod=mod, cfg=cfg: mod.forward(q, k, v, config=cfg)
        if args.graphs:
            for name, fn in list(systems.items()):
                try:
                    systems[name] = in_graph(fn)
                except Exception as e:   # a config may not fit
                    print(f"  {name}: {type(e).__name__}: {str(e)[:80]}")
                    del systems[name]
        time_in_rounds(systems, clean, nbytes / 1e9, args.rounds, f"{op} KV={args.kv}", want, width=44,
                       checked=lambda name: name.split()[0] not in UNCHECKED)


if __name__ == "__main__":
    sys.exit(main())
