"""Masks people write, through neptune_eqsat.flex_attention against torch's FlexAttention.

    python -m bench.suite.masks [--seqs 4096,16384] [--dtypes f16,bf16] [--masks NAME,...] [--heads 32] [--out DIR]

For each mask (a mask_mod, sometimes with a score_mod or GQA), prefill at B = 1, D = 128, and decoding (1 and 4
queries at the last positions, GQA 32/8) with the document mask; with --backward, the backward of the prefill
masks (autograd.grad on the graph of one forward), gradients checked against float64 autograd:
- `neptune`: neptune_eqsat.flex_attention with the callables, as a user calls it (its block lists come from the
  predicate: once per sizes for a mask of positions, at every call for one that reads a tensor);
- `neptune_new_data`: the same with the mask's captured tensors written before every call (new data each batch);
- `flex`: torch's FlexAttention under torch.compile with its block mask built once beforehand;
- `flex_per_call`: the same with create_block_mask called on every call (as when the mask's data change);
- `flex_flash`: FlexAttention's FlashAttention-4 backend (kernel_options={"BACKEND": "FLASH"}), where installed.
Every output is checked against float64 attention on a sample of rows and heads; each system is timed in
--rounds rounds taken in turns (the median round is reported). Needs a CUDA GPU and the
compiler (egglog) beside torch and triton, or a kernel cache filled for these masks and lengths on a machine
with the compiler (`bench.tools.flex_cache --masks`, NEPTUNE_EQSAT_CACHE pointing at it). Writes masks.json, masks.md and masks.png (where matplotlib
imports) to --out (default $OUT, else bench/results/<gpu>/<date>-masks).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench import common

common.import_package()   # neptune_eqsat from this checkout
D = 128
CHECK_ROWS = 256


# ---- the masks: (mask_mod, score_mod, kv heads) built for a sequence length ---------------------------------
def documents(S, n, device, seed=0):
    """Jagged document lengths summing to S, a document id per position."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(S - 1, generator=g)[:n - 1] + 1).values
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([S])]))
    return torch.repeat_interleave(torch.arange(n), lengths).to(device=device, dtype=torch.int32)


def masks(S, device, doc=None):
    """name -> (mask_mod, score_mod, kv heads[, query length: decode, else S]); `doc` is the document id per position the document masks read."""
    doc = documents(S, 8, device) if doc is None else doc
    side = int(math.isqrt(S))
    t3 = 16
    hw = int(math.isqrt(S // t3))

    def causal(b, h, i, j):
        return i >= j

    def document_causal(b, h, i, j):
        return (doc[i] == doc[j]) & (i >= j)

    def document(b, h, i, j):
        return doc[i] == doc[j]

    prefix = S // 4

    def prefix_lm(b, h, i, j):
        return (j < prefix) | (i >= j)

    def window_sinks(b, h, i, j):
        return (i >= j) & ((i - j < 1024) | (j < 4))

    def dilated(b, h, i, j):
        return (i >= j) & (i - j < 2048) & ((i - j) % 2 == 0)

    def neighborhood_2d(b, h, i, j):
        return ((i // side - j // side).abs() <= 8) & ((i % side - j % side).abs() <= 8)

    def natten_2d(b, h, i, j):   # a window of 17 x 17 clamped inside the image (NATTEN)
        ci = (i // side).clamp(8, side - 9)
        cj = (i % side).clamp(8, side - 9)
        return ((ci - j // side).abs() <= 8) & ((cj - j % side).abs() <= 8)

    def neighborhood_3d(b, h, i, j):
        ti, tj = i // (hw * hw), j // (hw * hw)
        yi, yj = (i // hw) % hw, (j // hw) % hw
        xi, xj = i % hw, j % hw
        return ((ti - tj).abs() <= 2) & ((yi - yj).abs() <= 4) & ((xi - xj).abs() <= 4)

    def chunked_causal(b, h, i, j):
        return (i // 1024 == j // 1024) & (i >= j)

    def block_causal(b, h, i, j):
        return i // 512 >= j // 512

    def global_tokens(b, h, i, j):
        return ((i - j).abs() <= 256) | (i < 16) | (j < 16)

    bias = torch.randn(32, 513, device=device)

    def relative_bias(score, b, h, i, j):
        return score + bias[h, (i - j).clamp(-256, 256) + 256]

    def softcap(score, b, h, i, j):
        return 30.0 * torch.tanh(score / 30.0)

    def decoding(L):   # the last L positions as queries (q_idx counts from 0 in the query tensor)
        def document_causal_decode(b, h, i, j):
            return (doc[i + S - L] == doc[j]) & (i + S - L >= j)
        return document_causal_decode

    return {
        "document_causal_decode_q1": (decoding(1), None, 8, 1),
        "document_causal_decode_q4": (decoding(4), None, 8, 4),
        "document_causal": (document_causal, None, 32),
        "document": (document, None, 32),
        "prefix_lm": (prefix_lm, None, 32),
        "window_sinks": (window_sinks, None, 32),
        "dilated_window": (dilated, None, 32),
        "neighborhood_2d": (neighborhood_2d, None, 32),
        "natten_2d": (natten_2d, None, 32),
        "neighborhood_3d": (neighborhood_3d, None, 32),
        "chunked_causal": (chunked_causal, None, 32),
        "block_causal": (block_causal, None, 32),
        "global_tokens": (global_tokens, None, 32),
        "relative_bias_causal": (causal, relative_bias, 32),
        "document_causal_gqa_softcap": (document_causal, softcap, 8),
    }


# ---- float64 reference on sampled rows ------------------------------------------------------------------------
def reference_rows(q, k, v, mask_mod, score_mod, rows, heads):
    """float64 attention output at (head, row) for the given heads and rows."""
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv   # FlexAttention's own broadcasting of mods
    S = k.shape[2]
    groups = q.shape[1] // k.shape[1]
    outs = []
    for h in heads:
        qh = q[0, h, rows].double()
        kh, vh = k[0, h // groups].double(), v[0, h // groups].double()
        s = qh @ kh.T / math.sqrt(D)
        b_, h_ = torch.zeros(1, dtype=torch.int32, device=q.device), torch.full((1,), h, dtype=torch.int32, device=q.device)
        qi = rows.to(torch.int32)
        kj = torch.arange(S, device=q.device, dtype=torch.int32)
        if score_mod is not None:
            fn = _vmap_for_bhqkv(score_mod, prefix=(0,))
            s = fn(s[None, None], b_, h_, qi, kj)[0, 0]
        keep = _vmap_for_bhqkv(mask_mod, prefix=())(b_, h_, qi, kj)[0, 0]
        s = s.masked_fill(~keep, -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        outs.append(p @ vh)
    return torch.stack(outs)


def check(out, q, k, v, mask_mod, score_mod):
    g = torch.Generator(device="cpu").manual_seed(1)
    rows = torch.randperm(q.shape[2], generator=g)[:CHECK_ROWS].sort().values.to(q.device)
    heads = [0, q.shape[1] - 1]
    ref = reference_rows(q, k, v, mask_mod, score_mod, rows, heads)
    got = torch.stack([out[0, h, rows].double() for h in heads])
    err = (got - ref).abs().max().item()
    tol = 2e-2 if q.dtype == torch.bfloat16 else 5e-3
    return err, err <= tol and math.isfinite(err)


def check_gradients(grads, q, k, v, mask_mod, score_mod, grad):
    """Largest error of the gradients (dq, dk, dv) relative to their scale, against float64 autograd of the
    plain math with FlexAttention's broadcasting of the callables: every query head of KV head 0 and that KV
    head's dK and dV up to 4096 keys; beyond (where the reference would not fit), dQ of 256 sampled rows of
    query head 0."""
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv
    S, group = k.shape[2], q.shape[1] // k.shape[1]
    full = S <= 4096
    g = torch.Generator(device="cpu").manual_seed(2)
    rows = (torch.arange(S) if full else torch.randperm(S, generator=g)[:256].sort().values).to(q.device)
    kd, vd = (t.detach()[0, 0].double().requires_grad_() for t in (k, v))
    b_ = torch.zeros(1, dtype=torch.int32, device=q.device)
    kj = torch.arange(S, device=q.device, dtype=torch.int32)
    errors = []

    def error(got, want):
        err = (got.double() - want).abs().max().item() / max(1.0, want.abs().max().item())
        return err if math.isfinite(err) else math.inf
    for h in range(group if full else 1):
        qd = q.detach()[0, h, rows].double().requires_grad_()
        h_ = torch.full((1,), h, dtype=torch.int32, device=q.device)
        s = qd @ kd.T / math.sqrt(D)
        if score_mod is not None:
            s = _vmap_for_bhqkv(score_mod, prefix=(0,))(s[None, None], b_, h_, rows.to(torch.int32), kj)[0, 0]
        keep = _vmap_for_bhqkv(mask_mod, prefix=())(b_, h_, rows.to(torch.int32), kj)[0, 0]
        p = torch.softmax(s.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0)
        (p @ vd).backward(grad[0, h, rows].double())
        errors.append(error(grads[0][0, h, rows], qd.grad))
    if full:
        errors += [error(grads[1][0, 0], kd.grad), error(grads[2][0, 0], vd.grad)]
    err = max(errors)
    return err, err <= (5e-2 if q.dtype == torch.bfloat16 else 1e-2)


def backward_of(call, q, k, v, grad):
    """The backward of call's graph (its forward run once), as autograd.grad on the kept graph."""
    out = call()
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


# ---- systems ----------------------------------------------------------------------------------------------------
def neptune_call(q, k, v, mask_mod, score_mod):
    from neptune_eqsat import flex_attention
    gqa = q.shape[1] != k.shape[1]
    return lambda: flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=gqa)


def flex_call(q, k, v, mask_mod, score_mod, per_call=False, backend=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    L, S, gqa = q.shape[2], k.shape[2], q.shape[1] != k.shape[1]
    compiled = torch.compile(flex_attention, dynamic=False)
    options = {"BACKEND": backend} if backend else None
    if per_call:
        return lambda: compiled(q, k, v, score_mod=score_mod, enable_gqa=gqa, kernel_options=options,
                                block_mask=create_block_mask(mask_mod, None, None, L, S, device=q.device))
    bm = create_block_mask(mask_mod, None, None, L, S, device=q.device)
    return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=gqa, kernel_options=options)


def written_in_place(t):
    """t, its values unchanged but written in place (torch counts the write in its version), as new data is."""
    return t.logical_and_(t) if t.dtype == torch.bool else t.add_(0)


def neptune_new_data_call(q, k, v, mask_mod, score_mod):
    """neptune with the mask's tensors written before every call (new document ids every batch), so tables built
    from their values are built again; the same as `neptune` for a mask of positions only."""
    fn = neptune_call(q, k, v, mask_mod, score_mod)
    data = [c.cell_contents for c in (mask_mod.__closure__ or ()) if isinstance(c.cell_contents, torch.Tensor)]
    return lambda: ([written_in_place(t) for t in data], fn())[1]


SYSTEMS = {"neptune": neptune_call, "neptune_new_data": neptune_new_data_call, "flex": flex_call,
           "flex_per_call": lambda *a: flex_call(*a, per_call=True),
           "flex_flash": lambda *a: flex_call(*a, backend="FLASH")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--dtypes", default="f16")
    ap.add_argument("--masks", default="")
    ap.add_argument("--systems", default="neptune,neptune_new_data,flex,flex_per_call,flex_flash")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rep", type=int, default=200, help="timing: ms of repetitions (triton do_bench)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, the systems in turns; the median is kept")
    ap.add_argument("--out", default=None, help="default $OUT, else bench/results/<gpu>/<date>-masks")
    ap.add_argument("--replot", default="", help="only draw masks.png from DIR/masks.json")
    ap.add_argument("--backward", action="store_true",
                    help="time the backward (autograd.grad on the kept graph) of the prefill masks instead")
    a = ap.parse_args()
    if a.replot:
        print("wrote masks.png" if plot(json.loads((Path(a.replot) / "masks.json").read_text()), Path(a.replot))
              else "matplotlib is missing")
        return
    import triton.testing
    torch._dynamo.config.recompile_limit = 1 << 16   # one FlexAttention compile per mask and shape, all kept
    torch._dynamo.config.accumulated_recompile_limit = 1 << 16
    out_dir = Path(a.out) if a.out else common.default_out("masks")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    device = "cuda"
    name = common.gpu_name()
    for dt in a.dtypes.split(","):
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
        for S in map(int, a.seqs.split(",")):
            table = masks(S, device)
            for mask_name, (mask_mod, score_mod, hkv, *decode) in table.items():
                if a.masks and mask_name not in a.masks.split(",") or a.backward and decode:
                    continue
                g = torch.Generator(device=device).manual_seed(S)
                q = torch.randn(1, a.heads, decode[0] if decode else S, D, device=device, dtype=dtype, generator=g)
                k = torch.randn(1, hkv, S, D, device=device, dtype=dtype, generator=g)
                v = torch.randn(1, hkv, S, D, device=device, dtype=dtype, generator=g)
                grad = torch.randn(q.shape, device=device, dtype=dtype, generator=g)
                for t in (q, k, v) if a.backward else ():
                    t.requires_grad_()
                row = {"gpu": name, "mask": mask_name, "S": S, "dtype": dt, "backward": a.backward}
                calls = {}
                for system in a.systems.split(","):
                    try:
                        fn = SYSTEMS[system](q, k, v, mask_mod, score_mod)
                        fn = backward_of(fn, q, k, v, grad) if a.backward else fn
                        t0 = time.perf_counter()
                        out = fn()
                        torch.cuda.synchronize()
                        first = time.perf_counter() - t0
                        if system.startswith("neptune"):   # a first call's quick kernels give way to the tuned ones
                            common.import_package().wait_for_compiles()
                            out = fn()
                        err, ok = (check_gradients(out, q, k, v, mask_mod, score_mod, grad) if a.backward
                                   else check(out, q, k, v, mask_mod, score_mod))
                        del out
                        row[system] = {"ms": None, "err": err, "ok": ok, "first_s": round(first, 2), "rounds": []}
                        if ok:
                            calls[system] = fn
                    except Exception as e:   # a system that cannot run this mask: reported, not fatal
                        row[system] = {"ms": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
                    torch.cuda.empty_cache()
                # the systems in turns, each round's median kept: a launch-bound call (decode) is timed as much
                # by the host as by the GPU, and one round can meet the host busy
                for _ in range(a.rounds):
                    for system, fn in calls.items():
                        row[system]["rounds"].append(
                            triton.testing.do_bench(fn, warmup=25, rep=a.rep, return_mode="median"))
                for system in calls:
                    row[system]["ms"] = sorted(row[system]["rounds"])[len(row[system]["rounds"]) // 2]
                del calls
                torch.cuda.empty_cache()
                rows.append(row)
                print(line(row, a.systems.split(",")), flush=True)
                write(rows, a.systems.split(","), out_dir)


def line(row, systems):
    parts = [f"{row['mask']:<28} S={row['S']:<6} {row['dtype']:<4}"]
    for s in systems:
        r = row.get(s, {})
        parts.append(f"{s}={r['ms']:.3f}ms" if r.get("ms") else f"{s}={r.get('error', 'wrong' if r else '-')[:40]}")
    return "  ".join(parts)


def write(rows, systems, out_dir):
    (out_dir / "masks.json").write_text(json.dumps(rows, indent=1))
    head = "| mask | S | dtype | " + " | ".join(f"{s} ms" for s in systems) + \
        " | flex / neptune | per call / neptune | per call / neptune new data |"
    what = "backward (autograd.grad on the kept graph)" if rows[0].get("backward") else "forward"
    lines = [f"GPU: {rows[0]['gpu']}; {what}", "", head, "|" + "---|" * (head.count("|") - 1)]
    ratios = {"flex": [], "flex_per_call": [], "flex_flash": [], "neptune_new_data": [],
              "flex_per_call / neptune_new_data": []}
    for r in rows:
        ms = {s: r.get(s, {}).get("ms") for s in systems}
        cells = [f"{ms[s]:.3f}" if ms[s] else r.get(s, {}).get("error", "wrong")[:30] for s in systems]
        rel = {}
        for s in ratios:
            if ms.get(s) and ms.get("neptune"):
                rel[s] = ms[s] / ms["neptune"]
                ratios[s].append(rel[s])
        both = ms.get("flex_per_call") and ms.get("neptune_new_data")   # both build their block lists per call
        if both:
            ratios["flex_per_call / neptune_new_data"].append(ms["flex_per_call"] / ms["neptune_new_data"])
        lines.append(f"| {r['mask']} | {r['S']} | {r['dtype']} | " + " | ".join(cells) +
                     f" | {rel.get('flex', float('nan')):.2f} | {rel.get('flex_per_call', float('nan')):.2f} | "
                     f"{ms['flex_per_call'] / ms['neptune_new_data'] if both else float('nan'):.2f} |")
    lines.append("")
    for s, xs in ratios.items():
        if xs:
            lines.append(f"{s if '/' in s else s + ' / neptune'}: geomean {math.exp(sum(map(math.log, xs)) / len(xs)):.3f}, "
                         f"min {min(xs):.3f} over {len(xs)} cases")
    (out_dir / "masks.md").write_text("\n".join(lines) + "\n")
    plot(rows, out_dir)


def plot(rows, out_dir) -> bool:
    """masks.png: each system's time over neptune's per mask (above 1: neptune is faster), one panel per
    sequence length; False where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    seqs = sorted({r["S"] for r in rows})
    others = [s for s in ("flex", "flex_flash", "flex_per_call") if any(r.get(s, {}).get("ms") for r in rows)]
    fig, axes = plt.subplots(len(seqs), 1, figsize=(12, 4 * len(seqs)), squeeze=False)
    for ax, S in zip(axes[:, 0], seqs):
        here = [r for r in rows if r["S"] == S and r.get("neptune", {}).get("ms")]
        for n, s in enumerate(others):
            xs = [k + n * 0.8 / len(others) for k in range(len(here))]
            ys = [r[s]["ms"] / r["neptune"]["ms"] if r.get(s, {}).get("ms") else 0 for r in here]
            ax.bar(xs, ys, width=0.8 / len(others), label=f"{s} / neptune")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(here)), [f"{r['mask']} ({r['dtype']})" for r in here], rotation=60, ha="right",
                      fontsize=7)
        ax.set_title(f"S = {S}, {rows[0]['gpu']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "masks.png", dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    main()
