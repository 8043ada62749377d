"""The split decode kernel's combine spread over the last SPLIT_E programs of a tile instead of the last one:
each of them takes 128 / SPLIT_E of the value columns (the chunks' max and sum are read by all of them, the
O partials once), so the serial tail a program_trace.py run measured (1.6 us at KV 4k, 3.6 us at 32k for
grouped-query) shrinks toward its share.

The last SPLIT_E programs of a tile to take a ticket wait (spinning on the ticket) until the tile's every program
has taken one. They are running, and at most SPLIT_E - 1 a tile wait, so the programs they wait for can start as
long as the grid's tiles times (SPLIT_E - 1) is below the programs the GPU holds at once. Tickets count up and
are never reset (int64), a call's generation being ticket // chunks.

    python bench/experiments/2026-11-28-decode-fixed-costs/spread_combine.py write GENERATED_DIR OUT_DIR [OPS]
    python bench/experiments/2026-11-28-decode-fixed-costs/spread_combine.py time GENERATED_DIR OUT_DIR [OPS]

`write` (standard library only) writes OUT_DIR/{op}_spread{2,4,8}.py from each decode module (and
{op}_no_replay.py, the module launching from Python like them); `time` (on the GPU)
checks each against float64 (KV 4k and 32k; three calls, the tickets running on) and times
them, replayed from CUDA graphs, with the modules as generated and a copy of
the same bytes, in turns (bench.suite.attention.cuda_timer).
"""
import re
import sys
from pathlib import Path

HEADS = {"gqa_dc": (64, 8), "softcap_dc": (32, 16), "causal_dc": (32, 32), "alibi_dc": (32, 32)}
SPREADS = (2, 4, 8)


def without_replay(src: str) -> str:
    """Launches from Python each call (the spread modules' tickets are not the recorder's kind)."""
    old = 'def _replay_enabled():\n    return getattr(triton, "knobs", None) is not None'
    assert old in src
    return src.replace(old, "def _replay_enabled():\n    return False", 1)


def spread(src: str, op: str, split: int) -> str:
    def once(old, new, text):
        assert text.count(old) >= 1, old
        return text.replace(old, new, 1)
    cut = src.index(f"def {op}_combine_kernel(")
    tile, rest = src[:cut], src[cut:]
    tile = once("    ONE_LOOP: tl.constexpr,\n):", "    ONE_LOOP: tl.constexpr,\n    e_lo, E_BLOCK: tl.constexpr,\n):",
                tile)
    tile = once("    offs_e = tl.arange(0, 128)\n", "    offs_e = e_lo + tl.arange(0, E_BLOCK)\n", tile)
    tile, n = re.subn(r"tl\.full\(\[(BLOCK_I\w*), 128\]", r"tl.full([\1, E_BLOCK]", tile)
    assert n == 1, n
    rows = "BLOCK_I_H" if "BLOCK_I_H" in tile else "BLOCK_I"   # the combine kernel's call of the tile
    rest = once(f"SKV, {rows}, BLOCK_J_CHUNK, ONE_LOOP)", f"SKV, {rows}, BLOCK_J_CHUNK, ONE_LOOP, 0, 128)", rest)
    rest = once("        if tl.atomic_add(ticket, 1) == tl.num_programs(2) - 1:\n            tl.store(ticket, 0)\n",
                "        arrivals = tl.num_programs(2)\n"
                "        t = tl.atomic_add(ticket, 1)\n"
                "        pos = t % arrivals\n"
                f"        if pos >= arrivals - {split}:\n"
                "            target = t - pos + arrivals\n"
                "            while tl.atomic_add(ticket, 0) < target:\n"
                "                pass\n"
                f"            e_lo = (pos - (arrivals - {split})) * {128 // split}\n", rest)
    rest, n = re.subn(r"(COMBINE_BLOCK_J_CHUNK, COMBINE_ONE_LOOP)\)\n", rf"\1, e_lo, {128 // split})\n", rest)
    assert n == 1, n
    rest = once("dtype=torch.int32)\n    return t\n", "dtype=torch.int64)\n    return t\n", rest)
    return without_replay(tile + rest)


def time(generated: Path, folder: Path, ops: list[str]) -> None:
    import importlib.util
    import math

    import torch

    from bench.suite import attention
    print(torch.cuda.get_device_name(), flush=True)
    timer = attention.cuda_timer(50, 300)

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    for op in ops:
        hq, hkv = HEADS[op]
        mods = {"generated": load(generated / f"{op}.py", op)}
        mods["no_replay"] = load(folder / f"{op}_no_replay.py", f"{op}_no_replay")
        mods.update({f"spread{s}": load(folder / f"{op}_spread{s}.py", f"{op}_spread{s}") for s in SPREADS})
        for kv in (4096, 32768):
            q = torch.randn(1, hq, 1, 128, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, hkv, kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
            ref_mod = mods["generated"]
            ok = {}
            for name, mod in mods.items():
                outs = [mod.forward(q, k, v).double() for _ in range(3)]   # tickets across calls
                ref = ref_mod.forward(q, k, v).double() if name != "generated" else None
                kk, vv = (x.double().repeat_interleave(hq // hkv, 1) for x in (k, v))
                exact = None
                if op == "gqa_dc":
                    exact = torch.softmax(q.double() @ kk.transpose(-1, -2) / math.sqrt(128), -1) @ vv
                err = max((o - (exact if exact is not None else ref if ref is not None else o)).abs().max().item()
                          for o in outs)
                ok[name] = err < 2e-3
                print(f"{op} KV={kv} {name:10s} max error {err:.2e}", flush=True)
            nbytes = 2 * (2 * q.numel() + 2 * k.numel())
            src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float16).normal_()
            dst = torch.empty_like(src)
            calls = {}
            for n, m in mods.items():   # replayed from CUDA graphs: Python launches cost more than these kernels
                if ok[n]:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        m.forward(q, k, v)
                    calls[n] = graph.replay
            calls["same_bytes_copy"] = lambda: dst.copy_(src)
            times = {n: [] for n in calls}
            for _ in range(3):
                for n, fn in calls.items():
                    times[n].append(timer(fn))
            copy = sorted(times["same_bytes_copy"])[1]
            for n, ts in times.items():
                ms = sorted(ts)[1]
                print(f"{op} KV={kv} {n:16s} {ms * 1e3:7.1f} us  copy / this {copy / ms:6.1%}  rounds "
                      f"{' '.join(f'{t * 1e3:.1f}' for t in ts)}", flush=True)


if __name__ == "__main__":
    default = "gqa_dc,softcap_dc,causal_dc,alibi_dc"
    ops = (sys.argv[4] if len(sys.argv) > 4 else default).split(",")
    src, out = Path(sys.argv[2]), Path(sys.argv[3])
    if sys.argv[1] == "write":
        out.mkdir(parents=True, exist_ok=True)
        for op in ops:
            (out / f"{op}_no_replay.py").write_text(without_replay((src / f"{op}.py").read_text()))
            for s in SPREADS:
                (out / f"{op}_spread{s}.py").write_text(spread((src / f"{op}.py").read_text(), op, s))
    else:
        time(src, out, ops)
