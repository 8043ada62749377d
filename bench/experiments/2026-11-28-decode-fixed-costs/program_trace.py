"""Where a split decode call's time goes, program by program: each program of the split kernel records the
GPU's global timer when it starts, when its key loop ends, before its ticket, when (as the last of its tile)
it starts the combine, and when it ends, with its multiprocessor.

    python bench/experiments/2026-11-28-decode-fixed-costs/program_trace.py write GENERATED_DIR OUT_DIR [OPS]
    python bench/experiments/2026-11-28-decode-fixed-costs/program_trace.py time OUT_DIR [OPS]

`write` (standard library only) copies each decode module with the timer stores added (a parameter
`trace_ptr`, the module's global TRACE, and replay off: the recorder knows only the module's own tensors);
`time` (on the GPU) flushes the L2 cache (256 MB zeroed) before each of 30 calls and prints the medians, in us
from the first program's start: `span` (to the last program's end), `start_max` (the last program's start),
`loop_med`/`loop_max` (a program's key loop), `loop_end_max`, `store_med` (partials stored and the barrier),
`comb_start_max` (the last combine's start), `comb_med` (a combine). Time outside the span (the launch, the
flush's dirty lines) is what a call timed with events adds.
"""
import statistics
import sys
from pathlib import Path

HEADS = {"gqa_dc": (64, 8), "softcap_dc": (32, 16), "causal_dc": (32, 32), "alibi_dc": (32, 32)}
STAMP = "tl.store(_tr + {k}, tl.extra.cuda.globaltimer().to(tl.int64))"


def traced(src: str) -> str:
    def once(old, new):
        nonlocal src
        assert old in src, old
        src = src.replace(old, new, 1)
    once("chunk_len, N_J_CHUNKS, tickets_ptr,\n", "chunk_len, N_J_CHUNKS, tickets_ptr, trace_ptr,\n")
    src = src.replace("N_J_CHUNKS, tickets,", "N_J_CHUNKS, tickets, TRACE,")
    program = "(tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)"
    once("    pid_chunk = tl.program_id(2)\n",
         f"    pid_chunk = tl.program_id(2)\n    _tr = trace_ptr + ({program}) * 6\n"
         f"    {STAMP.format(k=0)}\n    tl.store(_tr + 5, tl.extra.cuda.smid().to(tl.int64))\n")
    once("    # this chunk's partial results\n", f"    {STAMP.format(k=1)}\n    # this chunk's partial results\n")
    once("        tl.debug_barrier()\n        ticket =", f"        tl.debug_barrier()\n        {STAMP.format(k=2)}\n"
         "        ticket =")
    once("            tl.store(ticket, 0)\n", f"            tl.store(ticket, 0)\n            {STAMP.format(k=3)}\n")
    end = src.index("\n\n\n", src.index("    if COMBINE_IN_KERNEL:\n"))
    src = src[:end] + f"\n    {STAMP.format(k=4)}" + src[end:]
    once('def _replay_enabled():\n    return getattr(triton, "knobs", None) is not None',
         "def _replay_enabled():\n    return False")
    return src.replace("\nCONFIG = ", "\nTRACE = None\nCONFIG = ", 1)


def time(folder: Path, ops: list[str]) -> None:
    import importlib.util
    import torch
    print(torch.cuda.get_device_name())
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    for op in ops:
        spec = importlib.util.spec_from_file_location(op, folder / f"{op}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        hq, hkv = HEADS[op]
        for kv in (4096, 32768):
            q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, hkv, kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
            mod.TRACE = torch.zeros(4096 * 6, dtype=torch.int64, device="cuda")
            for _ in range(3):
                mod.forward(q, k, v)
            rows = []
            for _ in range(30):
                mod.TRACE.zero_()
                flush.zero_()
                mod.forward(q, k, v)
                torch.cuda.synchronize()
                t = mod.TRACE.view(-1, 6).cpu()
                t = t[t[:, 0] > 0]
                rel = (t[:, :5] - t[:, 0].min()).double() / 1000
                comb = rel[t[:, 3] > 0]
                rows.append(dict(programs=len(t), span=rel[:, 4].max().item(), start_max=rel[:, 0].max().item(),
                                 loop_med=(rel[:, 1] - rel[:, 0]).median().item(),
                                 loop_max=(rel[:, 1] - rel[:, 0]).max().item(), loop_end_max=rel[:, 1].max().item(),
                                 store_med=(rel[:, 2] - rel[:, 1]).median().item(),
                                 comb_start_max=comb[:, 3].max().item(),
                                 comb_med=(comb[:, 4] - comb[:, 3]).median().item(),
                                 sms=len(set(t[:, 5].tolist()))))
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            print(op, kv, "  ".join(f"{key} {val:.2f}" for key, val in med.items()), flush=True)


if __name__ == "__main__":
    default = "gqa_dc,softcap_dc,causal_dc"
    if sys.argv[1] == "write":
        src, out = Path(sys.argv[2]), Path(sys.argv[3])
        out.mkdir(parents=True, exist_ok=True)
        for op in (sys.argv[4] if len(sys.argv) > 4 else default).split(","):
            (out / f"{op}.py").write_text(traced((src / f"{op}.py").read_text()))
    else:
        time(Path(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else default).split(","))
